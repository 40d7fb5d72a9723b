"""One simulated device, as a pure state machine: no network, no clock of its own.

The fleet (``_fleet``) owns the connections and the downloads and calls in
here from its one event-loop thread, passing the time; everything here is
a decision about what the device would do and report.

Its trust decisions are the real updater's (``edge_agent.updater.UpdateTrust``:
pinned keys, expiry, device and model, no downgrade without a signed
rollback, no replay) and its telemetry is what a real agent's
``TelemetryReporter`` sends (``AgentMetrics.from_snapshot`` of an
``edge_agent.AgentSnapshot``; on the wire also a ``shared.DeviceReport``),
so the fleet a rollout sees is the fleet of real devices, short of running
models. An assignment's way through a device:

    received ──verify──▶ refused (a ``failed`` report; nothing changes)
        │                  bad or untrusted signature, expired, another device
        │                  or model, a lower version without ``rollback``, a replay
        ├─ already running that version, or seen before ▶ ignored (no report)
        └─▶ downloading ─▶ verifying ─▶ installed / rolled-back   (running_version moves)
                 │              └─────▶ failed  (fail_rate device, or a fail_versions version)
                 └────────────────────▶ failed  (manifest refused, download or digest wrong)

Invariants: at most one install at a time (a newer assignment that arrives
meanwhile waits, the latest one wins); ``running_version`` changes only on
a successful install, and then the per-version telemetry counters start
again from zero (they describe the version now serving); the trust record
(highest accepted version, last assignment's issue time) moves only on a
successful install, as ``UpdateTrust.after_commit`` says, and only grows.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType

from edge_agent import (
    AgentMetrics,
    AgentSnapshot,
    AgentStats,
    BreakerState,
    ModelCounters,
    Source,
    UntrustedUpdateError,
)
from edge_agent.updater import TrustRecord, UpdateTrust
from shared import (
    Assignment,
    DeviceReport,
    ModelManifest,
    UpdateState,
    UpdateStatus,
    claimed_version,
    format_time,
)

from ._config import SimulatorConfig
from ._errors import SimulatorError

__all__ = [
    "AssignmentDecision",
    "DeviceState",
    "DeviceTraits",
    "SimulatedDevice",
    "draw_traits",
]

AGREEMENT = 0.97  # edge-cloud agreement on offloaded samples, a healthy model
DISAGREEMENT = 0.60  # … a model that disagrees with the cloud
OFFLOAD_RATE = 0.20
ERROR_RATE = 0.002
_REMEMBERED = 16  # assignment payloads a device remembers having handled
SIMULATED = "simulated"  # the runtime and accelerator a simulated device reports


@dataclass(frozen=True)
class DeviceTraits:
    """What the seed made of one device."""

    fails_installs: bool
    disagrees: bool
    offline_at_s: float | None  # seconds after the fleet starts; None: stays online
    requests_per_s: float
    p50_ms: float
    agreement_offset: float = 0.0  # this device's agreement minus its version's
    lies: str | None = None  # what it forges in its telemetry (SimulatorConfig.lie)


def draw_traits(config: SimulatorConfig) -> list[DeviceTraits]:
    """Every device's traits; exactly round(rate x devices) devices get each misbehaviour."""
    n = config.devices

    def chosen(what: str, rate: float) -> set[int]:
        return set(random.Random(f"{config.seed}/{what}").sample(range(n), round(rate * n)))

    failing = chosen("fail", config.fail_rate)
    disagreeing = chosen("disagree", config.disagree_rate)
    offline = chosen("offline", config.offline_rate)
    liars = chosen("liar", config.liar_rate)
    spread = random.Random(f"{config.seed}/spread")
    rng = random.Random(f"{config.seed}/traits")
    low, high = config.requests_per_s
    traits = []
    for i in range(n):
        offline_at = rng.uniform(0, config.offline_after_s) if i in offline else None
        traits.append(
            DeviceTraits(
                fails_installs=i in failing,
                disagrees=i in disagreeing,
                offline_at_s=offline_at,
                requests_per_s=rng.uniform(low, high),
                p50_ms=rng.uniform(2.0, 12.0),
                agreement_offset=spread.gauss(0.0, config.agreement_spread),
                lies=config.lie if i in liars else None,
            )
        )
    return traits


@dataclass(frozen=True)
class AssignmentDecision:
    """What a device does with an assignment: report something, start an install, or both."""

    report: UpdateStatus | None = None
    install: Assignment | None = None


@dataclass(frozen=True)
class DeviceState:
    """A snapshot of one device, for tests and the live summary."""

    device: str
    labels: Mapping[str, str]  # read-only
    online: bool
    model: str
    running_version: int
    installing_version: int | None
    last_status: UpdateStatus | None
    installs: int  # successful installs and rollbacks
    failures: int  # failed reports: refused assignments and failed installs
    connects: int  # successful MQTT connections, the first one included
    traits: DeviceTraits


class SimulatedDevice:
    """One device's state and decisions. Not thread-safe: one thread drives it."""

    def __init__(
        self,
        device: str,
        *,
        config: SimulatorConfig,
        labels: dict[str, str],
        traits: DeviceTraits,
        now: float,
    ) -> None:
        self.device = device
        self.model = config.model
        self.labels: Mapping[str, str] = MappingProxyType(dict(labels))
        self.traits = traits
        self.online = False
        self.connects = 0
        self._state: DeviceState | None = None  # state()'s answer until something changes
        self.running_version = config.initial_version
        self._trust = UpdateTrust(
            config.trusted_keys,
            device_id=device,
            model=config.model,
            record=TrustRecord(highest_accepted=config.initial_version),
        )
        self.installing: Assignment | None = None
        self.last_status: UpdateStatus | None = None
        self.installs = 0
        self.failures = 0
        self._fail_versions = config.fail_versions
        self._disagree_versions = config.disagree_versions
        self._version_agreement = dict(config.version_agreement)
        self._version_error_rate = dict(config.version_error_rate)
        self._install_delay = config.install_delay_s
        self._rng = random.Random(f"{config.seed}/{device}")
        self._pending: bytes | None = None  # an assignment that came during an install
        self._handled: dict[str, None] = {}
        self.requests = self.errors = self.offloads = self.agreed = 0  # this version's
        self._since = self._last_tick = now
        self._lifetime = _Lifetime()

    # -- the connection ----------------------------------------------------------------------

    def connected(self) -> bool:
        """The broker accepted the connection; True the first time."""
        self.online = True
        self.connects += 1
        self._state = None
        return self.connects == 1

    def disconnected(self) -> None:
        self.online = False
        self._state = None

    # -- assignments -----------------------------------------------------------------------

    def on_assignment(self, payload: bytes, now: float) -> AssignmentDecision:
        """Decide about an assignment payload (retained or fresh) from the broker."""
        if not payload:  # a cleared retained message
            return AssignmentDecision()
        key = hashlib.sha256(payload).hexdigest()
        if key in self._handled:
            return AssignmentDecision()
        if self.installing is not None:
            self._pending = payload  # the latest one wins once this install ends
            return AssignmentDecision()
        self._remember(key)
        try:
            assignment = self._accept(payload)
        except SimulatorError as e:
            version = claimed_version(payload) or self.running_version
            return AssignmentDecision(report=self._failed(version, str(e), None, now))
        if assignment.version == self.running_version:
            return AssignmentDecision()
        self.installing = assignment
        report = self._report(
            assignment.version, UpdateState.DOWNLOADING, "", now, assignment.rollout
        )
        return AssignmentDecision(report=report, install=assignment)

    def download_finished(self, error: str | None, now: float) -> tuple[UpdateStatus, float | None]:
        """After the manifest and blob: the report, and how long the install then takes
        (``None`` when the download failed and the install is over)."""
        assignment = self._current()
        if error is not None:
            self.installing = None
            return self._failed(assignment.version, error, assignment.rollout, now), None
        low, high = self._install_delay
        report = self._report(
            assignment.version, UpdateState.VERIFYING, "", now, assignment.rollout
        )
        return report, self._rng.uniform(low, high)

    def install_finished(self, now: float) -> UpdateStatus:
        """The end of the install: the new version serves, or this device fails it."""
        assignment = self._current()
        self.installing = None
        version = assignment.version
        if self.traits.fails_installs or version in self._fail_versions:
            reason = f"smoke test failed on {self.model}@{version} (simulated failure)"
            return self._failed(version, reason, assignment.rollout, now)
        rollback = assignment.rollback and version < self.running_version
        self.running_version = version
        self._trust.record = self._trust.after_commit(assignment)
        self.installs += 1
        self._reset_counters(now)
        state = UpdateState.ROLLED_BACK if rollback else UpdateState.INSTALLED
        return self._report(version, state, "", now, assignment.rollout)

    def take_pending(self) -> bytes | None:
        """The assignment that arrived during the install that just ended, if any."""
        payload, self._pending = self._pending, None
        return payload

    # -- telemetry -------------------------------------------------------------------------

    def telemetry(self, now: float) -> AgentMetrics:
        """The agent's snapshot with the counters advanced to ``now``, as a real device's
        ``TelemetryReporter`` publishes it (``to_json``); the per-version counters count
        since this version started serving. A lying device forges it (``traits.lies``)."""
        p50, p99 = self._advance(now)
        life = self._lifetime
        stats = AgentStats(
            requests=life.requests,
            by_source=Counter(
                {
                    Source.EDGE.value: life.requests - life.offloads,
                    Source.CLOUD.value: life.offloads,
                }
            ),
            offload_attempts=life.offloads,
        )
        serving = ModelCounters(
            requests=self.requests,
            errors=self.errors,
            offloads=self.offloads,
            agreement_samples=self.offloads,
            agreed=self.agreed,
            p50_ms=p50,
            p99_ms=p99,
            since=self._since,
        )
        metrics = AgentMetrics.from_snapshot(
            AgentSnapshot(
                device_id=self.device,
                labels=dict(self.labels),
                stats=stats,
                serving=serving,
                edge_model=self.model,
                edge_version=str(self.running_version),
                edge_runtime=SIMULATED,
                edge_accelerator=SIMULATED,
                cloud_version=None,
                local_p50_ms=None,
                local_p99_ms=None,
                offloaded_p50_ms=None,
                offloaded_p99_ms=None,
                total_p50_ms=p50,
                total_p99_ms=p99,
                agreement_rate=life.agreed / life.offloads if life.offloads else None,
                agreement_samples=life.offloads,
                breaker_state=BreakerState.CLOSED,
                uplink_connected=True,
                local_inflight=0,
                taken_at=now,
            )
        )
        return forge(metrics, self.traits.lies) if self.traits.lies else metrics

    def report(self, now: float) -> DeviceReport:
        """What ``telemetry(now)`` says, as the fleet reads it (cheaper: no agent snapshot)."""
        p50, p99 = self._advance(now)
        report = DeviceReport(
            device=self.device,
            at=now,
            labels=dict(self.labels),
            capabilities={"runtime": SIMULATED, "provider": SIMULATED},
            model=self.model,
            version=self.running_version,
            requests=self.requests,
            errors=self.errors,
            offloads=self.offloads,
            agreement_samples=self.offloads,
            agreed=self.agreed,
            p50_ms=p50,
            p99_ms=p99,
        )
        return forge_report(report, self.traits.lies) if self.traits.lies else report

    def _advance(self, now: float) -> tuple[float | None, float | None]:
        """Count the requests since the last call; (p50, p99) of the recent window."""
        elapsed = max(0.0, now - self._last_tick)
        self._last_tick = now
        expected = self.traits.requests_per_s * elapsed
        new = int(expected) + (self._rng.random() < expected - int(expected))
        offloads = _binomial(self._rng, new, OFFLOAD_RATE)
        agreed = _binomial(self._rng, offloads, self._agreement())
        self.requests += new
        error_rate = self._version_error_rate.get(self.running_version, ERROR_RATE)
        self.errors += _binomial(self._rng, new, error_rate)
        self.offloads += offloads
        self.agreed += agreed
        self._lifetime.add(new, offloads, agreed)
        p50 = round(self.traits.p50_ms * self._rng.uniform(0.9, 1.1), 3) if self.requests else None
        p99 = round(p50 * self._rng.uniform(3.0, 5.0), 3) if p50 is not None else None
        return p50, p99

    def _agreement(self) -> float:
        v = self.running_version
        disagrees = self.traits.disagrees or v in self._disagree_versions
        base = self._version_agreement.get(v, DISAGREEMENT if disagrees else AGREEMENT)
        return min(1.0, max(0.0, base + self.traits.agreement_offset))

    def accept_manifest(self, raw: bytes | None, assignment: Assignment) -> ModelManifest:
        """The manifest if it is signed, current and the one ``assignment`` asks for.

        Safe from any thread: it reads the pinned keys only (the download threads call it).
        """
        if raw is None:
            raise SimulatorError(
                f"the CDN has no manifest for {assignment.model}@{assignment.version}"
            )
        try:
            return self._trust.accept_manifest(raw, assignment)
        except UntrustedUpdateError as e:
            raise SimulatorError(str(e)) from e

    # -- queries ---------------------------------------------------------------------------

    def state(self) -> DeviceState:
        """A snapshot; the same object until the device changes (fleet snapshots are cheap)."""
        if self._state is not None:
            return self._state
        self._state = DeviceState(
            device=self.device,
            labels=self.labels,
            online=self.online,
            model=self.model,
            running_version=self.running_version,
            installing_version=self.installing.version if self.installing else None,
            last_status=self.last_status,
            installs=self.installs,
            failures=self.failures,
            connects=self.connects,
            traits=self.traits,
        )
        return self._state

    # -- inside ----------------------------------------------------------------------------

    def _accept(self, payload: bytes) -> Assignment:
        """The assignment if this device may act on it (the real updater's rules)."""
        try:
            return self._trust.accept_assignment(payload)
        except UntrustedUpdateError as e:  # DowngradeError included
            raise SimulatorError(str(e)) from e

    def _current(self) -> Assignment:
        if self.installing is None:
            raise SimulatorError(f"{self.device}: no install in progress")
        return self.installing

    def _failed(self, version: int, reason: str, rollout: str | None, now: float) -> UpdateStatus:
        self.failures += 1
        return self._report(version, UpdateState.FAILED, reason, now, rollout)

    def _report(
        self,
        version: int,
        state: UpdateState,
        reason: str,
        now: float,
        rollout: str | None,
    ) -> UpdateStatus:
        status = UpdateStatus(
            device=self.device,
            model=self.model,
            version=version,
            state=state,
            at=format_time(datetime.fromtimestamp(now, UTC)),
            reason=reason.splitlines()[0] if reason else "",
            running_version=self.running_version,
            rollout=rollout,
        )
        self.last_status = status
        self._state = None
        return status

    def _reset_counters(self, now: float) -> None:
        self.requests = self.errors = self.offloads = self.agreed = 0
        self._since = self._last_tick = now

    def _remember(self, key: str) -> None:
        self._handled[key] = None
        while len(self._handled) > _REMEMBERED:
            del self._handled[next(iter(self._handled))]


class _Lifetime:
    """What the whole agent did since the device started, across versions."""

    __slots__ = ("agreed", "offloads", "requests")

    def __init__(self) -> None:
        self.requests = self.offloads = self.agreed = 0

    def add(self, requests: int, offloads: int, agreed: int) -> None:
        self.requests += requests
        self.offloads += offloads
        self.agreed += agreed


def _binomial(rng: random.Random, n: int, p: float) -> int:
    """A binomial draw: exact (waiting times between successes) while ``n·min(p, 1-p)``
    is small, the normal approximation beyond, where clipping it to [0, n] no longer
    biases it. (The former cut-over at n = 10 clipped draws of a 97% rate at n and so
    lowered high rates by up to 0.8 points: a bias between cohorts of unequal draws.)"""
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    if p > 0.5:
        return n - _binomial(rng, n, 1.0 - p)
    if n * p < 50:
        log_q = math.log1p(-p)
        k = position = 0
        while True:
            position += int(math.log(1.0 - rng.random()) / log_q) + 1
            if position > n:
                return k
            k += 1
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return min(n, max(0, round(rng.gauss(mean, sd))))


_HUGE = 10**15


def forge(metrics: AgentMetrics, lie: str) -> AgentMetrics:
    """What a lying device publishes instead of ``metrics`` (``SimulatorConfig.lie``)."""
    s = metrics.serving
    if lie == "labels":
        return replace(metrics, labels={"site": "factory-a", "hw": "npu"})
    if lie == "version":
        version = (metrics.version or 0) + 1
        return replace(
            metrics, version=version, model_versions={"edge": f"{metrics.model}@{version}"}
        )
    if lie == "huge":
        counters = ModelCounters(
            requests=_HUGE, errors=_HUGE, offloads=_HUGE, agreement_samples=_HUGE, agreed=0
        )
    elif lie == "bad":
        counters = replace(s, errors=s.requests, agreed=0)
    else:  # good
        counters = replace(s, errors=0, agreed=s.agreement_samples)
    return replace(
        metrics, serving=replace(counters, p50_ms=s.p50_ms, p99_ms=s.p99_ms, since=s.since)
    )


def forge_report(report: DeviceReport, lie: str) -> DeviceReport:
    """``forge`` for a ``DeviceReport``."""
    if lie == "labels":
        return replace(report, labels={"site": "factory-a", "hw": "npu"})
    if lie == "version":
        return replace(report, version=(report.version or 0) + 1)
    if lie == "huge":
        return replace(
            report, requests=_HUGE, errors=_HUGE, offloads=_HUGE, agreement_samples=_HUGE, agreed=0
        )
    if lie == "bad":
        return replace(report, errors=report.requests, agreed=0)
    return replace(report, errors=0, agreed=report.agreement_samples)
