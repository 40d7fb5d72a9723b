"""Blob storage: one small interface, several backends.

Two kinds of thing live in a store:

- **Blobs**, immutable and content-addressed: named by ``shared.digest``
  (``"sha256:<hex>"``), which ``put`` computes itself, so a caller cannot
  file bytes under a wrong name (models, deltas).
- **Objects**, named by a key the caller chooses (``examples/mnist/….npz``),
  written whole and atomically, listed by prefix, deleted (collected
  examples: shards come and go with retention).

Every name is checked before storage is touched: a digest by
``check_digest``, a key by ``check_key`` (segments of ``A-Z a-z 0-9 . _ -``
that do not start with a dot, so no ``..``, no hidden or temporary file;
the first segment ``sha256`` belongs to blobs), so no name can leave the
store's root. Backends implement the private methods (the object ones
raise ``StoreError`` in a backend that keeps blobs only).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..._blobs import digest as compute_digest
from ..._errors import InvalidStoreKeyError, StoreError

__all__ = ["BLOB_AREA", "BlobStore", "StoredObject", "check_digest", "check_key"]

BLOB_AREA = "sha256"  # the first path segment of every blob; no object key may use it
MAX_KEY_CHARS = 512
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}"
_KEY = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,15}}")


def check_digest(value: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise InvalidStoreKeyError(f"not a blob digest: {value!r:.80} (expected sha256:<64 hex>)")
    return value


def check_key(value: str) -> str:
    """An object key the store accepts, else ``InvalidStoreKeyError``."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_KEY_CHARS
        or not _KEY.fullmatch(value)
        or value.split("/", 1)[0] == BLOB_AREA
    ):
        raise InvalidStoreKeyError(
            f"not an object key: {value!r:.80} (segments of A-Z a-z 0-9 . _ - joined by '/', "
            f"none starting with '.', not under {BLOB_AREA}/)"
        )
    return value


def _check_prefix(prefix: str) -> str:
    """A listing prefix: empty, a key, or a key and a trailing slash."""
    if prefix == "":
        return prefix
    if not isinstance(prefix, str):
        raise InvalidStoreKeyError(f"not a key prefix: {prefix!r:.80}")
    check_key(prefix.removesuffix("/"))
    return prefix


@dataclass(frozen=True)
class StoredObject:
    """One listed object: its key, size in bytes and last change (Unix seconds)."""

    key: str
    size: int
    modified: float


class BlobStore(ABC):
    def put(self, data: bytes) -> str:
        """Store ``data``; returns its digest. Storing the same bytes twice is a no-op."""
        name = compute_digest(data)
        if not self._exists(name):
            self._put(name, data)
        return name

    def get(self, digest: str) -> bytes:
        """The whole blob (raises ``BlobNotFoundError``)."""
        return self._get(check_digest(digest))

    def open(self, digest: str) -> BinaryIO:
        """A readable, seekable stream of the blob, for serving without loading it."""
        return self._open(check_digest(digest))

    def local_path(self, digest: str) -> Path | None:
        """A file path to serve with sendfile, when the backend has one."""
        check_digest(digest)
        return None

    def exists(self, digest: str) -> bool:
        return self._exists(check_digest(digest))

    def size(self, digest: str) -> int:
        return self._size(check_digest(digest))

    def delete(self, digest: str) -> None:
        self._delete(check_digest(digest))

    # -- objects: named by the caller, replaced whole, listed by prefix ------------------

    def put_object(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key``, atomically: readers see the old or the new bytes."""
        self._put_object(check_key(key), bytes(data))

    def get_object(self, key: str) -> bytes:
        """The object's bytes (raises ``BlobNotFoundError``)."""
        return self._get_object(check_key(key))

    def list_objects(self, prefix: str = "") -> list[StoredObject]:
        """Every object whose key starts with ``prefix``, sorted by key (blobs not included)."""
        found = self._list_objects(_check_prefix(prefix))
        return sorted((o for o in found if o.key.startswith(prefix)), key=lambda o: o.key)

    def delete_object(self, key: str) -> None:
        """Remove the object; deleting an absent one is a no-op, so a retry is safe."""
        self._delete_object(check_key(key))

    @abstractmethod
    def _put(self, digest: str, data: bytes) -> None: ...

    @abstractmethod
    def _get(self, digest: str) -> bytes: ...

    @abstractmethod
    def _open(self, digest: str) -> BinaryIO: ...

    @abstractmethod
    def _exists(self, digest: str) -> bool: ...

    @abstractmethod
    def _size(self, digest: str) -> int: ...

    @abstractmethod
    def _delete(self, digest: str) -> None: ...

    # Not abstract: a backend written before objects existed keeps working for blobs.
    def _put_object(self, key: str, data: bytes) -> None:
        raise self._no_objects()

    def _get_object(self, key: str) -> bytes:
        raise self._no_objects()

    def _list_objects(self, prefix: str) -> list[StoredObject]:
        raise self._no_objects()

    def _delete_object(self, key: str) -> None:
        raise self._no_objects()

    def _no_objects(self) -> StoreError:
        return StoreError(f"{type(self).__name__} keeps blobs only, no named objects")
