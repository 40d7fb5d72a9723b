"""A hub in its own processes (``python -m cloud_hub``), stopped, frozen or killed by PID.

The hub runs as a supervisor and its children (executor and ingress
processes), started in a session of their own, so their process group (the
supervisor's PID) reaches them all: ``freeze`` stops every one of them, and
``kill`` ends them all at once, as a crash of the machine's hub would.
"""

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
                self.command,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def freeze(self) -> None:
        """SIGSTOP to every process of the hub: it holds what it took and answers nothing."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL to every process of the hub: no goodbye, no flushing, a crash."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
