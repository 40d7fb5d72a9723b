"""What the agent has been doing: latency windows, edge-cloud agreement, periodic reports.

``TelemetryRecorder`` sits on the agent's hot path, so recording is a lock and
a ``deque.append`` (plus one argmax for offloaded requests whose local answer
was computed); everything costly (sorting for percentiles, building the
snapshot) happens when someone asks for ``agent.metrics()``.

Latency kinds, each a ring buffer of the last ``window`` samples (ms):

- ``local``: the local model's compute time, whenever it ran;
- ``offloaded``: end-to-end time of requests the cloud answered;
- ``total``: end-to-end time of every answered request.

Edge-cloud agreement: when a request was offloaded *after* the local model
ran (the uncertain path) and the cloud answered, the argmax of both answers
is compared row by row. These are free labels for judging an edge model in
the field, and a rollout gate can read them from telemetry.

``TelemetryReporter`` publishes ``AgentMetrics`` as JSON on the device's
telemetry topic every ``interval_s`` from a daemon thread; a report that
cannot be sent (broker away) is counted and skipped, never queued.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import UplinkError

if TYPE_CHECKING:
    from ._agent import BaseAgent

__all__ = ["AgentMetrics", "LatencyWindow", "TelemetryRecorder", "TelemetryReporter"]

log = logging.getLogger("tandem.edge.telemetry")

LATENCY_KINDS = ("local", "offloaded", "total")
TELEMETRY_SCHEMA = 1


class LatencyWindow:
    """The last ``size`` latency samples (ms); thread-safe, bounded."""

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise ValueError("window size must be at least 1")
        self._samples: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, ms: float) -> None:
        with self._lock:
            self._samples.append(ms)

    def __len__(self) -> int:
        return len(self._samples)

    def values(self) -> list[float]:
        with self._lock:
            return list(self._samples)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile (``q`` in [0, 100]); ``None`` with no samples."""
        return _nearest_rank(sorted(self.values()), q)


def _nearest_rank(ordered: list[float], q: float) -> float | None:
    if not 0 <= q <= 100:
        raise ValueError("percentile must be in [0, 100]")
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class AgentMetrics:
    """A snapshot of one agent, JSON-ready (``to_dict`` / ``to_json``); latencies in ms."""

    device_id: str
    requests: int
    by_source: dict[str, int]  # edge / cloud / edge-fallback
    offload_rate: float  # offload attempts / requests
    fallbacks: dict[str, int]  # reason (timeout, breaker_open, overloaded, …) -> count
    deadline_misses: int
    local_p50_ms: float | None
    local_p99_ms: float | None
    offloaded_p50_ms: float | None
    offloaded_p99_ms: float | None
    total_p50_ms: float | None
    total_p99_ms: float | None
    agreement_rate: float | None  # edge argmax == cloud argmax, over compared samples
    agreement_samples: int
    model_versions: dict[str, str]
    breaker_state: str
    uplink_connected: bool
    timestamp: float = field(default_factory=time.time)  # seconds since the epoch
    schema: int = TELEMETRY_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)


class TelemetryRecorder:
    """Latency windows, agreement counts and the last cloud version; thread-safe."""

    def __init__(self, *, window: int = 1024) -> None:
        self.windows = {kind: LatencyWindow(window) for kind in LATENCY_KINDS}
        self._lock = threading.Lock()
        self._compared = 0
        self._agreed = 0
        self.cloud_version: str | None = None

    def record(self, kind: str, ms: float) -> None:
        self.windows[kind].record(ms)

    def compare(self, edge: Mapping[str, np.ndarray], cloud: Mapping[str, np.ndarray]) -> None:
        """Count per-sample argmax agreement between the edge and cloud answers."""
        pair = _matching_outputs(edge, cloud)
        if pair is None:
            return
        a, b = pair
        agreed = int(np.count_nonzero(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
        compared = int(np.prod(a.shape[:-1], dtype=np.int64))
        with self._lock:
            self._compared += compared
            self._agreed += agreed

    def agreement(self) -> tuple[float | None, int]:
        with self._lock:
            compared, agreed = self._compared, self._agreed
        return (agreed / compared if compared else None), compared


def _matching_outputs(
    edge: Mapping[str, np.ndarray], cloud: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The edge and cloud arrays to compare: same name if one is shared, else the first."""
    if not edge or not cloud:
        return None
    name = next((n for n in edge if n in cloud), None)
    a = edge[name] if name is not None else next(iter(edge.values()))
    b = cloud[name] if name is not None else next(iter(cloud.values()))
    a, b = np.asarray(a), np.asarray(b)
    # Class scores along the last axis; anything else (other shapes, strings) is not comparable.
    if a.ndim == 0 or a.shape != b.shape or a.shape[-1] < 1 or a.size == 0:
        return None
    if a.dtype.kind not in "iuf" or b.dtype.kind not in "iuf":
        return None
    return a, b


def snapshot(agent: BaseAgent) -> AgentMetrics:
    """Build ``AgentMetrics`` from an agent's stats and recorder."""
    rec = agent.telemetry
    with agent._stats_lock:
        stats = agent.stats
        requests = stats.requests
        by_source = dict(stats.by_source)
        reasons = dict(stats.by_reason)
        offload_rate = stats.offload_rate
        misses = stats.deadline_misses
    fallbacks = {
        reason.removeprefix("fallback:"): n
        for reason, n in reasons.items()
        if reason.startswith("fallback:")
    }
    p50: dict[str, float | None] = {}
    p99: dict[str, float | None] = {}
    for kind, window in rec.windows.items():
        ordered = sorted(window.values())
        p50[kind] = _nearest_rank(ordered, 50)
        p99[kind] = _nearest_rank(ordered, 99)
    rate, compared = rec.agreement()
    versions: dict[str, str] = {}
    runtime = agent.runtime
    if runtime is not None:
        versions["edge"] = f"{runtime.name}@{runtime.version}"
    if rec.cloud_version is not None:
        versions["cloud"] = rec.cloud_version
    return AgentMetrics(
        device_id=agent.device_id,
        requests=requests,
        by_source=by_source,
        offload_rate=offload_rate,
        fallbacks=fallbacks,
        deadline_misses=misses,
        local_p50_ms=p50["local"],
        local_p99_ms=p99["local"],
        offloaded_p50_ms=p50["offloaded"],
        offloaded_p99_ms=p99["offloaded"],
        total_p50_ms=p50["total"],
        total_p99_ms=p99["total"],
        agreement_rate=rate,
        agreement_samples=compared,
        model_versions=versions,
        breaker_state=agent.breaker.state.value,
        uplink_connected=agent.uplink is not None and agent.uplink.connected,
    )


@dataclass
class ReporterStats:
    sent: int = 0
    skipped: int = 0  # no connection, or the publish failed


class TelemetryReporter:
    """Publishes ``agent.metrics()`` as JSON on the device's telemetry topic, periodically.

    ::

        with TelemetryReporter(agent, interval_s=30):
            ...  # the agent serves requests; a report goes out every 30 s
    """

    def __init__(self, agent: BaseAgent, *, interval_s: float = 30.0, qos: int = 0) -> None:
        if agent.uplink is None:
            raise ValueError("telemetry needs an agent with a broker")
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        if qos not in (0, 1):
            raise ValueError("telemetry uses QoS 0 or 1")
        self.agent = agent
        self.interval_s = interval_s
        self.qos = qos
        self.topic = agent.uplink.topics.telemetry(agent.device_id)
        self.stats = ReporterStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self) -> AgentMetrics | None:
        """Publish one snapshot now; returns it, or ``None`` when it could not be sent."""
        uplink = self.agent.uplink
        assert uplink is not None
        metrics = self.agent.metrics()
        try:
            uplink.publish(self.topic, metrics.to_json().encode(), qos=self.qos)
        except UplinkError as e:
            self.stats.skipped += 1
            log.debug("telemetry report skipped: %s", e)
            return None
        self.stats.sent += 1
        return metrics

    def start(self) -> TelemetryReporter:
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"tandem-telemetry-{self.agent.device_id}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, *, timeout_s: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout_s)

    def __enter__(self) -> TelemetryReporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.report()
            except Exception:  # a reporting bug must not kill the thread silently
                log.exception("telemetry report failed")
