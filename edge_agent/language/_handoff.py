"""When a text turn moves to the hub mid-turn, under a budget: pure logic, no I/O.

A turn on the device is watched (``TurnWatch``): every generated token's
scores (``_confidence.step_score``) go into a window of the last ``window``
tokens, and once the window is full its uncertainty (``score``: minus the
mean log-probability, one minus the minimum probability, or the mean
entropy) is compared with the threshold. Above it, the turn is handed to
the hub. A turn's **score** is the highest window uncertainty it reached
(its *peak*; a turn shorter than the window has none and stays on the
device), so "this turn is handed off" is "its peak is above the threshold".

Before the first token, the turn's prompt score (``_prompt_score``: the
device model's perplexity of the prompt, read from the turn's own prefill)
may send the whole turn to the hub (``prompt_share`` of the budget, or a
fixed ``prompt_threshold``).

The threshold is given (``threshold=``) or held to a **budget**: the share
of turns handed off (``unit="turns"``), or of generated tokens the hub
serves (``unit="tokens"``; ``_text_budget``), prompt-level routing and the
handoff drawing on the same budget; ``calibrate_traces`` sets both
thresholds from calibration turns (``TurnTrace``, which observe-only turns
leave in ``measured``). ``calibrate(peaks)`` sets it to the (1 - budget)
quantile of the peaks of calibration turns; with ``adapt`` (the default)
it then follows the stream exactly as the tensor path's ``UncertainCheck``
does: the quantile, at a level ``u``, of the last ``history`` peaks,
re-taken every ``refresh_every`` turns, with ``u`` moved by
``step * (budget - served)`` after every turn (``served``: 1 or 0 for a turn,
the hub's share of its tokens in tokens, where ``step`` is scaled by the
turn's length over the mean length, at most 4x, so long turns weigh more;
by default every 4 turns and a step of 0.05, faster than the tensor path's 16
and 0.02: on a few hundred turns of shifted text the slower pace missed a
30% budget by up to 4.6 points, this one by under 2);
the prompt threshold follows its own level the same way, toward
``budget * prompt_share`` (routed turns), on the prompt scores of every turn,
and the window's toward the whole budget (so it makes up for the prompt
part's noise), or stays at 0 when the prompt has all of it. A handed-off turn's peak
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
from typing import TYPE_CHECKING, Any

import numpy as np

from .._policy import next_level, quantile_threshold
from ._confidence import WINDOW_SCORES, ScoreWindow, StepScore, uncertainty
from ._prompt_score import PromptScore, prefill_logits, prompt_score
from ._text_budget import UNITS, Thresholds, TurnTrace, calibrate_thresholds

if TYPE_CHECKING:
    from ._cloud import CloudPlan

__all__ = ["Handoff", "HandoffPolicy", "TurnWatch", "replay", "turn_peak"]


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


def replay(policy: HandoffPolicy, trace: TurnTrace) -> int | None:
    """Run a recorded turn through ``policy`` as a live turn would go, and record it: the
    device tokens out when the hub took over (0: routed on its prompt), ``None``: it stayed
    on the device. The hub is taken to write the rest of the trace's ``tokens``."""
    watch = policy.watch()
    at: int | None = None
    if trace.prompt is not None and watch.decide_prompt(trace.prompt):
        at = 0
    else:
        offset = trace.tokens - len(trace.windows)
        for i, value in enumerate(trace.windows):
            if watch.push_value(value):
                at = offset + i + 1
                break
    hub = 0 if at is None else trace.tokens - at
    watch.end(at is not None, tokens=trace.tokens, hub_tokens=hub)
    return at


class HandoffPolicy:
    """Hand a text turn to the hub when the device's window score crosses a threshold.

    Give ``threshold`` or ``budget`` (the hub's share of ``unit``: ``"turns"`` or
    ``"tokens"``, in [0, 1], then calibrate); ``score`` is one of ``mean_logprob``,
    ``min_prob``, ``mean_entropy``; ``window`` the tokens scored together.
    ``prompt_share`` of the budget goes to routing whole turns on their prompt score
    (``_prompt_score``; with a fixed ``threshold``, give ``prompt_threshold``): its
    log-perplexity, or ``prompt_router(score)`` when given (``PromptRouter``).
    """

    def __init__(
        self,
        score: str = "mean_logprob",
        *,
        window: int = 8,
        threshold: float | None = None,
        budget: float | None = None,
        unit: str = "turns",
        prompt_share: float = 0.0,
        prompt_threshold: float | None = None,
        prompt_router: Callable[[PromptScore], float] | None = None,
        adapt: bool = True,
        history: int = 256,
        refresh_every: int = 4,
        step: float = 0.05,
    ) -> None:
        if score not in WINDOW_SCORES:
            raise ValueError(f"unknown window score {score!r}; expected one of {WINDOW_SCORES}")
        if (threshold is None) == (budget is None):
            raise ValueError("give exactly one of threshold= or budget=")
        if budget is not None and not 0.0 <= budget <= 1.0:
            raise ValueError(f"budget must be within [0, 1], got {budget}")
        if unit not in UNITS:
            raise ValueError(f"unknown budget unit {unit!r}; expected one of {UNITS}")
        if not 0.0 <= prompt_share <= 1.0:
            raise ValueError(f"prompt_share must be within [0, 1], got {prompt_share}")
        if prompt_router is not None and not callable(prompt_router):
            raise ValueError("prompt_router must be callable (a PromptRouter)")
        if prompt_threshold is not None and budget is not None:
            raise ValueError("prompt_threshold= goes with threshold=; a budget calibrates it")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if history < 10 or refresh_every < 1:
            raise ValueError("history must be >= 10 and refresh_every >= 1")
        if not 0.0 < step <= 1.0:
            raise ValueError(f"step must be within (0, 1], got {step}")
        self.score = score
        self.window = window
        self.budget = budget
        self.unit = unit
        self.prompt_share = prompt_share if budget is not None else 0.0
        self.prompt_router = prompt_router
        self.adapt = adapt and budget is not None
        self.refresh_every = refresh_every
        self.step = step
        self._threshold = float(threshold) if threshold is not None else math.inf
        self._prompt_threshold = math.inf if prompt_threshold is None else prompt_threshold
        self._calibrated = threshold is not None
        self._level = (budget or 0.0) * (1.0 - self.prompt_share)
        self._prompt_level = (budget or 0.0) * self.prompt_share
        self._peaks: deque[float] = deque(maxlen=history)
        self._prompts: deque[float] = deque(maxlen=history)
        self._lengths: deque[int] = deque(maxlen=history)
        self.measured: deque[TurnTrace] = deque(maxlen=history)  # observe-only turns
        self._since_refresh = 0
        self._turns = 0
        self._handed = 0
        self._units = 0.0
        self._hub_units = 0.0
        self._lock = threading.Lock()

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def prompt_threshold(self) -> float:
        """A prompt scoring above it sends the turn to the hub whole (inf: never)."""
        return self._prompt_threshold

    @property
    def wants_prompt(self) -> bool:
        """True when a turn's prompt score decides anything."""
        return self.prompt_share > 0 or math.isfinite(self._prompt_threshold)

    @property
    def calibrated(self) -> bool:
        return self._calibrated

    @property
    def level(self) -> float:
        """The quantile level the adapting window threshold aims at."""
        return self._level

    @property
    def prompt_level(self) -> float:
        """The quantile level the adapting prompt threshold aims at."""
        return self._prompt_level

    @property
    def realized_share(self) -> float | None:
        """The hub's share of the ``unit``s recorded so far (turns: those handed off or
        routed; tokens: those the hub generated)."""
        return None if self._units == 0 else self._hub_units / self._units

    def calibrate(self, peaks: Iterable[float | None]) -> float:
        """Set the threshold from calibration turns' peaks (``None``: too short to score,
        never handed off); returns it. Needs a budget of turns and no prompt share
        (else ``calibrate_traces``)."""
        if self.budget is None:
            raise ValueError("calibrate() needs budget=; this policy has a fixed threshold")
        if self.unit != "turns" or self.prompt_share > 0:
            raise ValueError("a budget of tokens or with a prompt share: use calibrate_traces()")
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

    def calibrate_traces(self, traces: Sequence[TurnTrace] | None = None) -> Thresholds:
        """Set both thresholds from calibration turns (``TurnTrace``; by default the
        observe-only turns this policy measured, ``measured``); returns them."""
        if self.budget is None:
            raise ValueError("calibrate_traces() needs budget=; this policy has a threshold")
        traces = list(self.measured if traces is None else traces)
        found = calibrate_thresholds(
            traces, self.budget, prompt_share=self.prompt_share, unit=self.unit
        )
        with self._lock:
            self._threshold, self._prompt_threshold = found.window, found.prompt
            self._level, self._prompt_level = found.window_level, found.prompt_level
            routed = [t.prompt is not None and t.prompt > found.prompt for t in traces]
            self._peaks.clear()
            self._peaks.extend(
                -math.inf if t.peak is None else t.peak
                for t, r in zip(traces, routed, strict=True)
                if not r
            )
            self._prompts.clear()
            self._prompts.extend(t.prompt for t in traces if t.prompt is not None)
            self._lengths.clear()
            self._lengths.extend(t.tokens for t in traces)
            self._since_refresh = 0
            self._calibrated = True
        return found

    def watch(self, *, observe: bool = True) -> TurnWatch:
        """A watch for one turn, against the thresholds in force now; ``observe=False``
        for a turn that may not hand off (calibration): it only measures (``measured``)."""
        if not observe:
            return TurnWatch(self, math.inf, observe, prompt_threshold=math.inf)
        return TurnWatch(self, self._threshold, observe, prompt_threshold=self._prompt_threshold)

    def record(
        self,
        peak: float | None,
        handed_off: bool,
        *,
        prompt: float | None = None,
        routed: bool = False,
        tokens: int | None = None,
        hub_tokens: int | None = None,
    ) -> None:
        """A turn ended: count it and, with ``adapt``, move the thresholds. ``routed``: it
        went to the hub on its ``prompt`` score; ``tokens``/``hub_tokens``: its length
        and the hub's part of it (a budget of tokens needs them; without, a turn is one
        token, handed off or not)."""
        with self._lock:
            hub = float(handed_off or routed)
            if self.unit == "tokens" and tokens is not None and tokens > 0:
                units = float(tokens)
                hub = min(max(float(hub_tokens or 0), 0.0), units) / units
            else:
                units = 1.0
            self._turns += 1
            self._handed += int(handed_off or routed)
            self._units += units
            self._hub_units += hub * units
            if not self.adapt:
                return
            assert self.budget is not None
            self._lengths.append(int(units))
            weight = 1.0
            if self.unit == "tokens":  # a long turn moves the level more than a short one
                weight = min(units * len(self._lengths) / max(sum(self._lengths), 1), 4.0)
            if prompt is not None:
                self._prompts.append(prompt)
            if not routed:
                self._peaks.append(-math.inf if peak is None else peak)
            target = self.budget * self.prompt_share
            self._prompt_level = next_level(
                self._prompt_level, target, self.step * weight, float(routed)
            )
            # The handoff holds the total (it makes up for the prompt part's noise) unless
            # the whole budget is the prompt's: then it never hands off.
            rest, total = self.budget - target, self.budget
            total = total if rest > 0 else 0.0
            self._level = next_level(self._level, total, self.step * weight, hub)
            self._since_refresh += 1
            if self._since_refresh < self.refresh_every:
                return
            self._since_refresh = 0
            if len(self._peaks) >= 10:
                self._threshold = quantile_threshold(np.fromiter(self._peaks, float), self._level)
            if target > 0 and len(self._prompts) >= 10:
                prompts = np.fromiter(self._prompts, float)
                self._prompt_threshold = quantile_threshold(prompts, self._prompt_level)
            self._calibrated = True


class TurnWatch:
    """One turn's watch: ``prompt`` its prompt score once prefilled, then ``push`` each
    generated token's scores; True from either means hand the turn to the hub now."""

    def __init__(
        self,
        policy: HandoffPolicy,
        threshold: float,
        observe: bool,
        *,
        prompt_threshold: float = math.inf,
    ) -> None:
        self.policy = policy
        self.threshold = threshold
        self.prompt_threshold = prompt_threshold
        self._observe = observe
        self._window = ScoreWindow(policy.window)
        self._values: list[float] = []
        self.tokens = 0
        self.peak: float | None = None
        self.prompt_score: PromptScore | None = None
        self._prompt_value: float | None = None
        self.handed_off = False
        self.routed = False
        self._ended = False

    @property
    def wants_prompt(self) -> bool:
        """True when this turn's prompt score is read (to route it, or to measure it)."""
        return not self._observe or self.policy.wants_prompt

    @property
    def prompt_nll(self) -> float | None:
        """The prompt's mean NLL once scored (``None`` without a score)."""
        score = self.prompt_score
        return self._prompt_value if score is None else score.mean_nll if score.tokens else None

    @property
    def prompt_value(self) -> float | None:
        """What the prompt threshold was compared with: the NLL or the router's value."""
        return self._prompt_value

    def prompt(self, score: PromptScore) -> bool:
        """The prompt's score (``_prompt_score``); True: route the whole turn to the hub.
        A prompt with nothing scored (one token) is never routed."""
        self.prompt_score = score
        if score.tokens == 0:
            return False
        router = self.policy.prompt_router
        return self.decide_prompt(score.mean_nll if router is None else router(score))

    def decide_prompt(self, value: float) -> bool:
        """A prompt's score (what ``prompt`` computes); True: route the turn to the hub."""
        self._prompt_value = value
        self.routed = value > self.prompt_threshold
        return self.routed

    def push(self, step: StepScore) -> bool:
        self.tokens += 1
        self._window.push(step)
        if not self._window.full:
            return False
        return self.push_value(uncertainty(self._window.stats(), self.policy.score))

    def push_value(self, value: float) -> bool:
        """A full window's uncertainty (what ``push`` computes); True: hand off now."""
        self._values.append(value)
        self.peak = value if self.peak is None else max(self.peak, value)
        return value > self.threshold

    def trace(self, tokens: int | None = None) -> TurnTrace:
        """What this turn saw, as a calibration turn (``tokens``: its whole length, which
        counts the tokens never scored: the end-of-sequence one, the last one)."""
        prompt = self._prompt_value
        length = max(tokens or 0, self.tokens, len(self._values))
        return TurnTrace(length, tuple(self._values), prompt)

    def end(
        self, handed_off: bool, *, tokens: int | None = None, hub_tokens: int | None = None
    ) -> None:
        """The turn ended (``handed_off``: it went to the hub, mid-turn or on its prompt;
        ``tokens``: its length, ``hub_tokens`` the hub's part); the second call is a no-op."""
        if self._ended:
            return
        self._ended = True
        self.handed_off = handed_off and not self.routed
        if not self._observe:
            if self.tokens or self._prompt_value is not None:  # the device ran it: a trace
                self.policy.measured.append(self.trace(tokens))
            return
        self.policy.record(
            self.peak, self.handed_off, routed=self.routed, prompt=self._prompt_value,
            tokens=tokens, hub_tokens=hub_tokens,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Handoff:
    """A turn's watch, and how to send its rest to the hub (ids, max_tokens, deadline ms);
    ``to_hub`` is ``None`` for a turn that only measures its peak."""

    watch: TurnWatch
    to_hub: Callable[[list[int], int, float | None], CloudPlan] | None

    def prefilled(self, generator: Any, ids: Sequence[int]) -> bool:
        """The turn's prompt ``ids`` were appended to ``generator``: score them when the
        policy reads the score; True: send the whole turn to the hub now."""
        if not self.watch.wants_prompt:
            return False
        due = self.watch.prompt(prompt_score(prefill_logits(generator), ids))
        return due and self.to_hub is not None
