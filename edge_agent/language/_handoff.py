"""When a text turn moves to the hub mid-turn, under a budget: pure logic, no I/O.

A turn on the device is watched (``TurnWatch``): every generated token's
scores (``_confidence.step_score``) go into a window of the last ``window``
tokens, and once the window is full its uncertainty (``score``: minus the
mean log-probability, one minus the minimum probability, or the mean
entropy) is compared with the threshold. Above it, the turn is handed to
the hub. A turn's **score** is the highest window uncertainty it reached
(its *peak*; a turn shorter than the window has none and stays on the
device), so "this turn is handed off" is "its peak is above the threshold".

The threshold is given (``threshold=``) or held to a **budget**: the share
of turns handed off. ``calibrate(peaks)`` sets it to the (1 - budget)
quantile of the peaks of calibration turns; with ``adapt`` (the default)
it then follows the stream exactly as the tensor path's ``UncertainCheck``
does: the quantile, at a level ``u``, of the last ``history`` peaks,
re-taken every ``refresh_every`` turns, with ``u`` moved by
``step * (budget - handed_off)`` after every turn. A handed-off turn's peak
is only known up to the handoff (it is at least the threshold), which keeps
its side of the quantile; ``u`` absorbs the rest. The threshold a turn is
compared with is the one in force when it started.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._policy import next_level, quantile_threshold
from ._confidence import WINDOW_SCORES, ScoreWindow, StepScore, uncertainty

if TYPE_CHECKING:
    from ._cloud import CloudPlan

__all__ = ["Handoff", "HandoffPolicy", "TurnWatch", "turn_peak"]


def turn_peak(steps: Sequence[StepScore], score: str, window: int) -> float | None:
    """The highest uncertainty ``score`` of any full ``window`` of ``steps``, or ``None``
    for a turn shorter than the window (what ``TurnWatch.peak`` ends with, unhanded)."""
    watch = ScoreWindow(window)
    peak: float | None = None
    for step in steps:
        watch.push(step)
        if watch.full:
            value = uncertainty(watch.stats(), score)
            peak = value if peak is None else max(peak, value)
    return peak


class HandoffPolicy:
    """Hand a text turn to the hub when the device's window score crosses a threshold.

    Give ``threshold`` or ``budget`` (the share of turns handed off, in [0, 1], then
    ``calibrate`` on the peaks of calibration turns); ``score`` is one of
    ``mean_logprob``, ``min_prob``, ``mean_entropy``; ``window`` the tokens scored together.
    """

    def __init__(
        self,
        score: str = "mean_logprob",
        *,
        window: int = 8,
        threshold: float | None = None,
        budget: float | None = None,
        adapt: bool = True,
        history: int = 256,
        refresh_every: int = 16,
        step: float = 0.02,
    ) -> None:
        if score not in WINDOW_SCORES:
            raise ValueError(f"unknown window score {score!r}; expected one of {WINDOW_SCORES}")
        if (threshold is None) == (budget is None):
            raise ValueError("give exactly one of threshold= or budget=")
        if budget is not None and not 0.0 <= budget <= 1.0:
            raise ValueError(f"budget must be within [0, 1], got {budget}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if history < 10 or refresh_every < 1:
            raise ValueError("history must be >= 10 and refresh_every >= 1")
        if not 0.0 < step <= 1.0:
            raise ValueError(f"step must be within (0, 1], got {step}")
        self.score = score
        self.window = window
        self.budget = budget
        self.adapt = adapt and budget is not None
        self.refresh_every = refresh_every
        self.step = step
        self._threshold = float(threshold) if threshold is not None else math.inf
        self._calibrated = threshold is not None
        self._level = budget or 0.0
        self._peaks: deque[float] = deque(maxlen=history)
        self._since_refresh = 0
        self._turns = 0
        self._handed = 0
        self._lock = threading.Lock()

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def calibrated(self) -> bool:
        return self._calibrated

    @property
    def level(self) -> float:
        """The quantile level the adapting threshold aims at."""
        return self._level

    @property
    def realized_share(self) -> float | None:
        """Share of the turns recorded so far that were handed off."""
        return None if self._turns == 0 else self._handed / self._turns

    def calibrate(self, peaks: Iterable[float | None]) -> float:
        """Set the threshold from calibration turns' peaks (``None``: too short to score,
        never handed off); returns it. Needs a budget."""
        if self.budget is None:
            raise ValueError("calibrate() needs budget=; this policy has a fixed threshold")
        values = [-math.inf if p is None else float(p) for p in peaks]
        if not values:
            raise ValueError("calibrate() needs at least one turn")
        with self._lock:
            self._peaks.clear()
            self._peaks.extend(values[-(self._peaks.maxlen or 1) :])
            self._since_refresh = 0
            self._level = self.budget
            self._threshold = quantile_threshold(np.asarray(values, dtype=np.float64), self.budget)
            self._calibrated = True
        return self._threshold

    def watch(self, *, observe: bool = True) -> TurnWatch:
        """A watch for one turn, against the threshold in force now; ``observe=False``
        for a turn that may not hand off (calibration): it only measures its peak."""
        return TurnWatch(self, self._threshold if observe else math.inf, observe)

    def record(self, peak: float | None, handed_off: bool) -> None:
        """A turn ended: count it and, with ``adapt``, move the threshold."""
        with self._lock:
            self._turns += 1
            self._handed += int(handed_off)
            if not self.adapt:
                return
            assert self.budget is not None
            self._peaks.append(-math.inf if peak is None else peak)
            self._level = next_level(self._level, self.budget, self.step, handed_off)
            self._since_refresh += 1
            if self._since_refresh < self.refresh_every or len(self._peaks) < 10:
                return
            self._since_refresh = 0
            self._threshold = quantile_threshold(np.fromiter(self._peaks, float), self._level)
            self._calibrated = True


class TurnWatch:
    """One turn's window: ``push`` each generated token's scores; True means hand off now."""

    def __init__(self, policy: HandoffPolicy, threshold: float, observe: bool) -> None:
        self.policy = policy
        self.threshold = threshold
        self._observe = observe
        self._window = ScoreWindow(policy.window)
        self.peak: float | None = None
        self.handed_off = False
        self._ended = False

    def push(self, step: StepScore) -> bool:
        self._window.push(step)
        if not self._window.full:
            return False
        value = uncertainty(self._window.stats(), self.policy.score)
        self.peak = value if self.peak is None else max(self.peak, value)
        return value > self.threshold

    def end(self, handed_off: bool) -> None:
        """The turn ended (``handed_off``: it went to the hub); the second call is a no-op."""
        if self._ended:
            return
        self._ended = True
        self.handed_off = handed_off
        if self._observe:
            self.policy.record(self.peak, handed_off)


@dataclass(frozen=True, slots=True)
class Handoff:
    """A turn's watch, and how to send its rest to the hub (ids, max_tokens, deadline ms);
    ``to_hub`` is ``None`` for a turn that only measures its peak."""

    watch: TurnWatch
    to_hub: Callable[[list[int], int, float | None], CloudPlan] | None
