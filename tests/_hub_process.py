"""``tandem hub`` as a real process tree (supervisor, ingress and executor processes), and the
memory that tree holds."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from ._cli import ROOT, tandem_env
from ._plane import wait_until

__all__ = ["process_tree", "tandem_hub", "tree_rss"]


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (those alive now)."""
    found = [pid]
    for parent in found:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid``'s process tree (each process's RSS, summed)."""
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


@contextlib.contextmanager
def tandem_hub(
    repo: Path, broker_url: str, port: int, log: Path, *extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``tandem hub --repo REPO --broker URL --http-port PORT``, ready; SIGTERM at the end."""
    command = [
        sys.executable, "-m", "tandem.cli", "hub", "--repo", str(repo), "--broker", broker_url,
        "--prefix", f"tandem/{uuid.uuid4().hex[:8]}/v1", "--http-port", str(port),
        "--http-host", "127.0.0.1", "--log-level", "warning", *extra,
    ]  # fmt: skip
    with log.open("ab") as out:
        hub = subprocess.Popen(command, cwd=ROOT, env=tandem_env(), stdout=out, stderr=out)
    try:

        def ready() -> bool:
            assert hub.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout_s=60, what="the hub ready")
        yield hub
    finally:
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)
            try:
                hub.wait(30)
            except subprocess.TimeoutExpired:
                hub.kill()
                hub.wait()
