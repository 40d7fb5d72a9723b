"""A Redis server of a test's own on a free loopback port, stopped by its PID."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ._brokers import free_port, wait_for_port

__all__ = ["RedisProcess", "redis_missing"]


def redis_missing() -> str | None:
    """Why no Redis can be started here, or None (scripts/ensure-redis installs it)."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (scripts/ensure-redis installs it)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis client package is not installed (pip install -e '.[dev]')"
    return None


class RedisProcess:
    """``redis-server`` on 127.0.0.1 with nothing on disk; ``start``/``stop`` (by PID)."""

    def __init__(self, workdir: Path, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
