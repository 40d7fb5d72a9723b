"""A rollout's data and what is read from it: its fields, snapshot, invariants, why it waits.

Pure. ``RolloutData`` is the base of ``_machine.Rollout`` (whose docstring
lists the states and invariants), which adds the events and commands that
change the data; split so that module stays short, and this one imports
nothing of it (no circle): the states, the device record and the snapshot
format live here, and ``_machine`` imports them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Self

from ._spec import RolloutSpec
from ._wave_health import WaveHealth

__all__ = ["DeviceStatus", "RolloutData", "RolloutState"]

_FORMAT = 3
_FORMATS = (1, 2, 3)  # 1: before cohorts (health dropped); 2: before per-device versions


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


@dataclass
class _Device:
    wave: int
    status: DeviceStatus
    assigned_at: float | None = None
    reported_at: float | None = None
    assigns: int = 0
    rollback_assigns: int = 0
    previous: int | None = None  # the version it ran when first assigned the new one


class RolloutData:
    """One rollout's fields; ``Rollout`` (``_machine``) changes them through its events."""

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
        self.running: dict[str, int] = {}  # the version each device ran when heard of
        self.health = WaveHealth(spec)
        self.waived_failures = -1  # failed count accepted by resume(); -1: none
        self.ignored_reports = 0
        self.history: list[dict[str, Any]] = []  # operator actions: at, action, wave, by, reason

    def wave_devices(self, k: int) -> list[str]:
        return [n for n, d in self.devices.items() if d.wave == k]

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
            if d.previous == self.spec.version:
                raise AssertionError(f"9: {n} would be rolled back to the new version")
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
                if self.running.get(n) != self.spec.previous_version:
                    raise AssertionError(f"10: control device {n} did not run the baseline")
        if self.health.state == "waived" and not any(
            e["action"] == "skip-gate" and e["wave"] == self.wave for e in self.history
        ):
            raise AssertionError(f"11: wave {self.wave}'s health waived without skip_gate")
        if s is RolloutState.ROLLED_BACK and any(
            d.status is not DeviceStatus.ROLLED_BACK for d in self.devices.values() if d.assigns
        ):
            raise AssertionError("7: rolled back with devices not back")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot (``from_dict`` resumes from it exactly)."""
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
            "running": dict(self.running),
            "history": list(self.history),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """The rollout ``to_dict`` saved (a snapshot of an earlier format too)."""
        r = cls(RolloutSpec.from_dict(d["spec"]))
        if d.get("format") not in _FORMATS:
            raise ValueError(f"unsupported rollout snapshot format {d.get('format')!r}")
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
        if d["format"] >= 3:
            r.running = {n: int(v) for n, v in d["running"].items()}
            r.history = [dict(e) for e in d["history"]]
        else:  # what earlier releases assumed: every device ran the baseline
            known = {*r.labels, *r.order, *r.devices}
            r.running = {n: r.spec.previous_version for n in known}
        return r
