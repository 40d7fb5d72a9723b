"""py-spy, when installed next to this Python: where a process spends its CPU, by thread.

``profile`` starts sampling a process and returns at once; ``profile_summary``
waits for the sampler and sums its on-CPU samples by thread and by leaf
function. The sampler is stopped by its PID if it overruns.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["profile", "profile_summary"]


def profile(pid: int, seconds: float, rate_hz: int = 250) -> dict[str, Any] | None:
    """Sample ``pid`` with py-spy (if installed next to this Python) for ``seconds``.

    Starts the sampler and returns at once; call ``finish`` on the result's
    ``"process"`` after the work to profile, or use ``profile_summary``.
    Returns None when py-spy is not installed or cannot attach.
    """
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        found = shutil.which("py-spy")
        if found is None:
            return None
        exe = Path(found)
    out = Path(tempfile.mkdtemp(prefix="tandem-bench-spy-")) / "profile.txt"
    process = subprocess.Popen(
        [
            str(exe),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            str(rate_hz),
            "--threads",
            "--format",
            "raw",
            "--nonblocking",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return {"process": process, "out": out, "rate_hz": rate_hz, "seconds": seconds}


def profile_summary(started: dict[str, Any], top: int = 12) -> dict[str, Any] | None:
    """Wait for a ``profile`` run; on-CPU seconds by thread and by leaf function."""
    process: subprocess.Popen[bytes] = started["process"]
    try:
        _, err = process.communicate(timeout=started["seconds"] + 30)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        return None
    out: Path = started["out"]
    if process.returncode != 0 or not out.exists():
        return {"error": err.decode(errors="replace")[-500:]}
    threads: dict[str, int] = {}
    leaves: dict[str, int] = {}
    for line in out.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1].split("-tandem-", 1)[0]
        threads[thread] = threads.get(thread, 0) + int(count)
        leaf = f"{thread}: {_frame(frames[-1])}"
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
    shutil.rmtree(out.parent, ignore_errors=True)
    rate = started["rate_hz"]
    return {
        "seconds": started["seconds"],
        "threads_cpu_s": {k: v / rate for k, v in sorted(threads.items(), key=lambda kv: -kv[1])},
        "top_leaves_cpu_s": [
            [k, v / rate] for k, v in sorted(leaves.items(), key=lambda kv: -kv[1])[:top]
        ],
    }


def _frame(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py:12)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name
