"""What one wave's health judgement may believe: each device's counters in the window.

Pure: no I/O, no clock (``now`` is the server's receive time of a report).
An ``EvidenceBook`` holds one ``DeviceWindow`` per device of the two cohorts
(``new``: devices the rollout assigned the new version; ``control``: devices
it chose to stay on the previous one), opened when the wave starts (or, for a
device of the wave, when it installs). Only what a device counted *inside*
the window is evidence, so the cohorts are compared over the same time.

A device's telemetry is its own claim; what the book accepts:

- the version: a report counts only if it names the version the rollout
  expects of that device (the new one for a device that reported it
  installed, the previous one for a control device); other claims are
  ignored and counted (``mismatched``), so a device cannot join a cohort by
  saying so;
- the counters: consistent within a report (errors, offloads and compared
  samples at most the requests; agreements at most the compared samples),
  and growing by no more than ``max_rps`` requests a second of the *server's*
  time since the previous report (plus ``grace_s``). A drop of the counters
  is a restart (a new segment; what was counted before is kept); more than
  ``MAX_RESETS`` restarts in one window, or any implausible report, flags the
  device and its window stops counting (``flag`` says why, for the operator).

Invariants: a window's totals never decrease; a flagged window stays flagged
and contributes nothing; a device is in at most one cohort per book.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ._significance import ProportionObs, ValueObs

__all__ = ["COUNTERS", "DeviceWindow", "EvidenceBook"]

COUNTERS = ("requests", "errors", "offloads", "agreement_samples", "agreed")
MAX_RESETS = 3
_ROLES = ("new", "control")


def _counters(report: Mapping[str, Any]) -> list[int] | None:
    out = []
    for name in COUNTERS:
        v = report.get(name, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return None
        out.append(v)
    return out


def _inconsistent(c: list[int]) -> str:
    requests, errors, offloads, compared, agreed = c
    if max(errors, offloads, compared) > requests:
        return "counters inconsistent: errors, offloads or compared samples above requests"
    if agreed > compared:
        return "counters inconsistent: agreements above compared samples"
    return ""


@dataclass
class DeviceWindow:
    """One device's counted evidence in the window (see the module docstring)."""

    role: str  # "new" or "control"
    version: int  # the version its reports must name
    opened_at: float | None = None  # None: not installed yet (a device of the current wave)
    from_zero: bool = False  # its counters started at 0 when the window opened (an install)
    base: list[int] | None = None
    last: list[int] | None = None
    acc: list[int] = field(default_factory=lambda: [0] * len(COUNTERS))
    last_at: float | None = None
    p99_ms: float | None = None
    resets: int = 0
    reports: int = 0
    mismatched: int = 0
    flag: str = ""

    def totals(self) -> list[int]:
        if self.flag or self.last is None or self.base is None:
            return [0] * len(COUNTERS)
        return [a + x - b for a, x, b in zip(self.acc, self.last, self.base, strict=True)]

    def observe(
        self, report: Mapping[str, Any], now: float, *, max_rps: float, grace_s: float
    ) -> None:
        if self.flag or self.opened_at is None:
            return
        if report.get("version") != self.version:
            self.mismatched += 1
            return
        c = _counters(report)
        if c is None:
            self.flag = "counters malformed"
            return
        if why := _inconsistent(c):
            self.flag = why
            return
        if self.last is None:
            self.base = [0] * len(COUNTERS) if self.from_zero else list(c)
            since, grown = self.opened_at, c[0] if self.from_zero else 0
        elif any(x < y for x, y in zip(c, self.last, strict=True)):
            assert self.base is not None and self.last_at is not None
            self.resets += 1
            if self.resets > MAX_RESETS:
                self.flag = f"counters went back {self.resets} times in one window"
                return
            self.acc = [a + x - b for a, x, b in zip(self.acc, self.last, self.base, strict=True)]
            self.base = [0] * len(COUNTERS)
            since, grown = self.last_at, c[0]
        else:
            assert self.last_at is not None
            since, grown = self.last_at, c[0] - self.last[0]
        allowed = max_rps * (max(0.0, now - since) + grace_s)
        if grown > allowed:
            self.flag = f"implausible: {grown} requests in {max(0.0, now - since):.1f} s"
            return
        self.last, self.last_at, self.reports = c, now, self.reports + 1
        p99 = report.get("p99_ms")
        self.p99_ms = float(p99) if isinstance(p99, int | float) and p99 > 0 else None


class EvidenceBook:
    """The windows of one wave's cohorts, by device."""

    def __init__(self, opened_at: float, *, max_rps: float, grace_s: float = 5.0) -> None:
        self.opened_at = opened_at
        self.max_rps, self.grace_s = max_rps, grace_s
        self.windows: dict[str, DeviceWindow] = {}

    def add(
        self, device: str, role: str, version: int, *, opened_at: float | None, from_zero: bool
    ) -> None:
        if role not in _ROLES:
            raise ValueError(f"a cohort is 'new' or 'control', not {role!r}")
        if device in self.windows:
            return  # one cohort per device and book
        self.windows[device] = DeviceWindow(
            role=role, version=version, opened_at=opened_at, from_zero=from_zero
        )

    def installed(self, device: str, now: float) -> None:
        """A device of the new cohort installed: its window opens, counting from zero."""
        w = self.windows.get(device)
        if w is not None and w.role == "new" and w.opened_at is None:
            w.opened_at, w.from_zero = now, True

    def drop(self, device: str) -> None:
        self.windows.pop(device, None)

    def observe(self, device: str, report: Mapping[str, Any], now: float) -> None:
        w = self.windows.get(device)
        if w is not None:
            w.observe(report, now, max_rps=self.max_rps, grace_s=self.grace_s)

    def members(self, role: str) -> list[str]:
        return [d for d, w in self.windows.items() if w.role == role]

    def proportions(self, role: str, k: str, n: str) -> list[ProportionObs]:
        ki, ni = COUNTERS.index(k), COUNTERS.index(n)
        out = []
        for device, w in self._counted(role):
            t = w.totals()
            if t[ni] > 0:
                out.append(ProportionObs(device, t[ki], t[ni]))
        return out

    def values(self, role: str) -> list[ValueObs]:
        return [
            ValueObs(device, w.p99_ms)
            for device, w in self._counted(role)
            if w.p99_ms is not None and w.totals()[0] > 0
        ]

    def flagged(self) -> dict[str, str]:
        return {d: w.flag for d, w in sorted(self.windows.items()) if w.flag}

    def mismatched(self) -> int:
        return sum(w.mismatched for w in self.windows.values())

    def _counted(self, role: str) -> Iterable[tuple[str, DeviceWindow]]:
        return ((d, w) for d, w in self.windows.items() if w.role == role and not w.flag)

    def to_dict(self) -> dict[str, Any]:
        return {
            "opened_at": self.opened_at,
            "max_rps": self.max_rps,
            "grace_s": self.grace_s,
            "windows": {d: asdict(w) for d, w in self.windows.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvidenceBook:
        book = cls(float(d["opened_at"]), max_rps=float(d["max_rps"]), grace_s=float(d["grace_s"]))
        book.windows = {dev: DeviceWindow(**w) for dev, w in d["windows"].items()}
        return book
