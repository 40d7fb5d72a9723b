"""Blobs as files on a local disk, laid out so a web server can send them as they are.

Layout: ``<root>/sha256/<first two hex digits>/<64 hex digits>``. The two-digit
shard keeps directories small (256 of them) once a registry holds many
versions; the algorithm directory leaves room for another hash later.
Objects are files at ``<root>/<key>`` (a key never starts with ``sha256/``).

Invariants:

- A blob or object file is complete or absent. ``_write`` writes it with
  ``shared.atomic_write_bytes``: a temporary file in the final one's
  directory, fsynced, renamed over the final name (atomic on POSIX within one
  file system), the directory fsynced, so a crash or a concurrent reader
  never sees a partial file. Temporary names start with ``.tmp-``: they never
  match a digest, no key may start with a dot, and listings skip them, so no
  reader can open one.
- The path of a blob comes only from a digest that ``check_digest`` accepted
  (``sha256:`` and 64 lowercase hex digits), that of an object only from a key
  that ``check_key`` accepted, never from a caller's string as it is, so no
  name can leave ``root``.
- Two writers of the same blob race harmlessly: both write the same bytes and
  the last rename wins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from ..._atomic import atomic_write_bytes
from ..._errors import BlobNotFoundError, StoreError
from ._base import BLOB_AREA, BlobStore, StoredObject, check_digest

__all__ = ["LocalBlobStore"]

_FILE_MODE = 0o644  # readable by a separate web server user; blobs are public by design
_OBJECT_MODE = 0o600  # objects may hold what devices sent (collected examples): owner only


class LocalBlobStore(BlobStore):
    """Content-addressed blobs, and objects, under ``root`` (created on first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    def _path(self, digest: str) -> Path:
        hex_digest = digest.removeprefix("sha256:")
        return self.root / "sha256" / hex_digest[:2] / hex_digest

    def local_path(self, digest: str) -> Path | None:
        """The blob's file, for sendfile; raises ``BlobNotFoundError`` when absent."""
        path = self._path(check_digest(digest))
        if not path.is_file():
            raise BlobNotFoundError(f"no blob {digest}")
        return path

    def _put(self, digest: str, data: bytes) -> None:
        _write(self._path(digest), data, _FILE_MODE, f"blob {digest} under {self.root}")

    def _get(self, digest: str) -> bytes:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError as e:
            raise BlobNotFoundError(f"no blob {digest}") from e
        except OSError as e:
            raise StoreError(f"cannot read blob {digest}: {e}") from e

    def _open(self, digest: str) -> BinaryIO:
        try:
            return open(self._path(digest), "rb")
        except FileNotFoundError as e:
            raise BlobNotFoundError(f"no blob {digest}") from e
        except OSError as e:
            raise StoreError(f"cannot open blob {digest}: {e}") from e

    def _exists(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def _size(self, digest: str) -> int:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError as e:
            raise BlobNotFoundError(f"no blob {digest}") from e
        except OSError as e:
            raise StoreError(f"cannot stat blob {digest}: {e}") from e

    def _delete(self, digest: str) -> None:
        """Deleting an absent blob is a no-op, so a retried clean-up is safe."""
        try:
            self._path(digest).unlink(missing_ok=True)
        except OSError as e:
            raise StoreError(f"cannot delete blob {digest}: {e}") from e

    # -- objects ---------------------------------------------------------------------------

    def _put_object(self, key: str, data: bytes) -> None:
        _write(self.root / key, data, _OBJECT_MODE, f"object {key} under {self.root}")

    def _get_object(self, key: str) -> bytes:
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise BlobNotFoundError(f"no object {key} under {self.root}") from e
        except OSError as e:
            raise StoreError(f"cannot read object {key}: {e}") from e

    def _list_objects(self, prefix: str) -> list[StoredObject]:
        # Walk only the deepest directory the prefix names, not the whole store.
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        found: list[StoredObject] = []
        try:
            for directory, names, files in os.walk(start):
                here = Path(directory)
                rel = here.relative_to(self.root)
                # Blobs, temporaries and hidden entries are no objects.
                top = rel == Path()
                names[:] = [
                    n for n in names if not n.startswith(".") and not (top and n == BLOB_AREA)
                ]
                for name in files:
                    if name.startswith("."):
                        continue
                    stat = (here / name).stat()
                    key = (rel / name).as_posix()
                    found.append(StoredObject(key, stat.st_size, stat.st_mtime))
        except FileNotFoundError:
            return []  # removed while walking: what is gone is not listed
        except OSError as e:
            raise StoreError(f"cannot list objects under {self.root}: {e}") from e
        return found

    def _delete_object(self, key: str) -> None:
        try:
            (self.root / key).unlink(missing_ok=True)
        except OSError as e:
            raise StoreError(f"cannot delete object {key}: {e}") from e


def _write(path: Path, data: bytes, mode: int, what: str) -> None:
    """Write ``path`` whole or not at all (``atomic_write_bytes``: fsync, rename, fsync)."""
    made = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, mode=mode)
    except OSError as e:
        _remove_empty(made)
        raise StoreError(f"cannot write {what}: {e}") from e


def _remove_empty(made: list[Path]) -> None:
    """Folders this write created, innermost first, where still empty (a full disk must not
    leave a tree of empty fan-out folders; another writer's file keeps its folder)."""
    for directory in made:
        try:
            directory.rmdir()
        except OSError:
            return
