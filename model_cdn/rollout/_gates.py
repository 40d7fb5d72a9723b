"""The health gates of a wave: which cohorts, when to look, what each metric says.

Pure: no I/O, no clock. The state machine (``_machine``) calls in here:

- ``pick_control``: the control cohort, devices kept on the previous version
  while the wave runs, matched to the new cohort in size and in labels (the
  labels a target does not fix, e.g. ``hw``) where the fleet allows: first
  from the target's devices that later waves will take, then from devices
  outside the target that run the model;
- ``look_times``: the moments a wave's judgement may decide, ``looks`` of
  them from ``soak_s`` (at least 1 s) to the max soak after the wave started,
  spaced geometrically (each gap a constant factor longer than the one
  before: evidence grows with time, so a decision comes at most that factor
  later than the data allowed, early and late alike); each look tests at
  ``(1 - confidence) / looks`` one-sided (Bonferroni over the looks, so
  looking again and again does not buy a false halt or a false pass: the flaw
  of a gate that compares averages at every heartbeat);
- ``evaluate``: one ``Judgement`` per enabled gate from the evidence book.

A wave proceeds once every enabled gate passed at a look, halts at the first
look where one fails, and halts as *inconclusive* after its last look
(Argo Rollouts pauses on inconclusive for a person to decide, as here).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._evidence import EvidenceBook
from ._significance import (
    Judgement,
    StatsConfig,
    judge,
    summarize_proportions,
    summarize_values,
)
from ._spec import RolloutSpec

__all__ = ["GATES", "Gate", "evaluate", "judgement_dict", "look_times", "pick_control"]


@dataclass(frozen=True)
class Gate:
    metric: str
    spec_field: str  # the margin in RolloutSpec; None there: the gate is off
    k: str = ""  # proportion: events …
    n: str = ""  # … out of trials
    higher_is_worse: bool = True
    value: bool = False  # a per-device value (p99 latency), judged as a log ratio

    def margin(self, spec: RolloutSpec) -> float | None:
        m = getattr(spec, self.spec_field)
        if m is None:
            return None
        return math.log(m) if self.value else float(m)


GATES = (
    Gate("agreement", "max_agreement_drop", "agreed", "agreement_samples", False),
    Gate("error_rate", "max_error_rate_increase", "errors", "requests"),
    Gate("offload_rate", "max_offload_rate_increase", "offloads", "requests"),
    Gate("p99_latency", "max_p99_latency_ratio", value=True),
)


def look_times(spec: RolloutSpec, wave_started_at: float) -> list[float]:
    first = max(spec.soak_s, 1.0)
    last = max(first, spec.health_max_soak_s)
    k = spec.looks
    if k == 1 or last <= first:
        return [wave_started_at + first]  # one look: as soon as the wave may end
    ratio = (last / first) ** (1.0 / (k - 1))
    return [wave_started_at + first * ratio**j for j in range(k - 1)] + [wave_started_at + last]


def stats_config(spec: RolloutSpec) -> StatsConfig:
    return StatsConfig(
        alpha=(1.0 - spec.confidence) / spec.looks,
        max_outliers=spec.max_outliers,
        min_samples=spec.min_health_samples,
    )


def evaluate(spec: RolloutSpec, book: EvidenceBook) -> list[tuple[Gate, Judgement]]:
    """The judgement of every enabled gate on the evidence so far."""
    config = stats_config(spec)
    out = []
    for gate in GATES:
        margin = gate.margin(spec)
        if margin is None:
            continue
        if gate.value:
            new = summarize_values(book.values("new"), config)
            control = summarize_values(book.values("control"), config)
        else:
            new = summarize_proportions(book.proportions("new", gate.k, gate.n), config)
            control = summarize_proportions(book.proportions("control", gate.k, gate.n), config)
        j = judge(
            new,
            control,
            margin=margin,
            higher_is_worse=gate.higher_is_worse,
            config=config,
            value=gate.value,
        )
        out.append((gate, j))
    return out


def _shown(gate: Gate, x: float | None) -> float | None:
    """Log ratios become ratios for people; rates stay rates."""
    if x is None:
        return None
    return math.exp(x) if gate.value else x


def judgement_dict(gate: Gate, j: Judgement, confidence: float) -> dict[str, Any]:
    """The JSON form the status view and the console show."""
    new, control = j.new.to_dict(), j.control.to_dict()
    if gate.value:  # mean logs → geometric means, in ms
        for side in (new, control):
            est = side["estimate"]
            side["estimate"] = math.exp(est) if isinstance(est, float) else None
    return {
        "metric": gate.metric,
        "verdict": j.verdict.value,
        "scale": "ratio" if gate.value else "difference",
        "higher_is_worse": gate.higher_is_worse,
        "delta": _shown(gate, j.delta),
        "lower": _shown(gate, j.lower),
        "upper": _shown(gate, j.upper),
        "margin": _shown(gate, j.margin),
        "confidence": 1.0 - j.alpha,
        "overall_confidence": confidence,
        "new": new,
        "control": control,
        "why": j.why,
    }


def _signature(labels: Mapping[str, str], fixed: set[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in fixed))


def _spread(seed: str, device: str) -> str:
    return hashlib.sha256(f"{seed}/{device}".encode()).hexdigest()


def pick_control(
    canary: Sequence[str],
    pools: Sequence[Sequence[str]],
    labels: Mapping[str, Mapping[str, str]],
    fixed: set[str],
    seed: str,
) -> list[str]:
    """As many control devices as ``canary`` holds, label for label where possible.

    ``pools`` are tried in order (the target's untouched devices, then those
    outside it); ``fixed`` are the label names the target fixes (not matched).
    """
    candidates: list[str] = []
    seen: set[str] = set()
    for pool in pools:
        for d in sorted(pool, key=lambda d: (_spread(seed, d), d)):
            if d not in seen:
                seen.add(d)
                candidates.append(d)
    by_kind: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for d in candidates:
        by_kind.setdefault(_signature(labels.get(d, {}), fixed), []).append(d)
    chosen: list[str] = []
    taken: set[str] = set()
    unmatched = 0
    for c in canary:
        kind = by_kind.get(_signature(labels.get(c, {}), fixed), [])
        while kind and kind[0] in taken:
            kind.pop(0)
        if kind:
            d = kind.pop(0)
            chosen.append(d)
            taken.add(d)
        else:
            unmatched += 1
    for d in candidates:  # what labels could not match, size still can
        if unmatched == 0:
            break
        if d not in taken:
            chosen.append(d)
            taken.add(d)
            unmatched -= 1
    return chosen
