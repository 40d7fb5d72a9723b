"""What the agent has been doing: counts, latency windows, edge-cloud agreement.

This module records; ``_report`` turns what it recorded into telemetry.
``TelemetryRecorder`` and ``ServingStats`` sit on the agent's hot path, so
recording an answer is a few ``deque.append`` calls (documented thread-safe,
no lock) next to the agent's one stats lock (plus one argmax for offloaded
requests whose local answer was computed); everything costly (sorting for
percentiles, building the snapshot) happens when someone asks for
``agent.snapshot()`` or ``agent.metrics()``.

Latency kinds, each a ring buffer of the last ``window`` samples (ms):

- ``local``: the local model's compute time, whenever it ran;
- ``offloaded``: end-to-end time of requests the cloud answered;
- ``total``: end-to-end time of every answered request.

Edge-cloud agreement: when a request was offloaded *after* the local model
ran (the uncertain path) and the cloud answered, the argmax of both answers
is compared row by row. These are free labels for judging an edge model in
the field, and a rollout gate can read them from telemetry.

Per model version (``ServingStats``): the agent also counts what the edge
model now serving has done since it started serving; installing another
model (``swap_model``, or assigning ``agent.runtime``) starts from zero, so
a fleet can compare versions. ``requests`` counts calls that ended on that
version, answered or not; ``errors`` those that raised to the caller
(invalid input, a local runtime failure, no answer at all); ``offloads``
requests sent to the cloud; ``agreement_samples``/``agreed`` as above;
``p50_ms``/``p99_ms`` the end-to-end latency of answered calls, last
``window`` of them.

``AgentSnapshot`` is the agent's public view of all of it at one moment
(``agent.snapshot()``): frozen, built from copies, so readers (telemetry, a
fleet simulator, a test) never touch the agent's private fields or locks.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from shared import DeviceReport

from ._breaker import BreakerState

if TYPE_CHECKING:
    from .runtimes import ModelRuntime

__all__ = [
    "AgentSnapshot",
    "AgentStats",
    "LatencyWindow",
    "ModelCounters",
    "ServingStats",
    "TelemetryRecorder",
    "check_labels",
]

LATENCY_KINDS = ("local", "offloaded", "total")


def _copy(samples: deque[float]) -> list[float]:
    """A snapshot of a deque that other threads append to without a lock."""
    while True:
        try:
            return list(samples)
        except RuntimeError:  # an append landed mid-copy (only if the copy ran Python code)
            continue


class LatencyWindow:
    """The last ``size`` latency samples (ms); thread-safe, bounded.

    Appends need no lock (``deque.append`` is thread-safe); a reader copies
    the samples and retries in the rare case that an append raced the copy.
    """

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise ValueError("window size must be at least 1")
        self._samples: deque[float] = deque(maxlen=size)

    def record(self, ms: float) -> None:
        self._samples.append(ms)

    def __len__(self) -> int:
        return len(self._samples)

    def values(self) -> list[float]:
        return _copy(self._samples)

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
class ModelCounters:
    """What the edge model version now serving did since it started serving."""

    requests: int = 0  # calls that ended on this version, answered or not
    errors: int = 0  # calls that raised to the caller
    offloads: int = 0  # calls sent to the cloud
    agreement_samples: int = 0
    agreed: int = 0
    p50_ms: float | None = None  # end-to-end, answered calls, recent window
    p99_ms: float | None = None
    since: float | None = None  # seconds since the epoch when this version started serving


@dataclass
class AgentStats:
    """Answered calls of the whole agent since it started (``agent.stats`` is a snapshot)."""

    requests: int = 0
    by_source: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    offload_attempts: int = 0
    deadline_misses: int = 0

    @property
    def offload_rate(self) -> float:
        return self.offload_attempts / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    """One agent at one moment (``agent.snapshot()``); latencies in ms.

    ``stats`` and the latency and agreement fields cover the whole agent since
    it started; ``serving`` and the ``edge_*`` fields the edge model now
    serving (all ``None`` without a local model). Counts are read together
    under the agent's lock; latency windows are copied just before or after,
    without stopping the calls in flight.
    """

    device_id: str
    labels: dict[str, str]
    stats: AgentStats
    serving: ModelCounters
    edge_model: str | None  # the runtime's name
    edge_version: str | None  # the runtime's version
    edge_runtime: str | None  # the runtime's kind, e.g. "onnxruntime"
    edge_accelerator: str | None  # what runs it, e.g. "CPUExecutionProvider"
    cloud_version: str | None  # "model@version" of the last cloud answer
    local_p50_ms: float | None
    local_p99_ms: float | None
    offloaded_p50_ms: float | None
    offloaded_p99_ms: float | None
    total_p50_ms: float | None
    total_p99_ms: float | None
    agreement_rate: float | None  # edge argmax == cloud argmax, over compared samples
    agreement_samples: int
    breaker_state: BreakerState
    uplink_connected: bool
    local_inflight: int  # calls running the local model now
    taken_at: float = field(default_factory=time.time)  # seconds since the epoch


class TelemetryRecorder:
    """Latency windows, agreement counts and the last cloud version; thread-safe."""

    def __init__(self, *, window: int = 1024) -> None:
        self.windows = {kind: LatencyWindow(window) for kind in LATENCY_KINDS}
        # The deques behind the windows, for the one call per answer on the hot path.
        self._total = self.windows["total"]._samples
        self._local = self.windows["local"]._samples
        self._offloaded = self.windows["offloaded"]._samples
        self._lock = threading.Lock()
        self._compared = 0
        self._agreed = 0
        self.cloud_version: str | None = None

    def record(self, kind: str, ms: float) -> None:
        self.windows[kind].record(ms)

    def record_answer(self, total_ms: float, local_ms: float | None, offloaded: bool) -> None:
        """One answered request: its end-to-end time, local compute time (if it ran)."""
        self._total.append(total_ms)
        if local_ms is not None:
            self._local.append(local_ms)
        if offloaded:
            self._offloaded.append(total_ms)

    def compare(
        self, edge: Mapping[str, np.ndarray], cloud: Mapping[str, np.ndarray]
    ) -> tuple[int, int]:
        """Count per-sample argmax agreement between the edge and cloud answers.

        Returns ``(compared, agreed)`` for this request; ``(0, 0)`` when the
        answers cannot be compared.
        """
        pair = _matching_outputs(edge, cloud)
        if pair is None:
            return 0, 0
        a, b = pair
        agreed = int(np.count_nonzero(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
        compared = int(np.prod(a.shape[:-1], dtype=np.int64))
        with self._lock:
            self._compared += compared
            self._agreed += agreed
        return compared, agreed

    def percentiles(self) -> dict[str, tuple[float | None, float | None]]:
        """``(p50, p99)`` of each latency kind (nearest rank; ``None`` with no samples)."""
        out: dict[str, tuple[float | None, float | None]] = {}
        for kind, window in self.windows.items():
            ordered = sorted(window.values())
            out[kind] = (_nearest_rank(ordered, 50), _nearest_rank(ordered, 99))
        return out

    def agreement(self) -> tuple[float | None, int]:
        with self._lock:
            compared, agreed = self._compared, self._agreed
        return (agreed / compared if compared else None), compared


class ServingStats:
    """Counters of one edge model version since it started serving on this agent.

    The agent replaces the whole object when another model starts serving,
    and increments the counters under its stats lock; ``latency`` is a
    bounded deque appended without a lock. ``runtime`` is the model these
    counts belong to (``None`` for an agent without a local model).
    """

    __slots__ = (
        "agreed",
        "compared",
        "errors",
        "latency",
        "offloads",
        "requests",
        "runtime",
        "since",
        "versions",
    )

    def __init__(self, runtime: ModelRuntime | None, *, window: int = 1024) -> None:
        self.runtime = runtime
        self.since = time.time()
        #: ``InferenceResult.model_versions["edge"]``, formatted once rather than per call.
        self.versions = "" if runtime is None else f"{runtime.name}@{runtime.version}"
        self.requests = 0
        self.errors = 0
        self.offloads = 0
        self.compared = 0
        self.agreed = 0
        self.latency: deque[float] = deque(maxlen=window)

    def counters(self, lock: threading.Lock) -> ModelCounters:
        """Counts read together under ``lock`` (the agent's stats lock), and percentiles."""
        with lock:
            requests, errors, offloads = self.requests, self.errors, self.offloads
            compared, agreed = self.compared, self.agreed
        ordered = sorted(_copy(self.latency))
        return ModelCounters(
            requests=requests,
            errors=errors,
            offloads=offloads,
            agreement_samples=compared,
            agreed=agreed,
            p50_ms=_nearest_rank(ordered, 50),
            p99_ms=_nearest_rank(ordered, 99),
            since=self.since,
        )


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


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Device labels as a report carries them; ``ValueError`` when they would not fit."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise ValueError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    most, chars = DeviceReport.MAX_ENTRIES, DeviceReport.MAX_TEXT
    if len(labels) > most:
        raise ValueError(f"{len(labels)} labels; at most {most} are allowed")
    checked: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not 0 < len(key) <= chars:
            raise ValueError(f"label name {key!r:.60} must be a string of 1-{chars} characters")
        if not isinstance(value, str) or len(value) > chars:
            raise ValueError(f"label {key!r} must have a string value of up to {chars} characters")
        checked[key] = value
    # Keep room in the report's size limit for everything else it carries.
    size = len(json.dumps(checked))
    if size > DeviceReport.MAX_BYTES // 2:
        raise ValueError(f"labels take {size} bytes as JSON; at most {DeviceReport.MAX_BYTES // 2}")
    return checked
