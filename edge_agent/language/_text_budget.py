"""The hub's share of text, in turns or in generated tokens: pure arithmetic, no I/O.

A budget is the share of **turns** the hub serves (a turn handed off at
any point, or routed to the hub on its prompt, counts one), or the share of
**generated tokens** it serves (a turn of ``n`` tokens handed off after
``j`` device tokens gives ``n - j`` hub tokens; a turn routed on its prompt
gives all ``n``). Prompt-level routing and the mid-turn handoff draw on the
same budget: ``prompt_share`` of it goes to routing on the prompt score,
the rest to handoffs.

``TurnTrace`` is one calibration turn as the device ran it alone: its
prompt score, its window uncertainty after every scored token, and its
length. ``calibrate_thresholds`` finds the prompt threshold that routes
``budget * prompt_share`` of the units, then the window threshold that
brings the total to ``budget`` (the share falls as the threshold rises, so
a bisection over the traces' own values finds it), and the quantile levels
those thresholds sit at, which the policy's adaptation
(``_policy.next_level``, ``_policy.quantile_threshold``) starts from.

Invariants: ``hub_units`` never exceeds the turn's units; the share is a
non-increasing function of either threshold; a budget of 0 gives infinite
thresholds (nothing to the hub).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "UNITS",
    "Thresholds",
    "TurnTrace",
    "calibrate_thresholds",
    "handoff_position",
    "hub_share",
    "hub_units",
]

UNITS = ("turns", "tokens")


@dataclass(frozen=True, slots=True)
class TurnTrace:
    """A turn the device ran alone: ``windows[i]`` is the window uncertainty once
    ``tokens - len(windows) + i + 1`` tokens were out (so the last one is after the last
    scored token); ``prompt`` its prompt score (``None``: not scored)."""

    tokens: int
    windows: tuple[float, ...]
    prompt: float | None = None

    def __post_init__(self) -> None:
        if self.tokens < len(self.windows):
            raise ValueError(f"a turn of {self.tokens} tokens has {len(self.windows)} windows")

    @property
    def peak(self) -> float | None:
        return max(self.windows) if self.windows else None


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What calibration found: the two thresholds and the levels they sit at."""

    prompt: float  # a prompt scoring above it goes to the hub whole
    window: float  # a window scoring above it hands the turn off
    prompt_level: float  # share of the calibration turns routed on the prompt
    window_level: float  # share of the other turns whose peak is above ``window``
    share: float  # the budget share the calibration turns give at these thresholds


def handoff_position(trace: TurnTrace, threshold: float) -> int | None:
    """Device tokens out when the first window above ``threshold`` hands off; ``None``: never."""
    for i, value in enumerate(trace.windows):
        if value > threshold:
            return trace.tokens - len(trace.windows) + i + 1
    return None


def hub_units(
    trace: TurnTrace, prompt_threshold: float, threshold: float, unit: str
) -> tuple[float, float]:
    """``(hub units, units)`` of one turn at these thresholds, in ``unit``."""
    if unit not in UNITS:
        raise ValueError(f"unknown budget unit {unit!r}; expected one of {UNITS}")
    total = 1.0 if unit == "turns" else float(trace.tokens)
    if trace.prompt is not None and trace.prompt > prompt_threshold:
        return total, total
    at = handoff_position(trace, threshold)
    if at is None:
        return 0.0, total
    return (1.0 if unit == "turns" else float(trace.tokens - at)), total


def hub_share(
    traces: Sequence[TurnTrace], prompt_threshold: float, threshold: float, unit: str
) -> float:
    """The share of ``traces``' units the hub serves at these thresholds."""
    pairs = [hub_units(t, prompt_threshold, threshold, unit) for t in traces]
    total = sum(p[1] for p in pairs)
    return sum(p[0] for p in pairs) / total if total > 0 else 0.0


def _closest(candidates: np.ndarray, share: Callable[[float], float], target: float) -> float:
    """The candidate threshold (sorted ascending; share non-increasing) nearest ``target``,
    by bisection: the first candidate whose share is at most the target, or the one before."""
    lo, hi = 0, len(candidates) - 1
    if share(candidates[hi]) > target:
        return float(candidates[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        if share(candidates[mid]) <= target:
            hi = mid
        else:
            lo = mid + 1
    best = float(candidates[lo])
    if lo > 0:
        before = float(candidates[lo - 1])
        if abs(share(before) - target) < abs(share(best) - target):
            return before
    return best


def calibrate_thresholds(
    traces: Sequence[TurnTrace], budget: float, *, prompt_share: float = 0.0, unit: str = "turns"
) -> Thresholds:
    """Thresholds that give ``traces`` a hub share as near ``budget`` as their values allow,
    ``prompt_share`` of it from routing on the prompt score (see the module docstring)."""
    if unit not in UNITS:
        raise ValueError(f"unknown budget unit {unit!r}; expected one of {UNITS}")
    if not traces:
        raise ValueError("calibration needs at least one turn")
    if not 0.0 <= budget <= 1.0 or not 0.0 <= prompt_share <= 1.0:
        raise ValueError("budget and prompt_share must be within [0, 1]")
    inf = math.inf
    prompt_t = inf
    scored = np.array(sorted({t.prompt for t in traces if t.prompt is not None}))
    if budget * prompt_share > 0 and scored.size:
        candidates = np.concatenate([[-inf], scored])
        prompt_t = _closest(
            candidates, lambda c: hub_share(traces, c, inf, unit), budget * prompt_share
        )
    window_t = inf
    rest = [t for t in traces if t.prompt is None or t.prompt <= prompt_t]
    values = np.array(sorted({v for t in rest for v in t.windows}))
    if budget > 0 and values.size:
        candidates = np.concatenate([[-inf], values, [inf]])
        window_t = _closest(candidates, lambda c: hub_share(traces, prompt_t, c, unit), budget)
    routed = [t.prompt is not None and t.prompt > prompt_t for t in traces]
    peaks = [-inf if t.peak is None else t.peak for t in rest]
    return Thresholds(
        prompt=prompt_t,
        window=window_t,
        prompt_level=float(np.mean(routed)),
        window_level=float(np.mean([p > window_t for p in peaks])) if peaks else 0.0,
        share=hub_share(traces, prompt_t, window_t, unit),
    )
