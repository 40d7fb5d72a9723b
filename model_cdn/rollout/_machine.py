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
    running | paused | halted ──skip_gate(by, reason)──▶ running   (recorded in ``history``)
    pending | running | paused | halted ──abort()──▶ aborted
    running | paused | halted | completed | aborted ──rollback()──▶ rolling_back ──▶ rolled_back

Gates. The next wave starts on ``tick(now)`` once ``soak_s`` has passed since the
current wave started, at least ``min(min_reports, wave size)`` devices of the
wave reported a final state, the failure gate holds and the enabled health gates
passed. The last wave completes when, in addition, every device of the rollout
has a final state (installed, failed or timed out).

Versions. ``start`` (and ``device_joined``) may say which version each device
runs (``versions``); without it every device is taken to run the spec's
``previous_version`` (the baseline). A device's own version when the rollout
first assigns it the new one is its ``previous``: ``rollback`` sends each
device back to *that* version (devices that ran different versions go back to
different ones), and only devices that ran the baseline can be controls.

Health (``_wave_health``, ``_gates``, ``_significance``). Each wave compares the
devices on the new version with a control cohort the rollout keeps on the
baseline, matched in size and labels, over the same window; telemetry
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
9. A device's ``previous`` is never the new version; ``rollback`` assigns each
   device its own ``previous`` (the baseline where it reported none), and a
   rollback counts as done only on a report of that version (or ``rolled-back``).
10. A device of the control cohort ran the baseline when the rollout learned of
    it (``versions``): the control cohort is never one whose reports cannot count.
11. A wave's health judgement is waived (``waived``) only by ``skip_gate``,
    which is recorded in ``history`` (when, who, why) for that wave;
    ``resume`` never waives it.

Messy input is expected and harmless: reports from devices not in the rollout,
for other versions, duplicates, and reports older than the device's last one
(by ``now``) are ignored; a late report after a timeout replaces the timeout.
``resume`` accepts the failures seen so far (the failure gate trips again only
on a new failure) but not the health data: after a pause the judgement goes
on at its looks; after a health halt (a gate failed, or inconclusive at the
last look) it starts a new round of looks over the same, growing evidence,
so the wave ends only when the gates pass. ``skip_gate`` is the one way past
the health judgement: the current wave's health no longer decides (the next
wave's does), its failures so far are accepted, soak time and minimum
reports still hold, and the rollout runs.

Update reports come in as ``shared.UpdateState`` members and are compared
as members; snapshots hold only this module's own ``StrEnum`` values (plain
JSON strings), so a snapshot written by an older release loads unchanged.

Exceptions (defined in ``model_cdn._errors``, re-exported here)::

    model_cdn.CdnError
    └── RolloutStateError   a command that the current state does not allow
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import UpdateState

from .._errors import RolloutStateError
from ._machine_state import (
    _ACTIVE,
    _FAILED,
    _FINAL,
    DeviceStatus,
    RolloutData,
    RolloutState,
    _Device,
)
from ._significance import Verdict
from ._spec import RolloutSpec, plan_waves

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

_HISTORY = 100  # operator actions kept per rollout


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


def _update_state(state: UpdateState | str) -> UpdateState | None:
    """The member for ``state``; None for a value this build does not know (ignored)."""
    try:
        return UpdateState(state)
    except ValueError:
        return None


def _order_key(spec: RolloutSpec, device: str) -> str:
    # Deterministic but spread out: the first wave is not "the devices whose names sort first".
    return hashlib.sha256(f"{spec.model}/{spec.version}/{device}".encode()).hexdigest()


class Rollout(RolloutData):
    """The state of one rollout; feed it events, carry out the actions it returns."""

    # ----------------------------------------------------------------- queries

    @property
    def failed(self) -> int:
        return sum(d.status in _FAILED for d in self.devices.values())

    @property
    def failure_rate(self) -> float:
        return self.failed / len(self.devices) if self.devices else 0.0

    def return_version(self, device: str) -> int:
        """The version a rollback sends ``device`` to: what it ran before, else the baseline."""
        d = self.devices.get(device)
        if d is not None and d.previous is not None:
            return d.previous
        return self.spec.previous_version

    def control_candidates(self, k: int) -> list[list[str]]:
        """Where wave ``k``'s control cohort comes from, in order: the target's devices
        later waves will take, then those outside the target; only devices on the baseline."""
        base = self.spec.previous_version
        later = self.order[self.wave_ends[k] :] if k < len(self.wave_ends) else []
        untouched = [n for n in later if n not in self.devices]
        return [
            [n for n in pool if self.running.get(n) == base] for pool in (untouched, self.outside)
        ]

    def previous_versions(self) -> dict[int, int]:
        """How many devices assigned the new version go back to which version."""
        out: dict[int, int] = {}
        for n, d in self.devices.items():
            if d.assigns:
                v = self.return_version(n)
                out[v] = out.get(v, 0) + 1
        return dict(sorted(out.items()))

    def note(self, action: str, now: float, *, by: str = "", reason: str = "") -> None:
        """Record an operator's action in ``history`` (the last 100 are kept)."""
        entry = {"at": now, "action": action, "wave": self.wave, "by": by, "reason": reason}
        self.history.append(entry)
        del self.history[:-_HISTORY]

    # ------------------------------------------------------------------ events

    def start(
        self,
        devices: Mapping[str, Mapping[str, str]],
        now: float,
        versions: Mapping[str, int] | None = None,
    ) -> list[Action]:
        """Start wave 0 over the ``devices`` (id → labels) that match the target.

        ``versions``: the version each device runs (absent: not known); None: every
        device runs the baseline. Raises ``ValueError`` when the fleet is empty or a
        wave would hold 0 devices.
        """
        self._require({RolloutState.PENDING}, "start")
        fleet = sorted(
            (n for n, labels in devices.items() if self.spec.matches(labels)),
            key=lambda n: (_order_key(self.spec, n), n),
        )
        self.labels = {n: dict(labels) for n, labels in devices.items()}
        if versions is None:
            self.running = {n: self.spec.previous_version for n in devices}
        else:
            self.running = {n: int(v) for n, v in versions.items() if n in devices}
        self.outside = sorted(n for n in devices if n not in set(fleet))
        self.wave_ends = plan_waves(self.spec, len(fleet))
        self.order = fleet
        self._planned = set(fleet)
        self.state = RolloutState.RUNNING
        return self._start_wave(0, now)

    def device_joined(
        self, device: str, labels: Mapping[str, str], now: float, version: int | None = None
    ) -> list[Action]:
        """A device came online: a new matching one joins the current wave.

        ``version``: the version it runs (None: not known)."""
        if self.state not in _ACTIVE or device in self.devices or device in self._planned:
            return []  # known, or already planned for a later wave
        if device not in self.labels:
            self.labels[device] = dict(labels)
            if version is not None:
                self.running[device] = version
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
        """Leave paused or halted; accepts the failures seen so far, not the health data:
        the judgement goes on (after a health halt, with a new round of looks)."""
        if self.state is RolloutState.RUNNING:
            return []
        self._require({RolloutState.PAUSED, RolloutState.HALTED}, "resume")
        self.waived_failures = self.failed
        rearmed = self.health.resume(now)
        why = "resumed" + (f"; health judged again ({rearmed})" if rearmed else "")
        return self._run_again(why, now)

    def skip_gate(self, now: float, *, by: str, reason: str) -> list[Action]:
        """The operator's explicit override: the current wave's health no longer decides
        and its failures so far are accepted; recorded in ``history``; the rollout runs."""
        self._require(_ACTIVE, "skip the gate of")
        if not reason.strip():
            raise ValueError("skipping a gate needs a reason")
        halted = self.state is RolloutState.HALTED
        was = self.reason if halted else (self.health.waiting(now) or self.reason)
        self.note("skip-gate", now, by=by, reason=reason)
        self.history[-1]["gate"] = was
        self.waived_failures = self.failed
        self.health.waive()
        return self._run_again(
            f"gate of wave {self.wave + 1} skipped by {by or '?'}: {reason}", now
        )

    def _run_again(self, why: str, now: float) -> list[Action]:
        actions = self._become(RolloutState.RUNNING, why)
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
            actions.append(Assign(n, self.return_version(n), rollback=True))
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
            ran = self.running.get(n)
            d.previous = ran if ran != self.spec.version else None
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
        self.health.open(k, now, canary, self.control_candidates(k), self.labels)
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
            return self._become(RolloutState.HALTED, self._failure_reason())
        return []

    def _failure_reason(self) -> str:
        """Why the failure gate tripped, and what one failure weighs with this many devices."""
        n, failed, limit = len(self.devices), self.failed, self.spec.max_failure_rate
        halting = math.floor(limit * n + 1e-9) + 1  # the fewest failures above the limit
        return (
            f"failure rate {failed}/{n} = {failed / n:.0%} above max {limit:.0%} "
            "(failed or timed out, over the waves so far; "
            f"with {n} device{'s' if n != 1 else ''}, {halting} "
            f"failure{'s halt' if halting != 1 else ' halts'} it)"
        )

    def _look(self, now: float) -> list[Action]:
        """The health judgement; at a look it may halt the rollout."""
        if self.state not in (RolloutState.RUNNING, RolloutState.PAUSED):
            return []
        verdict, reason = self.health.look(now)
        if verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE):
            return self._become(RolloutState.HALTED, reason)
        return []

    def _rollback_report(
        self, device: str, d: _Device, state: UpdateState | None, version: int, now: float
    ) -> list[Action]:
        if d.status not in (DeviceStatus.ROLLBACK_ASSIGNED, DeviceStatus.ROLLBACK_FAILED):
            self.ignored_reports += 1
            return []
        target = self.return_version(device)
        back = (state is UpdateState.INSTALLED and version == target) or (
            state is UpdateState.ROLLED_BACK and version in (self.spec.version, target)
        )
        if back:
            d.status = DeviceStatus.ROLLED_BACK
        elif state is UpdateState.FAILED and version == target:
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
            versions = self.previous_versions()
            where = ", ".join(f"{n} on version {v}" for v, n in versions.items())
            return self._become(
                RolloutState.ROLLED_BACK,
                "every device is back on the version it ran before"
                + (f" ({where})" if where else ""),
            )
        return []
