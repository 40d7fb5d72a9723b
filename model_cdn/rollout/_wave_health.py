"""The health judgement of the current wave: its cohorts, its looks, its verdicts.

Pure: no I/O, no clock. The state machine owns one ``WaveHealth`` and calls
``open`` when a wave starts, feeds it install reports and telemetry, and
asks ``look(now)`` on every tick; ``look`` says whether the wave may go on
(``PASS``), must halt (``FAIL``, or inconclusive at the last look), or waits.
What it decided and why stays readable (``judgements``, ``history``) for
``rollout status`` and the console.

States (``state``)::

    off ─ no health gate enabled
    waiting ──look──▶ inconclusive ──look──▶ pass | fail | inconclusive (at the last look)
    waived   ─ the operator skipped the wave's gate: its health no longer decides
    fail | inconclusive (at the last look) ──resume──▶ waiting (a new round of looks)
    no_control ─ no device is left to compare with: the wave is not judged
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._evidence import EvidenceBook
from ._gates import evaluate, judgement_dict, look_times, pick_control
from ._significance import Verdict
from ._spec import RolloutSpec

__all__ = ["WaveHealth"]

_HISTORY = 600  # points kept per rollout, oldest dropped
_DECIDED = ("pass", "waived", "no_control", "off")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.2f}"


def describe(j: Mapping[str, Any]) -> str:
    """One line: estimate, interval, margin, sizes."""
    new, control = j["new"], j["control"]
    sizes = (
        f"{new['devices']} vs {control['devices']} devices, "
        f"{new['samples']:.0f} vs {control['samples']:.0f} samples"
    )
    if j["delta"] is None:
        return f"{j['metric']}: no judgement yet ({j['why']}; {sizes})"
    conf = f"{j['confidence'] * 100:.2f}%".replace(".00%", "%")
    if j["scale"] == "ratio":
        return (
            f"{j['metric']} ratio {j['delta']:.3f}, {conf} interval "
            f"[{j['lower']:.3f}, {j['upper']:.3f}], max {j['margin']:.3f} ({sizes})"
        )
    word = "rise" if j["higher_is_worse"] else "drop"
    return (
        f"{j['metric']} {word} {_pct(j['delta'])} points, {conf} interval "
        f"[{_pct(j['lower'])}, {_pct(j['upper'])}], margin {j['margin'] * 100:.2f} ({sizes})"
    )


class WaveHealth:
    """See the module docstring."""

    def __init__(self, spec: RolloutSpec) -> None:
        self.spec = spec
        self.state = "waiting" if spec.health_gated else "off"
        self.book: EvidenceBook | None = None
        self.looks_done = 0
        self.looks: list[float] = []
        self.judgements: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
        self.next_point = 0.0

    # -- events ----------------------------------------------------------------------------

    def open(
        self,
        wave: int,
        now: float,
        canary: Mapping[str, bool],
        pools: Sequence[Sequence[str]],
        labels: Mapping[str, Mapping[str, str]],
    ) -> None:
        """A wave starts: ``canary`` maps the new cohort's devices to "installed already"."""
        if not self.spec.health_gated:
            return
        s = self.spec
        control = pick_control(
            list(canary), pools, labels, set(s.target), f"{s.model}/{s.version}/{wave}"
        )
        book = EvidenceBook(now, max_rps=s.max_device_rps)
        for device, installed in canary.items():
            opened = now if installed else None
            book.add(device, "new", s.version, opened_at=opened, from_zero=False)
        for device in control:
            book.add(device, "control", s.previous_version, opened_at=now, from_zero=False)
        self.book, self.looks_done, self.judgements = book, 0, []
        self.looks = look_times(s, now)
        self.state = "waiting" if control else "no_control"

    def joined(self, device: str) -> None:
        if self.book is not None:
            self.book.add(device, "new", self.spec.version, opened_at=None, from_zero=False)

    def installed(self, device: str, now: float) -> None:
        if self.book is not None:
            self.book.installed(device, now)

    def failed(self, device: str) -> None:
        if self.book is not None and device in self.book.members("new"):
            self.book.drop(device)

    def telemetry(self, device: str, report: Mapping[str, Any], now: float) -> None:
        if self.book is not None:
            self.book.observe(device, report, now)

    def waive(self) -> None:
        if self.state != "off":
            self.state = "waived"

    def resume(self, now: float) -> str:
        """The operator resumed: a judgement that halted (failed, or inconclusive at its
        last look) starts a new round of looks from ``now`` over the same window; what
        was counted stays. Returns what changed, for the reason ("" when nothing did)."""
        halted = self.state == "fail" or (
            self.state == "inconclusive" and self.looks_done >= len(self.looks)
        )
        if self.book is None or not halted:
            return ""
        self.state, self.looks_done = "waiting", 0
        self.looks = look_times(self.spec, now)
        return f"{len(self.looks)} more looks to {self.looks[-1] - now:g} s"

    # -- decisions -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether health lets the wave end (it passed, or does not decide)."""
        return self.state in _DECIDED

    def look(self, now: float) -> tuple[Verdict | None, str]:
        """Judge the evidence; at a due look, a verdict: FAIL (halt), or INCONCLUSIVE at
        the last look (halt), or PASS; ``None`` while it waits."""
        if self.book is None or self.state in ("off", "waived", "no_control", "fail"):
            return None, ""
        pairs = evaluate(self.spec, self.book)
        self.judgements = [judgement_dict(g, j, self.spec.confidence) for g, j in pairs]
        due = sum(t <= now for t in self.looks)
        decide = due > self.looks_done and self.state != "pass"
        self._record(now, look=due if decide else None)
        if not decide:
            return None, ""
        self.looks_done = due
        failing = [j for j in self.judgements if j["verdict"] == Verdict.FAIL]
        if failing:
            self.state = "fail"
            return Verdict.FAIL, "health gate: " + describe(failing[0])
        if all(j["verdict"] == Verdict.PASS for j in self.judgements):
            self.state = "pass"
            return Verdict.PASS, ""
        self.state = "inconclusive"
        if self.looks_done >= len(self.looks):
            open_ = next(j for j in self.judgements if j["verdict"] != Verdict.PASS)
            return Verdict.INCONCLUSIVE, (
                f"health gate inconclusive after {self.looks_done} looks "
                f"({self.spec.health_max_soak_s:g} s): " + describe(open_)
            )
        return None, ""

    def _record(self, now: float, *, look: int | None) -> None:
        if look is None and now < self.next_point:
            return
        spacing = max(1.0, self.spec.health_max_soak_s / 100)
        self.next_point = now + spacing
        self.history.append(
            {
                "at": now,
                "look": look,
                "metrics": {
                    j["metric"]: [j["delta"], j["lower"], j["upper"], j["verdict"]]
                    for j in self.judgements
                },
            }
        )
        del self.history[:-_HISTORY]

    # -- what people see ------------------------------------------------------------------

    def waiting(self, now: float) -> str:
        """Why health holds the wave, or ""."""
        if self.state in _DECIDED or self.book is None:
            return ""
        if self.state == "fail":
            return "health gate failed"
        nxt = next((t for t in self.looks if t > now), None)
        left = f"; next look in {max(0.0, nxt - now):.0f} s" if nxt is not None else ""
        open_ = [j for j in self.judgements if j["verdict"] != Verdict.PASS]
        what = describe(open_[0]) if open_ else "no judgement yet"
        return f"health inconclusive (look {self.looks_done} of {len(self.looks)}{left}): {what}"

    def view(self) -> dict[str, Any]:
        book = self.book
        return {
            "state": self.state,
            "looks": {"done": self.looks_done, "total": len(self.looks), "at": list(self.looks)},
            "new_devices": len(book.members("new")) if book else 0,
            "control_devices": len(book.members("control")) if book else 0,
            "control": book.members("control") if book else [],
            "flagged": book.flagged() if book else {},
            "mismatched_reports": book.mismatched() if book else 0,
            "judgements": list(self.judgements),
            "history": list(self.history),
        }

    # -- persistence ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "book": self.book.to_dict() if self.book else None,
            "looks_done": self.looks_done,
            "looks": list(self.looks),
            "judgements": self.judgements,
            "history": self.history,
            "next_point": self.next_point,
        }

    @classmethod
    def from_dict(cls, spec: RolloutSpec, d: Mapping[str, Any] | None) -> WaveHealth:
        h = cls(spec)
        if not d:
            return h
        h.state = str(d["state"])
        h.book = EvidenceBook.from_dict(d["book"]) if d.get("book") else None
        h.looks_done = int(d["looks_done"])
        h.looks = [float(t) for t in d["looks"]]
        h.judgements = list(d["judgements"])
        h.history = list(d["history"])
        h.next_point = float(d["next_point"])
        return h
