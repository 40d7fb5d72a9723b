"""How sure the device model is of the tokens it generates: pure scores, no I/O.

From one decoding step's logits (the model's raw scores over its vocabulary)
and the token it chose, ``step_score`` gives the token's log-probability, its
probability and the entropy of the step's distribution (in nats), computed
with a numerically stable log-softmax. ``ScoreWindow`` keeps the last ``W``
steps of a turn and summarises them (``WindowStats``): the mean
log-probability, the minimum probability and the mean entropy.
``uncertainty`` turns one of those into a number that grows as the model is
less sure, which the handoff policy (``_handoff``) thresholds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "WINDOW_SCORES",
    "ScoreWindow",
    "StepScore",
    "WindowStats",
    "step_score",
    "uncertainty",
    "window_stats",
]

WINDOW_SCORES = ("mean_logprob", "min_prob", "mean_entropy")


@dataclass(frozen=True, slots=True)
class StepScore:
    """One generated token: its id, log-probability, probability; the step's entropy."""

    token: int
    logprob: float
    prob: float
    entropy: float


@dataclass(frozen=True, slots=True)
class WindowStats:
    """The last ``tokens`` steps of a turn, summarised."""

    tokens: int
    mean_logprob: float
    min_prob: float
    mean_entropy: float


def step_score(logits: np.ndarray, token: int) -> StepScore:
    """Scores of ``token`` chosen from ``logits`` (any shape whose last axis is the
    vocabulary; the last position is read, as ``og.Generator.get_logits`` returns it)."""
    row = np.asarray(logits, dtype=np.float64)
    row = row.reshape(-1, row.shape[-1])[-1] if row.ndim > 1 else row
    if row.ndim != 1 or row.size == 0:
        raise ValueError(f"logits must have a vocabulary axis, got shape {np.shape(logits)}")
    if not 0 <= token < row.size:
        raise ValueError(f"token {token} is outside a vocabulary of {row.size}")
    shifted = row - row.max()
    log_z = float(np.log(np.exp(shifted).sum()))
    log_p = shifted - log_z
    p = np.exp(log_p)
    entropy = float(-(p * log_p).sum())
    return StepScore(int(token), float(log_p[token]), float(p[token]), max(entropy, 0.0))


def window_stats(steps: Sequence[StepScore]) -> WindowStats:
    """Mean log-probability, minimum probability and mean entropy of ``steps``."""
    if not steps:
        raise ValueError("window_stats needs at least one step")
    n = len(steps)
    return WindowStats(
        tokens=n,
        mean_logprob=sum(s.logprob for s in steps) / n,
        min_prob=min(s.prob for s in steps),
        mean_entropy=sum(s.entropy for s in steps) / n,
    )


def uncertainty(stats: WindowStats, score: str) -> float:
    """``score`` of ``stats`` as an uncertainty (higher: less sure): minus the mean
    log-probability, one minus the minimum probability, or the mean entropy."""
    if score == "mean_logprob":
        return -stats.mean_logprob
    if score == "min_prob":
        return 1.0 - stats.min_prob
    if score == "mean_entropy":
        return stats.mean_entropy
    raise ValueError(f"unknown window score {score!r}; expected one of {WINDOW_SCORES}")


class ScoreWindow:
    """The last ``size`` steps of a turn; ``stats`` once it holds at least one."""

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"the window must be an integer >= 1, got {size!r}")
        self.size = size
        self._steps: deque[StepScore] = deque(maxlen=size)

    def push(self, step: StepScore) -> None:
        self._steps.append(step)

    @property
    def full(self) -> bool:
        return len(self._steps) == self.size

    def stats(self) -> WindowStats:
        return window_stats(list(self._steps))
