"""What a result was measured on: CPU model, cores, versions, date."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["hardware"]


def hardware() -> dict[str, Any]:
    """CPU model and cores from /proc/cpuinfo and the scheduler, plus versions and date."""
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        # The cores this process may run on: a container often gets fewer than the host has.
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "onnxruntime": _version("onnxruntime"),
        "numpy": _version("numpy"),
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None
