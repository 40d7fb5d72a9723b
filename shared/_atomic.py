"""Write a file whole or not at all: the one write-then-rename every package uses.

``atomic_write_bytes(path, data)`` and ``atomic_writer(path)`` (a binary
stream) write to a temporary file in ``path``'s own directory
(``.tmp-<name>.<random>``: hidden, so listings skip it, and on the same file
system, so the rename is atomic), then

1. set its mode: ``mode`` exactly (``0o600`` for secrets: keys, passwords,
   API keys; the temporary file is created with it, so there is never a
   moment where others may read it), or, when ``mode`` is None, what
   ``open()`` gives a new file (``0o666`` less the umask);
2. flush and ``fsync`` it, so its bytes are on disk before its name is;
3. rename it over ``path`` (readers see the old file or the new one, never
   a part);
4. ``fsync`` the directory, so the rename itself survives a power cut.

``durable=False`` skips both fsyncs for files that die with their process
anyway (a live process's metrics): still atomic for readers, not for a
crash. On any failure the temporary file is removed and the error
(``OSError``) propagates; ``path`` is untouched. ``fsync_directory`` is step
4 on its own, for callers that rename a whole directory into place.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["ATOMIC_TEMP_PREFIX", "atomic_write_bytes", "atomic_writer", "fsync_directory"]

ATOMIC_TEMP_PREFIX = ".tmp-"  # how a temporary file's name starts (what a crash may leave)
_NEW_FILE_MODE = 0o666  # what open() asks for; the kernel takes the umask off


@contextmanager
def atomic_writer(
    path: str | os.PathLike[str], *, mode: int | None = None, durable: bool = True
) -> Iterator[BinaryIO]:
    """A binary stream that becomes ``path`` when the block ends without an error."""
    path = Path(path)
    directory = path.parent
    tmp = directory / f"{ATOMIC_TEMP_PREFIX}{path.name[:200]}.{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, _NEW_FILE_MODE if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:  # exactly ``mode``, whatever the umask
                if hasattr(os, "fchmod"):
                    os.fchmod(f.fileno(), mode)
                else:  # Windows before Python 3.13
                    os.chmod(tmp, mode)
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(directory)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, mode: int | None = None, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` whole or not at all (see the module docstring)."""
    with atomic_writer(path, mode=mode, durable=durable) as f:
        f.write(data)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the renames into ``directory`` durable (a no-op where directories cannot be
    opened or synced: Windows, some network file systems)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        if os.name == "nt":
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
