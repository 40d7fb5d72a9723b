"""What an agent reports: ``AgentMetrics`` (its telemetry) and ``TelemetryReporter``.

``AgentMetrics.from_snapshot`` turns the agent's public ``AgentSnapshot``
(``agent.snapshot()``, see ``_telemetry``) into the telemetry document. The
reporter needs only an agent's public ``device_id``, ``uplink`` and
``metrics()`` (``ReportingAgent``), so this module imports no agent module.

``AgentMetrics`` serialises (schema 2) to an object that is also a valid
``shared.DeviceReport``: the top-level ``requests``, ``agreement_samples``
and the other report fields are the per-version counts; the whole-agent
``requests`` and ``agreement_samples`` attributes travel as
``agent_requests`` and ``agent_agreement_samples``. ``fallbacks`` counts
the ``FallbackReason`` values without their ``fallback:`` prefix.

``TelemetryReporter`` publishes ``AgentMetrics`` as JSON on the device's
telemetry topic every ``interval_s`` from a daemon thread; a report that
cannot be sent (broker away) is counted and skipped, never queued.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from shared import NAME_PATTERN, DeviceReport

from ._errors import UplinkError
from ._outcome import FALLBACK_PREFIX
from ._telemetry import AgentSnapshot, ModelCounters
from ._uplink import MqttUplink

__all__ = ["AgentMetrics", "ReporterStats", "ReportingAgent", "TelemetryReporter"]

log = logging.getLogger("tandem.edge.telemetry")

TELEMETRY_SCHEMA = 2
# Whole-agent fields whose JSON names the per-version report fields took over.
_AGENT_WIDE = {"requests": "agent_requests", "agreement_samples": "agent_agreement_samples"}


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

    @classmethod
    def from_snapshot(cls, snapshot: AgentSnapshot) -> AgentMetrics:
        """The telemetry for ``agent.snapshot()``: its fields, bounded to fit a report."""
        stats = snapshot.stats
        fallbacks = {
            reason.removeprefix(FALLBACK_PREFIX): n
            for reason, n in stats.by_reason.items()
            if reason.startswith(FALLBACK_PREFIX)
        }
        versions: dict[str, str] = {}
        if snapshot.edge_model is not None:
            versions["edge"] = f"{snapshot.edge_model}@{snapshot.edge_version}"
        if snapshot.cloud_version is not None:  # from the hub: bounded, so reports stay in size
            versions["cloud"] = snapshot.cloud_version[: DeviceReport.MAX_TEXT * 2]
        model, version = _model_and_version(snapshot.edge_model, snapshot.edge_version)
        return cls(
            device_id=snapshot.device_id,
            requests=stats.requests,
            by_source=dict(stats.by_source),
            offload_rate=stats.offload_rate,
            fallbacks=fallbacks,
            deadline_misses=stats.deadline_misses,
            local_p50_ms=snapshot.local_p50_ms,
            local_p99_ms=snapshot.local_p99_ms,
            offloaded_p50_ms=snapshot.offloaded_p50_ms,
            offloaded_p99_ms=snapshot.offloaded_p99_ms,
            total_p50_ms=snapshot.total_p50_ms,
            total_p99_ms=snapshot.total_p99_ms,
            agreement_rate=snapshot.agreement_rate,
            agreement_samples=snapshot.agreement_samples,
            model_versions=versions,
            breaker_state=snapshot.breaker_state.value,
            uplink_connected=snapshot.uplink_connected,
            timestamp=snapshot.taken_at,
            labels=dict(snapshot.labels),
            capabilities=_capabilities(snapshot),
            model=model,
            version=version,
            serving=snapshot.serving,
        )

    def device_report(self) -> DeviceReport:
        """The fleet's view of this snapshot; ``shared.ManifestError`` if it is not valid."""
        return DeviceReport.from_dict(self.to_dict())


def _capabilities(snapshot: AgentSnapshot) -> dict[str, str]:
    if snapshot.edge_model is None:
        return {}
    limit = DeviceReport.MAX_TEXT
    return {
        "runtime": str(snapshot.edge_runtime)[:limit],
        "provider": str(snapshot.edge_accelerator)[:limit],
    }


def _model_and_version(name: object, version: object) -> tuple[str | None, int | None]:
    """The model name and integer version a fleet report can carry, else ``None``."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return None, None
    text = str(version)
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None
    return name, number if number else None


class ReportingAgent(Protocol):
    """What ``TelemetryReporter`` needs of an agent (``EdgeAgent`` and its twin have it)."""

    @property
    def device_id(self) -> str: ...

    @property
    def uplink(self) -> MqttUplink | None: ...

    def metrics(self) -> AgentMetrics: ...


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

    def __init__(self, agent: ReportingAgent, *, interval_s: float = 30.0, qos: int = 0) -> None:
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
