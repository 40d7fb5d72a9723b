"""The rollout state machine: staged, health-gated rollout of one model version.

Pure: no I/O, no clock, no threads. Time comes in as ``now`` (seconds, any
epoch); every event or command returns the ``Action``s (``Assign``, ``Unassign``,
``Notify``) that the controller must carry out. ``to_dict``/``from_dict`` give a
JSON-able snapshot from which a restarted controller resumes exactly.

States::

    pending ──start──▶ running(wave k) ──tick: gates OK──▶ running(wave k+1) … ──▶ completed
                         │  ▲    │
               pause()   ▼  │    │ failure rate / health gate tripped (automatic)
                       paused ◀──┴──▶ halted      (both leave only via resume())
    pending | running | paused | halted ──abort()──▶ aborted
    running | paused | halted | completed | aborted ──rollback()──▶ rolling_back ──▶ rolled_back

Gates. The next wave starts on ``tick(now)`` once ``soak_s`` has passed since the
current wave started, at least ``min(min_reports, wave size)`` devices of the
wave reported a final state, the failure gate holds and the enabled health gates
passed. The last wave completes when, in addition, every device of the rollout
has a final state (installed, failed or timed out).

Health (``_wave_health``, ``_gates``, ``_stats``). Each wave compares the
devices on the new version with a control cohort the rollout keeps on the
previous one, matched in size and labels, over the same window; telemetry
comes in through ``telemetry(device, report, now)`` and only the devices of
the two cohorts count. At each of the wave's looks every enabled gate is a
non-inferiority judgement; a failing one halts the rollout, all passing let the
wave end, and still inconclusive at the last look halts it too.

Invariants (``check_invariants`` asserts them):

1. A device belongs to exactly one wave, a wave that has started (its index is
   at most the current wave); records exist only for started waves.
2. A device is assigned the new version at most once (so at most once per
   wave), and the previous version (``rollback=True``) at most once.
3. The failure rate is failed-or-timed-out devices over all devices of the
   waves started so far, reports of several waves counting together.
4. Queued (not yet assigned) devices exist only in the current wave while the
   rollout is paused or halted; running assigns them at once.
5. The wave index never decreases and advances only in ``tick`` while running;
   halted and paused never advance or assign without ``resume``.
6. completed, aborted and rolled_back are terminal, except that completed and
   aborted (like running, paused and halted) may be rolled back with ``rollback()``.
7. rolled_back is reached only when every device that was assigned the new
   version has reported ``rolled-back`` or ``installed`` of the previous version.
8. A device of the control cohort was never assigned the new version, and is
   in no other cohort of the wave.

Messy input is expected and harmless: reports from devices not in the rollout,
for other versions, duplicates, and reports older than the device's last one
(by ``now``) are ignored; a late report after a timeout replaces the timeout.
``resume`` accepts the failures and health data seen so far: the failure gate
trips again only on a new failure; the health of the resumed wave no longer
decides (the next wave's does).

Update reports come in as ``shared.UpdateState`` members and are compared
as members; snapshots hold only this module's own ``StrEnum`` values (plain
JSON strings), so a snapshot written by an older release loads unchanged.

Exceptions (defined in ``model_cdn._errors``, re-exported here)::

    model_cdn.CdnError
    └── RolloutStateError   a command that the current state does not allow
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from shared import UpdateState

from .._errors import RolloutStateError
from ._spec import RolloutSpec, plan_waves
from ._stats import Verdict
from ._wave_health import WaveHealth

__all__ = [
    "Action",
    "Assign",
    "DeviceStatus",
    "Notify",
    "Rollout",
    "RolloutState",
    "RolloutStateError",
    "Unassign",
]

_FORMAT = 2
_FORMATS = (1, 2)  # 1: before cohorts; its health data is dropped on load


class RolloutState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    COMPLETED = "completed"
    ABORTED = "aborted"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


class DeviceStatus(enum.StrEnum):
    QUEUED = "queued"  # in a started wave, not yet assigned (rollout paused or halted)
    ASSIGNED = "assigned"
    INSTALLED = "installed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"  # assignment withdrawn by abort() before the device reported
    ROLLBACK_ASSIGNED = "rollback_assigned"
    ROLLBACK_FAILED = "rollback_failed"  # still awaited: the controller may retry
    ROLLED_BACK = "rolled_back"


_FINAL = {DeviceStatus.INSTALLED, DeviceStatus.FAILED, DeviceStatus.TIMED_OUT}
_FAILED = {DeviceStatus.FAILED, DeviceStatus.TIMED_OUT}
_ACTIVE = {RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.HALTED}


@dataclass(frozen=True)
class Assign:
    device: str
    version: int
    rollback: bool = False


@dataclass(frozen=True)
class Unassign:
    device: str


@dataclass(frozen=True)
class Notify:
    state: RolloutState
    wave: int  # 0-based; -1 before the first wave
    reason: str = ""


Action = Assign | Unassign | Notify


@dataclass
class _Device:
    wave: int
    status: DeviceStatus
    assigned_at: float | None = None
    reported_at: float | None = None
    assigns: int = 0
    rollback_assigns: int = 0


def _update_state(state: UpdateState | str) -> UpdateState | None:
    """The member for ``state``; None for a value this build does not know (ignored)."""
    try:
        return UpdateState(state)
    except ValueError:
        return None


def _order_key(spec: RolloutSpec, device: str) -> str:
    # Deterministic but spread out: the first wave is not "the devices whose names sort first".
    return hashlib.sha256(f"{spec.model}/{spec.version}/{device}".encode()).hexdigest()


class Rollout:
    """The state of one rollout; feed it events, carry out the actions it returns."""

    def __init__(self, spec: RolloutSpec) -> None:
        self.spec = spec
        self.state = RolloutState.PENDING
        self.wave = -1
        self.wave_ends: list[int] = []  # cumulative device counts of the planned fleet
        self.order: list[str] = []  # the planned fleet, in wave order
        self._planned: set[str] = set()  # the same, for lookups
        self.devices: dict[str, _Device] = {}
        self.wave_started_at: float | None = None
        self.reason = ""
        self.labels: dict[str, dict[str, str]] = {}  # the devices known at start, for matching
        self.outside: list[str] = []  # devices of the model outside the target (control pool)
        self.health = WaveHealth(spec)
        self.waived_failures = -1  # failed count accepted by resume(); -1: none
        self.ignored_reports = 0

    # ----------------------------------------------------------------- queries

    @property
    def failed(self) -> int:
        return sum(d.status in _FAILED for d in self.devices.values())

    @property
    def failure_rate(self) -> float:
        return self.failed / len(self.devices) if self.devices else 0.0

    def wave_devices(self, k: int) -> list[str]:
        return [n for n, d in self.devices.items() if d.wave == k]

    # ------------------------------------------------------------------ events

    def start(self, devices: Mapping[str, Mapping[str, str]], now: float) -> list[Action]:
        """Start wave 0 over the ``devices`` (id → labels) that match the target.

        Raises ``ValueError`` when the fleet is empty or a wave would hold 0 devices.
        """
        self._require({RolloutState.PENDING}, "start")
        fleet = sorted(
            (n for n, labels in devices.items() if self.spec.matches(labels)),
            key=lambda n: (_order_key(self.spec, n), n),
        )
        self.labels = {n: dict(labels) for n, labels in devices.items()}
        self.outside = sorted(n for n in devices if n not in set(fleet))
        self.wave_ends = plan_waves(self.spec, len(fleet))
        self.order = fleet
        self._planned = set(fleet)
        self.state = RolloutState.RUNNING
        return self._start_wave(0, now)

    def device_joined(self, device: str, labels: Mapping[str, str], now: float) -> list[Action]:
        """A device came online: a new matching one joins the current wave."""
        if self.state not in _ACTIVE or device in self.devices or device in self._planned:
            return []  # known, or already planned for a later wave
        if device not in self.labels:
            self.labels[device] = dict(labels)
        if not self.spec.matches(labels):
            if device not in self.outside:
                self.outside.append(device)
            return []
        self.devices[device] = _Device(wave=self.wave, status=DeviceStatus.QUEUED)
        self.health.joined(device)
        if self.state is RolloutState.RUNNING:
            return self._assign([device], now)
        return []

    def report(
        self, device: str, state: UpdateState | str, version: int, now: float
    ) -> list[Action]:
        """A device's update status (``installed``, ``failed``, ``rolled-back``; others ignored).

        ``state`` is a ``shared.UpdateState`` (its wire value is accepted too).
        """
        d = self.devices.get(device)
        if d is None or (d.reported_at is not None and now < d.reported_at):
            self.ignored_reports += 1
            return []
        update = _update_state(state)
        if self.state in (RolloutState.ROLLING_BACK, RolloutState.ROLLED_BACK):
            return self._rollback_report(device, d, update, version, now)
        if self.state is RolloutState.PENDING or version != self.spec.version:
            self.ignored_reports += 1
            return []
        if d.status is DeviceStatus.QUEUED:
            self.ignored_reports += 1
            return []
        if update is UpdateState.INSTALLED:
            new = DeviceStatus.INSTALLED
        elif update in (UpdateState.FAILED, UpdateState.ROLLED_BACK):
            new = DeviceStatus.FAILED  # rolled-back: the device undid the update itself
        else:
            return []  # progress (downloading, verifying): no decision
        d.status, d.reported_at = new, now
        if new is DeviceStatus.INSTALLED:
            self.health.installed(device, now)
        else:
            self.health.failed(device)
        return self._check_gates()

    def telemetry(self, device: str, report: Mapping[str, Any], now: float) -> list[Action]:
        """A device's heartbeat (a ``shared.DeviceReport`` as a dict), heard at ``now``.

        Counts only for a device of the current wave's cohorts (``_evidence``).
        """
        if self.state in (RolloutState.RUNNING, RolloutState.PAUSED):
            self.health.telemetry(device, report, now)
        return []

    def tick(self, now: float) -> list[Action]:
        """Time passes: time out silent devices, then start the next wave or complete."""
        if self.state not in _ACTIVE:
            return []
        for d in self.devices.values():
            if (
                d.status is DeviceStatus.ASSIGNED
                and d.assigned_at is not None
                and now - d.assigned_at >= self.spec.device_timeout_s
            ):
                d.status = DeviceStatus.TIMED_OUT
        actions = self._check_gates()
        actions += self._look(now)
        if self.state is not RolloutState.RUNNING or not self._wave_done(now):
            return actions
        if self.wave == len(self.wave_ends) - 1:
            if all(d.status in _FINAL for d in self.devices.values()):
                return [*actions, *self._become(RolloutState.COMPLETED, "")]
            return actions
        return [*actions, *self._start_wave(self.wave + 1, now)]

    # ---------------------------------------------------------------- commands

    def pause(self) -> list[Action]:
        if self.state in (RolloutState.PAUSED, RolloutState.HALTED):
            return []
        self._require({RolloutState.RUNNING}, "pause")
        return self._become(RolloutState.PAUSED, "paused by operator")

    def resume(self, now: float) -> list[Action]:
        """Leave paused or halted; accepts the failures and health data seen so far."""
        if self.state is RolloutState.RUNNING:
            return []
        self._require({RolloutState.PAUSED, RolloutState.HALTED}, "resume")
        self.waived_failures = self.failed
        self.health.waive()
        actions = self._become(RolloutState.RUNNING, "resumed")
        queued = [n for n, d in self.devices.items() if d.status is DeviceStatus.QUEUED]
        return [*actions, *self._assign(queued, now)]

    def abort(self) -> list[Action]:
        """Stop for good; assignments not yet reported on are withdrawn, queued devices dropped."""
        if self.state is RolloutState.ABORTED:
            return []
        self._require({RolloutState.PENDING, *_ACTIVE}, "abort")
        actions: list[Action] = []
        for n, d in self.devices.items():
            if d.status is DeviceStatus.ASSIGNED:
                actions.append(Unassign(n))
            if d.status in (DeviceStatus.ASSIGNED, DeviceStatus.QUEUED):
                d.status = DeviceStatus.CANCELLED
        return [*actions, *self._become(RolloutState.ABORTED, "aborted by operator")]

    def rollback(self, now: float) -> list[Action]:
        """Send every device that was assigned the new version back to the previous one."""
        if self.state in (RolloutState.ROLLING_BACK, RolloutState.ROLLED_BACK):
            return []
        self._require({*_ACTIVE, RolloutState.COMPLETED, RolloutState.ABORTED}, "roll back")
        actions: list[Action] = []
        for n, d in self.devices.items():
            if d.assigns == 0:
                continue  # never told to change: nothing to undo
            d.status, d.assigned_at = DeviceStatus.ROLLBACK_ASSIGNED, now
            d.rollback_assigns += 1
            actions.append(Assign(n, self.spec.previous_version, rollback=True))
        actions += self._become(RolloutState.ROLLING_BACK, "rollback requested")
        return [*actions, *self._maybe_rolled_back()]

    # ---------------------------------------------------------------- internal

    def _require(self, allowed: Iterable[RolloutState], what: str) -> None:
        if self.state not in set(allowed):
            raise RolloutStateError(f"cannot {what} a rollout that is {self.state.value}")

    def _become(self, state: RolloutState, reason: str) -> list[Action]:
        self.state, self.reason = state, reason
        return [Notify(state, self.wave, reason)]

    def _assign(self, names: Iterable[str], now: float) -> list[Action]:
        actions: list[Action] = []
        for n in names:
            d = self.devices[n]
            if d.status is not DeviceStatus.QUEUED:
                continue
            d.status, d.assigned_at = DeviceStatus.ASSIGNED, now
            d.assigns += 1
            actions.append(Assign(n, self.spec.version))
        return actions

    def _start_wave(self, k: int, now: float) -> list[Action]:
        lo = self.wave_ends[k - 1] if k > 0 else 0
        self.wave, self.wave_started_at = k, now
        new = [n for n in self.order[lo : self.wave_ends[k]] if n not in self.devices]
        for n in new:
            self.devices[n] = _Device(wave=k, status=DeviceStatus.QUEUED)
        self.reason = f"wave {k + 1} of {len(self.wave_ends)}"
        actions: list[Action] = [Notify(self.state, k, self.reason), *self._assign(new, now)]
        on_new = (DeviceStatus.QUEUED, DeviceStatus.ASSIGNED, DeviceStatus.INSTALLED)
        canary = {
            n: d.status is DeviceStatus.INSTALLED
            for n, d in self.devices.items()
            if d.status in on_new
        }
        untouched = [n for n in self.order if n not in self.devices]
        self.health.open(k, now, canary, [untouched, self.outside], self.labels)
        return actions

    def _wave_done(self, now: float) -> bool:
        assert self.wave_started_at is not None
        if now - self.wave_started_at < self.spec.soak_s:
            return False
        members = [self.devices[n] for n in self.wave_devices(self.wave)]
        reported = sum(d.status in _FINAL for d in members)
        if reported < min(self.spec.min_reports, len(members)):
            return False
        return self.health.ready

    def _check_gates(self) -> list[Action]:
        """Halt when a gate trips; only while running or paused."""
        if self.state not in (RolloutState.RUNNING, RolloutState.PAUSED):
            return []
        if self.failure_rate > self.spec.max_failure_rate and self.failed > self.waived_failures:
            return self._become(
                RolloutState.HALTED,
                f"failure rate {self.failed}/{len(self.devices)} above "
                f"{self.spec.max_failure_rate:g}",
            )
        return []

    def _look(self, now: float) -> list[Action]:
        """The health judgement; at a look it may halt the rollout."""
        if self.state not in (RolloutState.RUNNING, RolloutState.PAUSED):
            return []
        verdict, reason = self.health.look(now)
        if verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
            return self._become(RolloutState.HALTED, reason)
        return []

    def waiting(self, now: float) -> list[str]:
        """Why the current wave has not ended yet, for people (empty: it has not started,
        or nothing holds it)."""
        if self.state is not RolloutState.RUNNING or self.wave_started_at is None:
            return [self.reason] if self.state in (RolloutState.PAUSED, RolloutState.HALTED) else []
        out = []
        left = self.spec.soak_s - (now - self.wave_started_at)
        if left > 0:
            out.append(f"soaking: {left:.0f} s left")
        members = [self.devices[n] for n in self.wave_devices(self.wave)]
        reported = sum(d.status in _FINAL for d in members)
        need = min(self.spec.min_reports, len(members))
        if reported < need:
            out.append(f"reports: {reported} of {need} devices of the wave reported")
        if self.wave == len(self.wave_ends) - 1:
            busy = sum(d.status not in _FINAL for d in self.devices.values())
            if busy:
                out.append(f"{busy} device(s) still updating")
        if why := self.health.waiting(now):
            out.append(why)
        return out

    def _rollback_report(
        self, device: str, d: _Device, state: UpdateState | None, version: int, now: float
    ) -> list[Action]:
        if d.status not in (DeviceStatus.ROLLBACK_ASSIGNED, DeviceStatus.ROLLBACK_FAILED):
            self.ignored_reports += 1
            return []
        back = (state is UpdateState.INSTALLED and version == self.spec.previous_version) or (
            state is UpdateState.ROLLED_BACK
            and version in (self.spec.version, self.spec.previous_version)
        )
        if back:
            d.status = DeviceStatus.ROLLED_BACK
        elif state is UpdateState.FAILED and version == self.spec.previous_version:
            d.status = DeviceStatus.ROLLBACK_FAILED
        else:
            self.ignored_reports += 1
            return []
        d.reported_at = now
        return self._maybe_rolled_back()

    def _maybe_rolled_back(self) -> list[Action]:
        if self.state is not RolloutState.ROLLING_BACK:
            return []
        if all(d.status is DeviceStatus.ROLLED_BACK for d in self.devices.values() if d.assigns):
            return self._become(
                RolloutState.ROLLED_BACK, "every device is back on the previous version"
            )
        return []

    # ----------------------------------------------------------- persistence

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "spec": self.spec.to_dict(),
            "state": self.state.value,
            "wave": self.wave,
            "wave_ends": list(self.wave_ends),
            "order": list(self.order),
            "devices": {
                n: {**asdict(d), "status": d.status.value} for n, d in self.devices.items()
            },
            "wave_started_at": self.wave_started_at,
            "reason": self.reason,
            "labels": self.labels,
            "outside": list(self.outside),
            "health": self.health.to_dict(),
            "waived_failures": self.waived_failures,
            "ignored_reports": self.ignored_reports,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rollout:
        if d.get("format") not in _FORMATS:
            raise ValueError(f"unsupported rollout snapshot format {d.get('format')!r}")
        r = cls(RolloutSpec.from_dict(d["spec"]))
        r.state = RolloutState(d["state"])
        r.wave = int(d["wave"])
        r.wave_ends = [int(x) for x in d["wave_ends"]]
        r.order = list(d["order"])
        r._planned = set(r.order)
        r.devices = {
            n: _Device(**{**rec, "status": DeviceStatus(rec["status"])})
            for n, rec in d["devices"].items()
        }
        r.wave_started_at = d["wave_started_at"]
        r.reason = d["reason"]
        if d["format"] >= 2:
            r.labels = {n: dict(v) for n, v in d["labels"].items()}
            r.outside = list(d["outside"])
            r.health = WaveHealth.from_dict(r.spec, d["health"])
        r.waived_failures = int(d["waived_failures"])
        r.ignored_reports = int(d["ignored_reports"])
        return r

    # ------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first invariant (module docstring) that fails."""
        s = self.state
        if s is RolloutState.PENDING and (self.devices or self.wave != -1):
            raise AssertionError("1: a pending rollout has no devices")
        for n, d in self.devices.items():
            if not 0 <= d.wave <= self.wave:
                raise AssertionError(f"1: {n} is in wave {d.wave}, current {self.wave}")
            if d.assigns > 1 or d.rollback_assigns > 1:
                raise AssertionError(f"2: {n} assigned {d.assigns}/{d.rollback_assigns} times")
            if d.status is DeviceStatus.QUEUED and (
                d.wave != self.wave or s not in (RolloutState.PAUSED, RolloutState.HALTED)
            ):
                raise AssertionError(f"4: {n} queued in wave {d.wave} while {s.value}")
        if self.wave_ends and not 0 <= self.wave < len(self.wave_ends):
            raise AssertionError(f"5: wave {self.wave} outside the plan")
        if s is RolloutState.COMPLETED and any(
            d.status not in _FINAL for d in self.devices.values()
        ):
            raise AssertionError("completed with devices still awaited")
        book = self.health.book
        if book is not None:
            for n in book.members("control"):
                if n in self.devices and self.devices[n].assigns:
                    raise AssertionError(f"8: control device {n} was assigned the new version")
        if s is RolloutState.ROLLED_BACK and any(
            d.status is not DeviceStatus.ROLLED_BACK for d in self.devices.values() if d.assigns
        ):
            raise AssertionError("7: rolled back with devices not back")
