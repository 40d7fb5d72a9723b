"""One string picks a blob store, so a CLI flag or an env variable can configure it.

- ``/var/lib/tandem/blobs`` or ``file:///var/lib/tandem/blobs``: ``LocalBlobStore``.
- ``s3://bucket`` or ``s3://bucket/some/prefix/`` with optional query
  parameters ``endpoint_url`` (MinIO, moto, Ceph) and ``region``:
  ``S3BlobStore``. Without a path the prefix is the default ``blobs/``.
  Credentials never go in the URL; boto3 finds them (environment, config,
  instance role).
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

from ..._errors import StoreError
from ._base import BlobStore
from ._local import LocalBlobStore
from ._s3 import S3BlobStore

__all__ = ["open_store"]

_S3_OPTIONS = frozenset({"endpoint_url", "region"})


def open_store(url: str) -> BlobStore:
    """The blob store a URL or a plain directory path names."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        options = parse_qs(parts.query, keep_blank_values=False, strict_parsing=False)
        unknown = set(options) - _S3_OPTIONS
        if unknown:
            raise StoreError(
                f"unknown s3:// URL options {sorted(unknown)}; known: endpoint_url, region"
            )
        if not parts.netloc:
            raise StoreError(f"an s3:// URL names a bucket: s3://bucket/prefix, got {url!r}")
        path = unquote(parts.path).lstrip("/")
        return S3BlobStore(
            parts.netloc,
            prefix=path or "blobs/",
            endpoint_url=options.get("endpoint_url", [None])[-1],
            region=options.get("region", [None])[-1],
        )
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreError(f"a file:// URL must name a local path (file:///dir), got {url!r}")
        return LocalBlobStore(unquote(parts.path))
    if parts.scheme and len(parts.scheme) > 1:  # a one-letter scheme is a Windows drive
        raise StoreError(f"unsupported blob store URL {url!r}: use a path, file:// or s3://")
    if not url:
        raise StoreError("the blob store URL is empty")
    return LocalBlobStore(url)
