"""What the agent has been doing: latency windows, edge-cloud agreement, periodic reports.

``TelemetryRecorder`` and ``ServingStats`` sit on the agent's hot path, so
recording an answer is a few ``deque.append`` calls (documented thread-safe,
no lock) next to the agent's one stats lock (plus one argmax for offloaded
requests whose local answer was computed); everything costly (sorting for
percentiles, building the snapshot) happens when someone asks for
``agent.metrics()``.

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

``AgentMetrics`` serialises (schema 2) to an object that is also a valid
``shared.DeviceReport``: the top-level ``requests``, ``agreement_samples``
and the other report fields are the per-version counts; the whole-agent
``requests`` and ``agreement_samples`` attributes travel as
``agent_requests`` and ``agent_agreement_samples``.

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
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import NAME_PATTERN, DeviceReport

from ._errors import UplinkError

if TYPE_CHECKING:
    from ._agent import BaseAgent
    from .runtimes import ModelRuntime

__all__ = [
    "AgentMetrics",
    "LatencyWindow",
    "ModelCounters",
    "TelemetryRecorder",
    "TelemetryReporter",
]

log = logging.getLogger("tandem.edge.telemetry")

LATENCY_KINDS = ("local", "offloaded", "total")
TELEMETRY_SCHEMA = 2
# Whole-agent fields whose JSON names the per-version report fields took over.
_AGENT_WIDE = {"requests": "agent_requests", "agreement_samples": "agent_agreement_samples"}


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


@dataclass(frozen=True)
class AgentMetrics:
    """A snapshot of one agent, JSON-ready (``to_dict`` / ``to_json``); latencies in ms.

    The attributes up to ``schema`` describe the whole agent since it started;
    ``model``/``version``/``serving`` the edge model now serving. In JSON the
    per-version counters sit at the top level (a ``shared.DeviceReport``), so
    the whole-agent ``requests`` and ``agreement_samples`` are renamed there
    to ``agent_requests`` and ``agent_agreement_samples``; ``from_dict``
    reverses that.
    """

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
    labels: dict[str, str] = field(default_factory=dict)
    capabilities: dict[str, str] = field(default_factory=dict)  # runtime, provider
    model: str | None = None  # the edge model now serving (None: none, or not a valid name)
    version: int | None = None  # its version, when that is a positive integer
    serving: ModelCounters = field(default_factory=ModelCounters)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        serving = d.pop("serving")
        for name, wire in _AGENT_WIDE.items():
            d[wire] = d.pop(name)
        d["serving_since"] = serving.pop("since")
        d.update(serving)
        d.update(type="telemetry", device=self.device_id, at=self.timestamp)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentMetrics:
        """The inverse of ``to_dict`` (trusted input: no validation beyond the fields')."""
        own = {f.name for f in fields(cls)} - {"serving", *_AGENT_WIDE}
        counters = {f.name for f in fields(ModelCounters)} - {"since"}
        args = {k: v for k, v in d.items() if k in own}
        args.update({name: d[wire] for name, wire in _AGENT_WIDE.items()})
        serving = ModelCounters(
            since=d.get("serving_since"), **{k: v for k, v in d.items() if k in counters}
        )
        return cls(serving=serving, **args)

    def device_report(self) -> DeviceReport:
        """The fleet's view of this snapshot; ``shared.ManifestError`` if it is not valid."""
        return DeviceReport.from_dict(self.to_dict())


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


def _capabilities(runtime: ModelRuntime | None) -> dict[str, str]:
    if runtime is None:
        return {}
    limit = DeviceReport.MAX_TEXT
    return {"runtime": str(runtime.kind)[:limit], "provider": str(runtime.accelerator)[:limit]}


def _model_and_version(runtime: ModelRuntime | None) -> tuple[str | None, int | None]:
    if runtime is None or not isinstance(runtime.name, str):
        return None, None
    if not NAME_PATTERN.fullmatch(runtime.name):
        return None, None
    text = str(runtime.version)
    version = int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None
    return runtime.name, version if version else None


def snapshot(agent: BaseAgent) -> AgentMetrics:
    """Build ``AgentMetrics`` from an agent's stats and recorder."""
    rec = agent.telemetry
    stats = agent.stats  # a snapshot
    requests = stats.requests
    by_source = dict(stats.by_source)
    reasons = dict(stats.by_reason)
    offload_rate = stats.offload_rate
    misses = stats.deadline_misses
    serving = agent._serving
    counters = serving.counters(agent._stats_lock)
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
    runtime = serving.runtime
    if runtime is not None:
        versions["edge"] = serving.versions
    if rec.cloud_version is not None:  # from the hub: bounded, so reports stay in size
        versions["cloud"] = rec.cloud_version[: DeviceReport.MAX_TEXT * 2]
    model, version = _model_and_version(runtime)
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
        labels=dict(agent.labels),
        capabilities=_capabilities(runtime),
        model=model,
        version=version,
        serving=counters,
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
