"""Blobs in an S3 bucket (AWS S3, MinIO, Ceph RGW, moto: anything S3-compatible).

Keys are ``<prefix>sha256/<64 hex digits>``, so the bucket can sit behind a
real CDN (CloudFront, a caching proxy) and serve the same paths that the
local layout has; objects are ``<prefix><key>``. S3 writes are atomic per
object, so nobody sees half a blob or half an object.

``open`` returns a reader that fetches only what is read, with ranged GETs
(``Range: bytes=a-b``) through a read buffer: serving a resumed download or
a byte range of a large model costs that range, not the whole object.

boto3 is imported when a store is built without a client, so the package
imports without it; botocore's errors become ``BlobNotFoundError`` (no such
key) or ``StoreError`` (anything else: no bucket, access denied, network).
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO, cast

from ..._errors import BlobNotFoundError, StoreError
from ._base import BLOB_AREA, BlobStore, StoredObject

__all__ = ["S3BlobStore"]

_READ_BUFFER = 1024 * 1024  # bytes per ranged GET when a caller reads in small pieces
_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})
_LIST_PAGE = 1000  # keys per ListObjectsV2 page (S3's maximum)


class S3BlobStore(BlobStore):
    """Content-addressed blobs in ``bucket`` under ``prefix``.

    Pass ``client`` to reuse a configured boto3 S3 client; otherwise one is
    built from ``endpoint_url`` and ``region`` with boto3's usual credential
    chain (environment, config files, instance role).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "blobs/",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ) -> None:
        if not bucket:
            raise StoreError("S3BlobStore needs a bucket name")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix.lstrip("/")
        if client is None:
            try:
                import boto3
            except ImportError as e:  # pragma: no cover - depends on the install
                raise StoreError("an s3:// store needs boto3: pip install boto3") from e
            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
        self.client = client

    def __repr__(self) -> str:
        return f"S3BlobStore({self.bucket!r}, prefix={self.prefix!r})"

    def key(self, digest: str) -> str:
        """The object key of a (checked) digest."""
        return f"{self.prefix}sha256/{digest.removeprefix('sha256:')}"

    def _call(self, operation: str, digest: str, **kwargs: Any) -> Any:
        """Call ``client.<operation>`` for one blob, converting botocore's errors."""
        return self._call_key(operation, self.key(digest), f"blob {digest}", **kwargs)

    def _call_key(self, operation: str, key: str, what: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, Key=key, **kwargs)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in _MISSING:
                raise BlobNotFoundError(f"no {what} in s3://{self.bucket}") from e
            raise StoreError(f"S3 {operation} of {what} in {self.bucket} failed: {code}") from e
        except BotoCoreError as e:
            raise StoreError(f"S3 {operation} of {what} in {self.bucket} failed: {e}") from e

    def _put(self, digest: str, data: bytes) -> None:
        self._call(
            "put_object",
            digest,
            Body=data,
            ContentType="application/octet-stream",
            # Blobs never change: let every cache in front of the bucket keep them.
            CacheControl="public, max-age=31536000, immutable",
        )

    def _get(self, digest: str) -> bytes:
        response = self._call("get_object", digest)
        return cast(bytes, _read_body(response, digest))

    def _open(self, digest: str) -> BinaryIO:
        size = self._size(digest)
        reader = _RangedReader(self, digest, size)
        return cast(BinaryIO, io.BufferedReader(reader, buffer_size=_READ_BUFFER))

    def _exists(self, digest: str) -> bool:
        try:
            self._call("head_object", digest)
        except BlobNotFoundError:
            return False
        return True

    def _size(self, digest: str) -> int:
        return int(self._call("head_object", digest)["ContentLength"])

    def _delete(self, digest: str) -> None:
        """S3 deletes are idempotent; so is this (an absent blob is a no-op)."""
        self._call("delete_object", digest)

    # -- objects ---------------------------------------------------------------------------

    def _put_object(self, key: str, data: bytes) -> None:
        self._call_key(
            "put_object",
            self.prefix + key,
            f"object {key}",
            Body=data,
            ContentType="application/octet-stream",
            CacheControl="no-store",  # objects change: never cached on the way
        )

    def _get_object(self, key: str) -> bytes:
        response = self._call_key("get_object", self.prefix + key, f"object {key}")
        return _read_body(response, key)

    def _list_objects(self, prefix: str) -> list[StoredObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        blobs = self.prefix + BLOB_AREA + "/"
        found: list[StoredObject] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=self.prefix + prefix,
                PaginationConfig={"PageSize": _LIST_PAGE},
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    full = str(item["Key"])
                    if full.startswith(blobs):
                        continue
                    found.append(
                        StoredObject(
                            full[len(self.prefix) :],
                            int(item["Size"]),
                            item["LastModified"].timestamp(),
                        )
                    )
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            raise StoreError(f"S3 listing of {prefix!r} in {self.bucket} failed: {code}") from e
        except BotoCoreError as e:
            raise StoreError(f"S3 listing of {prefix!r} in {self.bucket} failed: {e}") from e
        return found

    def _delete_object(self, key: str) -> None:
        self._call_key("delete_object", self.prefix + key, f"object {key}")

    def _get_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` inclusive, one GET."""
        response = self._call("get_object", digest, Range=f"bytes={start}-{end}")
        return _read_body(response, digest)


def _read_body(response: dict[str, Any], name: str) -> bytes:
    from botocore.exceptions import BotoCoreError

    try:
        return bytes(response["Body"].read())
    except (BotoCoreError, OSError) as e:
        raise StoreError(f"reading {name} from S3 failed: {e}") from e
    finally:
        response["Body"].close()


class _RangedReader(io.RawIOBase):
    """A seekable raw stream over one S3 object; each ``readinto`` is one ranged GET."""

    def __init__(self, store: S3BlobStore, digest: str, size: int) -> None:
        super().__init__()
        self._store, self._digest, self._size = store, digest, size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = min(len(view), self._size - self._position)
        if count <= 0:
            return 0
        data = self._store._get_range(self._digest, self._position, self._position + count - 1)
        if len(data) != count:
            raise StoreError(f"S3 returned {len(data)} bytes for a {count}-byte range")
        view[:count] = data
        self._position += count
        return count

    def readall(self) -> bytes:
        """The rest of the object in one GET (``read()`` with no size lands here)."""
        if self._position >= self._size:
            return b""
        data = self._store._get_range(self._digest, self._position, self._size - 1)
        self._position += len(data)
        return data
