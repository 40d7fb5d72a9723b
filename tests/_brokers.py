"""Real MQTT brokers for tests: a Mosquitto of our own on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["MosquittoProcess", "free_port", "wait_for_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


class MosquittoProcess:
    """A mosquitto started from its own config on a free port; stopped by its PID."""

    def __init__(self, workdir: Path, *, port: int | None = None, extra_config: str = "") -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            raise RuntimeError("mosquitto is not installed (make test installs it)")
        self.exe = exe
        self.port = port or free_port()
        self.workdir = workdir
        self.config = workdir / f"mosquitto-{self.port}.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "set_tcp_nodelay true\n"
            "persistence false\n"
            "max_queued_messages 100000\n" + extra_config
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> MosquittoProcess:
        log = (self.workdir / f"mosquitto-{self.port}.log").open("ab")
        self.process = subprocess.Popen(
            [self.exe, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
