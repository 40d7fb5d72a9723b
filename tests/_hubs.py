"""A hub in its own process (``python -m cloud_hub``), stopped or killed by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["HubProcess"]

ROOT = Path(__file__).resolve().parents[1]


class HubProcess:
    def __init__(self, repo: Path, broker_url: str, log: Path, *extra: str) -> None:
        self.command = [
            sys.executable,
            "-m",
            "cloud_hub",
            "--repo",
            str(repo),
            "--broker",
            broker_url,
            "--log-level",
            "warning",
            "--http-port",
            "0",  # MQTT only: parallel runs must not fight over a fixed HTTP port
            *extra,
        ]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HubProcess:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def kill(self) -> None:
        """SIGKILL: no goodbye, no flushing — what a crash looks like."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
