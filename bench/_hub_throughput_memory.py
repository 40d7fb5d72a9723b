"""(c) Memory and isolation: big JSON bodies against a running hub, and MQTT meanwhile.

``memory_and_isolation`` works on a hub that part c has already measured:

1. **Memory per request.** The proportional set size (PSS, from
   ``/proc/PID/smaps_rollup``: shared pages counted once) of every hub
   process is summed before, sampled every ``_SAMPLE_S`` while
   ``BODIES`` JSON bodies of about 15 MiB arrive at once on
   ``/v2/models/{model}/infer`` (refused with 400 once parsed: the shape is
   wrong for the model), and read again until the growth is back under
   ``RETURNED_MIB`` (or ``_RETURN_S`` passed).
2. **Isolation.** MQTT offloads at ``ISOLATION_REQUESTERS`` requesters,
   windows without HTTP traffic alternating with windows during which the
   same bodies arrive back to back on ``BODIES`` connections; latencies are
   pooled per condition, and the CPU of each hub process is read for both.

The bodies come from ``bench._json_flood``, a process of its own.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from typing import IO, Any

import numpy as np

from ._procs import ROOT, cpu_ns, hub_processes, pss_bytes

__all__ = [
    "BODIES",
    "BODY_ELEMENTS",
    "ISOLATION_REQUESTERS",
    "RETURNED_MIB",
    "memory_and_isolation",
]

BODIES = 4
BODY_ELEMENTS = 1_800_000  # about 15 MiB of JSON, under the hub's 16 MiB JSON limit
RETURNED_MIB = 24.0  # memory counts as given back once the growth is under this
ISOLATION_REQUESTERS = 8
MiB = 1024 * 1024
_SAMPLE_S = 0.01
_RETURN_S = 20.0
_WARM_S = 0.5


class _Flood:
    """``python -m bench._json_flood`` on a pipe: one command a line, one JSON answer a line."""

    def __init__(self, port: int, model: str, input_name: str) -> None:
        args = [str(port), model, input_name, str(BODY_ELEMENTS), str(BODIES)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench._json_flood", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.body_bytes = int(self.read()["body_bytes"])

    def send(self, command: str) -> None:
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()

    def read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the JSON flood process ended ({self.process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        try:
            self.send("quit")
            self.process.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()  # by its handle, i.e. by PID
            self.process.wait(10)


def _hub_pids(hub_pid: int) -> list[int]:
    return [p for pids in hub_processes(hub_pid).values() for p in pids]


def _pss_sum(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(
            OSError
        ):  # ended meanwhile (a restarted child): its memory is gone too
            total += pss_bytes(pid)
    return total


def _burst(flood: _Flood, pids: list[int]) -> dict[str, Any]:
    before = _pss_sum(pids)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(_SAMPLE_S):
            peak[0] = max(peak[0], _pss_sum(pids))

    sampler = threading.Thread(target=sample, name="bench-pss")
    sampler.start()
    try:
        flood.send("burst")
        answer = flood.read()
    finally:
        done.set()
        sampler.join()
    t0 = time.monotonic()
    after = _pss_sum(pids)
    while after - before > RETURNED_MIB * MiB and time.monotonic() - t0 < _RETURN_S:
        time.sleep(0.1)
        after = _pss_sum(pids)
    return {
        "before_mib": before / MiB,
        "peak_growth_mib": (peak[0] - before) / MiB,
        "after_growth_mib": (after - before) / MiB,
        "returned_in_s": time.monotonic() - t0,
        "statuses": answer["statuses"],
        "burst_s": answer["seconds"],
    }


def memory_and_isolation(
    *,
    hub_pid: int,
    http_port: int,
    model: str,
    input_name: str,
    feed: dict[str, np.ndarray],
    mqtt: Any,
    window_s: float,
    rounds: int,
) -> dict[str, Any]:
    """Both measurements on a running hub (``mqtt``: a load generator on its broker)."""
    flood = _Flood(http_port, model, input_name)
    try:
        pids = _hub_pids(hub_pid)
        memory = _burst(flood, pids)
        memory["in_flight_mib"] = BODIES * flood.body_bytes / MiB
        memory["body_bytes"] = flood.body_bytes
        latencies: dict[str, list[float]] = {"idle": [], "flood": []}
        throughput: dict[str, list[float]] = {"idle": [], "flood": []}
        cores: dict[str, list[dict[str, float]]] = {"idle": [], "flood": []}
        flooded: list[dict[str, Any]] = []
        for _ in range(rounds):
            for condition in ("idle", "flood"):
                roles = hub_processes(hub_pid)
                cpu0 = {k: sum(_cpu(p) for p in v) for k, v in roles.items()}
                t0 = time.perf_counter()
                if condition == "flood":
                    flood.send(f"flood {_WARM_S + window_s + 0.2:.2f}")
                window = mqtt.run(model, feed, ISOLATION_REQUESTERS, _WARM_S, window_s)
                if condition == "flood":
                    flooded.append(flood.read())
                elapsed = time.perf_counter() - t0
                cores[condition].append(
                    {
                        k: (sum(_cpu(p) for p in v) - cpu0[k]) / 1e9 / elapsed
                        for k, v in roles.items()
                    }
                )
                latencies[condition].extend(window.latencies_ms)
                throughput[condition].append(window.throughput)
                if window.errors:
                    latencies[condition].extend([float("inf")] * window.errors)
    finally:
        flood.close()
    isolation = {
        condition: {
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "answers": len(lat),
            "requests_per_s": float(np.median(throughput[condition])),
            "cores": {
                k: float(np.median([c.get(k, 0.0) for c in cores[condition]]))
                for k in cores[condition][0]
            },
        }
        for condition, lat in latencies.items()
    }
    isolation["flood"]["bodies_answered"] = sum(int(f["answered"]) for f in flooded)
    isolation["flood"]["bodies_statuses"] = _merge([f["statuses"] for f in flooded])
    isolation["flood"]["bodies_seconds"] = sum(float(f["seconds"]) for f in flooded)
    return {
        "memory": memory,
        "isolation": isolation,
        "requesters": ISOLATION_REQUESTERS,
        "rounds": rounds,
        "window_s": window_s,
    }


def _cpu(pid: int) -> int:
    try:
        return cpu_ns(pid)
    except OSError:
        return 0


def _merge(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + int(v)
    return out
