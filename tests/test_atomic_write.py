"""``shared.atomic_write_bytes`` / ``atomic_writer``: a file appears whole or not at all.

Real failures, no mocks: a write larger than the process may write
(``RLIMIT_FSIZE``, in a child process) and a directory that refuses the
rename target (a directory where the file should go). After either, the
old file is untouched and no temporary file is left.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shared import ATOMIC_TEMP_PREFIX, atomic_write_bytes, atomic_writer, fsync_directory


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _temporaries(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(ATOMIC_TEMP_PREFIX)]


def test_the_whole_content_is_there_after_the_rename(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    data = os.urandom(3 * 1024 * 1024 + 7)  # several write() calls' worth
    atomic_write_bytes(target, data)
    assert target.read_bytes() == data
    assert _temporaries(tmp_path) == []


def test_a_stream_becomes_the_file_only_when_its_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "acl"
    target.write_bytes(b"old")
    with atomic_writer(target) as f:
        f.write(b"new, ")
        f.flush()
        assert target.read_bytes() == b"old"  # a reader meanwhile sees the old file whole
        (tmp,) = _temporaries(tmp_path)
        f.write(b"and whole")
    assert target.read_bytes() == b"new, and whole"
    assert not (tmp_path / tmp).exists()


def test_a_secret_is_0600_whatever_the_umask_and_so_is_its_temporary(
    tmp_path: Path,
) -> None:
    target = tmp_path / "publisher.key"
    old = os.umask(0o000)  # the most permissive umask: 0600 must still win
    try:
        with atomic_writer(target, mode=0o600) as f:
            (tmp,) = _temporaries(tmp_path)
            assert _mode(tmp_path / tmp) == 0o600  # before any byte is written
            f.write(b"secret\n")
    finally:
        os.umask(old)
    assert _mode(target) == 0o600
    assert target.read_bytes() == b"secret\n"


def test_an_explicit_mode_is_exact_and_the_default_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        atomic_write_bytes(tmp_path / "model.onnx", b"m", mode=0o644)  # wider than the umask
        atomic_write_bytes(tmp_path / "current.json", b"{}")  # as open() would make it
    finally:
        os.umask(old)
    assert _mode(tmp_path / "model.onnx") == 0o644
    assert _mode(tmp_path / "current.json") == 0o600  # 0666 less umask 077


def test_replacing_a_file_gives_the_new_one_the_asked_mode(tmp_path: Path) -> None:
    target = tmp_path / "passwd"
    target.write_bytes(b"old")
    target.chmod(0o644)
    atomic_write_bytes(target, b"new", mode=0o600)
    assert _mode(target) == 0o600


_FILL_PAST_THE_LIMIT = """
import resource, signal, sys
from shared import atomic_write_bytes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG as an OSError, not a killed process
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    atomic_write_bytes(sys.argv[1], b"x" * 65536)
except OSError as e:
    print(type(e).__name__, e.errno)
    sys.exit(3)
sys.exit(0)
"""


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "routes.json"
    target.write_bytes(b"old routes")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _FILL_PAST_THE_LIMIT, str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr  # the write really failed (EFBIG)
    assert "27" in done.stdout  # errno.EFBIG
    assert target.read_bytes() == b"old routes"
    assert _temporaries(tmp_path) == []


def test_a_rename_that_fails_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)  # a non-empty directory: rename over it refuses
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"data")
    assert (target / "inside").is_dir()
    assert _temporaries(tmp_path) == []


def test_an_error_inside_the_block_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "book.json"
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"half")
        raise RuntimeError("the caller failed")
    assert not target.exists()
    assert _temporaries(tmp_path) == []


def test_a_directory_that_refuses_new_files_is_an_oserror(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory anyway")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "keys.json").write_bytes(b"old")
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            atomic_write_bytes(locked / "keys.json", b"new", mode=0o600)
        assert (locked / "keys.json").read_bytes() == b"old"
        assert _temporaries(locked) == []
    finally:
        locked.chmod(0o700)


def test_fsync_directory_refuses_a_missing_directory(tmp_path: Path) -> None:
    fsync_directory(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_directory(tmp_path / "absent")
