"""The build cache's chores, shared by the digit models and the language models.

Entries are built in a ``.tmp-*`` folder and renamed into place durably
(``move_into_place``: every file and folder of the entry synced first, then
the rename, then the cache folder); ``discard_entry`` and
``remove_stale_temporaries`` clear what a replaced entry or an interrupted
build leaves behind; ``build_into_cache`` is the whole sequence around one
build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shared import fsync_directory

__all__ = ["build_into_cache", "discard_entry", "move_into_place", "remove_stale_temporaries"]

STALE_TMP_S = 3600.0  # older than an hour: no live build is still writing there


def discard_entry(directory: Path) -> None:
    """Move a broken or replaced entry out of the way first, so the final name frees at once."""
    aside = directory.with_name(f".tmp-discard-{directory.name}-{os.getpid()}")
    os.replace(directory, aside)
    shutil.rmtree(aside, ignore_errors=True)


def remove_stale_temporaries(root: Path, pattern: str = ".tmp-*") -> None:
    """Clear what interrupted builds left behind (older than ``STALE_TMP_S``)."""
    now = time.time()
    for entry in root.glob(pattern):
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(entry, ignore_errors=True)


def move_into_place(built: Path, final: Path) -> None:
    """Rename the finished entry ``built`` to ``final`` so that a power cut never leaves
    ``final`` with files that are named but empty: each file and folder of ``built`` is
    fsynced before the rename, and the cache folder after it (``shared.fsync_directory``),
    as ``shared.atomic_write_bytes`` does for one file."""
    for folder, _, names in os.walk(built):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(folder)
    os.replace(built, final)
    fsync_directory(final.parent)


def build_into_cache(
    final: Path,
    tag: str,
    build: Callable[[Path], None],
    loads: Callable[[Path], bool],
    *,
    rebuild: bool,
    error: Callable[[str], Exception],
    stale: str = ".tmp-*",
) -> None:
    """Build the entry ``final`` in ``.tmp-{tag}-*`` beside it and move it into place.

    An entry a concurrent build put there meanwhile is kept when ``loads(final)``
    (unless ``rebuild``), else discarded and replaced. A cache folder that cannot
    be made raises ``error(message)``; the temporary folder never outlives the call.
    Interrupted builds' folders matching ``stale`` are cleared first.
    """
    root = final.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot create the model cache {root}: {e}") from e
    remove_stale_temporaries(root, stale)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{tag}-", dir=root))
    try:
        build(tmp)
        if final.exists():
            if not rebuild and loads(final):
                return  # a concurrent build won; keep its result
            discard_entry(final)
        move_into_place(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
