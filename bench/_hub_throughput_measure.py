"""(c) Hub throughput: how each point is measured (windows, CPU per process, hub counters).

A ``Variant`` is one row family of part c: a closed-loop ``run(n)`` that
returns a ``Window``, the requester counts it runs at, the processes that
serve it (read again before every window, so a restarted hub child is
still counted), its broker, and (for a hub) a reader of the served model's
``(rows computed, batches executed)`` counters.

``measure`` runs every (variant, requesters) point ``repeats`` times, the
variants interleaved in a rotating order, so that the machine's other load
falls on all of them alike. Around each window it reads, from /proc, the CPU
time of the load generator (this process), of the broker and of each
server process. A hub writes its counters to ``/metrics`` about once a
second, so after a window the counters are read again until they account
for every answer the load generator received (``Window.answered``), up to
``_SETTLE_S``.

``executor_sweep`` and ``executor_window`` time an executor alone in this
process: samples/s (and CPU per sample) by batch size, rounds interleaved
over the sizes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._load import Window
from ._procs import cpu_ns, hub_metrics

__all__ = [
    "SWEEP",
    "Variant",
    "executor_sweep",
    "executor_window",
    "hub_counts",
    "measure",
]

SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SWEEP_S = 0.3
_SETTLE_S = 3.0

Counter = Callable[[], tuple[float, float]]


@dataclass
class Variant:
    """One row family: how to run a window, at which requester counts, against what."""

    run: Callable[[int], Window]
    concurrency: Sequence[int]
    processes: Callable[[], dict[str, list[int]]]  # label -> PIDs of the serving side
    broker: int | None = None
    counter: Counter | None = None
    in_process: bool = False  # served in this process: its CPU is the server's
    extra: dict[str, Any] = field(default_factory=dict)


def measure(variants: dict[str, Variant], repeats: int) -> dict[str, dict[int, dict[str, Any]]]:
    """Every (variant, requesters) point, ``repeats`` windows interleaved over variants."""
    points: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in variants}
    levels = sorted({n for v in variants.values() for n in v.concurrency})
    for n in levels:
        names = [name for name, v in variants.items() if n in v.concurrency]
        for name in names:
            points[name][n] = {
                "throughput": [],
                "latencies": [],
                "errors": 0,
                "cores": [],
                "processes": [],
                "rows": 0.0,
                "batches": 0.0,
            }
        for rep in range(repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                _one_window(variants[name], n, points[name][n])
    return points


def _one_window(variant: Variant, n: int, point: dict[str, Any]) -> None:
    me = os.getpid()
    served = variant.processes()
    watched = {label: pids for label, pids in served.items()}
    watched["@load generator"] = [me]
    if variant.broker is not None:
        watched["@broker"] = [variant.broker]
    counts = variant.counter() if variant.counter else (0.0, 0.0)
    cpu0 = {k: _cpu(p) for k, p in watched.items()}
    t0 = time.perf_counter()
    window = variant.run(n)
    elapsed = time.perf_counter() - t0
    used = {k: (_cpu(p) - cpu0[k]) / 1e9 / elapsed for k, p in watched.items()}
    processes = {k: v for k, v in used.items() if not k.startswith("@")}
    cores = {
        "server": sum(processes.values()),
        "load generator": 0.0 if variant.in_process else used["@load generator"],
        "broker": used.get("@broker", 0.0),
    }
    if variant.counter:
        after = _settled(variant.counter, counts[0] + window.answered)
        point["rows"] += after[0] - counts[0]
        point["batches"] += after[1] - counts[1]
    point["throughput"].append(window.throughput)
    point["latencies"].extend(window.latencies_ms)
    point["errors"] += window.errors
    point["cores"].append(cores)
    point["processes"].append(processes)


def _settled(counter: Counter, rows_at_least: float) -> tuple[float, float]:
    """The counters once they show ``rows_at_least`` rows (the hub dumps about once a second)."""
    deadline = time.monotonic() + _SETTLE_S
    counts = counter()
    while counts[0] < rows_at_least and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = counter()
    return counts


def _cpu(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended meanwhile (a restarted hub child)
            total += cpu_ns(pid)
    return total


def hub_counts(port: int, model: str) -> tuple[float, float]:
    """(rows computed, batches executed) for ``model`` from the hub's /metrics (all processes)."""
    rows = batches = 0.0
    label = f'model="{model}"'
    for line in hub_metrics(port).splitlines():
        if label not in line:
            continue
        if line.startswith("tandem_inference_count_total{"):
            rows += float(line.rsplit(" ", 1)[1])
        elif line.startswith("tandem_inference_exec_count_total{"):
            batches += float(line.rsplit(" ", 1)[1])
    return rows, batches


def executor_window(executor: Any, feed: dict[str, np.ndarray], seconds: float) -> Window:
    """The executor alone at one batch size for ``seconds``: its samples/s as a window."""
    rows = next(iter(feed.values())).shape[0]
    n = 0
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        executor.run_batch(feed)
        n += 1
    return Window(
        seconds=elapsed, latencies_ms=[elapsed / n * 1000.0] * (n * rows), answered=n * rows
    )


def executor_sweep(
    executor: Any, input_name: str, rounds: int, sizes: Sequence[int] = SWEEP
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Samples/s and CPU µs per sample of the executor alone by batch size, rounds interleaved.

    The CPU is this whole process's (ONNX Runtime's pool threads included), read from /proc.
    """
    rng = np.random.default_rng(1)
    batches = {b: {input_name: rng.random((b, 1, 28, 28), dtype=np.float32)} for b in sizes}
    for batch in batches.values():
        executor.run_batch(batch)
    rates: dict[int, list[float]] = {b: [] for b in sizes}
    cpu_us: dict[int, list[float]] = {b: [] for b in sizes}
    me = os.getpid()
    for r in range(rounds):
        order = list(sizes) if r % 2 == 0 else list(reversed(sizes))
        for b in order:
            n = 0
            cpu0 = cpu_ns(me)
            t0 = time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < _SWEEP_S or n < 3:
                executor.run_batch(batches[b])
                n += 1
            rates[b].append(n * b / elapsed)
            cpu_us[b].append((cpu_ns(me) - cpu0) / 1e3 / (n * b))
    return rates, cpu_us
