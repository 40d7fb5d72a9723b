"""A learned prompt router: how likely the hub is to do better on a turn, from its prompt.

``PromptRouter`` is a logistic regression over ``PromptScore.features()``
(the device's log-perplexity of the prompt, its length, its highest
surprisal, the entropy after it), fitted exactly as the tensor path's
learned router is (``_router_fit``: standardized features, L2 chosen by
five-fold cross-validation inside the rows given, the bias unpenalized) on
turns whose outcome is known: ``gain > 0`` where the hub's answer was better
than the device's. Its value (the logit) replaces the perplexity as the
prompt score of a ``HandoffPolicy(prompt_router=...)``; the budget's
calibration and adaptation are the same. Pure arithmetic, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._router_fit import choose_l2, fit_logistic
from ._prompt_score import PROMPT_FEATURES, PromptScore

__all__ = ["PromptRouter"]


class PromptRouter:
    """``router(score)``: the logit that the hub does better on the turn (higher: route)."""

    def __init__(
        self,
        weights: Sequence[float] | np.ndarray,
        bias: float,
        mean: Sequence[float] | np.ndarray,
        scale: Sequence[float] | np.ndarray,
    ) -> None:
        self.weights = np.asarray(weights, dtype=np.float64).ravel()
        self.mean = np.asarray(mean, dtype=np.float64).ravel()
        self.scale = np.asarray(scale, dtype=np.float64).ravel()
        width = len(PROMPT_FEATURES)
        if not (self.weights.size == self.mean.size == self.scale.size == width):
            raise ValueError(f"a prompt router has {width} weights, means and scales")
        values = np.concatenate([self.weights, self.mean, self.scale, [bias]])
        if not np.all(np.isfinite(values)) or np.any(self.scale <= 0):
            raise ValueError("weights, bias, mean must be finite and scales positive")
        self.bias = float(bias)
        self.l2: float | None = None

    @classmethod
    def fit(
        cls, scores: Sequence[PromptScore], gains: Sequence[float], *, l2: float | None = None
    ) -> PromptRouter:
        """Fit on turns' prompt scores and the hub's gain on each (``> 0``: the hub did
        better); ``l2`` by cross-validation when not given. ``ValueError`` when every turn
        has the same outcome or the lengths differ."""
        if len(scores) != len(gains) or not scores:
            raise ValueError("give one gain per prompt score, and at least one")
        x = np.asarray([s.features() for s in scores], dtype=np.float64)
        y = (np.asarray(gains, dtype=np.float64) > 0).astype(np.float64)
        if y.min() == y.max():
            raise ValueError("every turn has the same outcome: nothing to learn")
        penalty = choose_l2(x, y) if l2 is None else float(l2)
        weights, bias, (mean, scale) = fit_logistic(x, y, penalty)
        router = cls(weights, bias, mean, scale)
        router.l2 = penalty
        return router

    def __call__(self, score: PromptScore) -> float:
        z = (np.asarray(score.features(), dtype=np.float64) - self.mean) / self.scale
        value = float(z @ self.weights + self.bias)
        return value if math.isfinite(value) else 0.0
