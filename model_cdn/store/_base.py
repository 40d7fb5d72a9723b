"""Content-addressed blob storage: one small interface, several backends.

Blobs are immutable and named by ``shared.digest`` (``"sha256:<hex>"``).
``BlobStore.put`` computes the digest itself, so a caller cannot file bytes
under a wrong name; ``get``/``open`` check the digest's form before touching
storage (no path traversal through a crafted name). Backends implement the
private methods.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO

from shared import digest as compute_digest

from .._errors import InvalidNameError

__all__ = ["BlobStore", "check_digest"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_digest(value: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise InvalidNameError(f"not a blob digest: {value!r:.80} (expected sha256:<64 hex>)")
    return value


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
