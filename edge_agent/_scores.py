"""Uncertainty scores of a classifier's output: higher means less sure.

Every score maps one output row to a float where a larger value means the
local answer is more likely wrong, so one rule serves all of them: offload
when the score is above the threshold. Rows that are not probabilities
(any value outside [0, 1] or rows not summing to 1) are treated as logits
and soft-maxed first; pass ``outputs="logits"`` or ``"probabilities"`` to
the policy to skip the guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

__all__ = [
    "SCORES",
    "ScoreFn",
    "entropy",
    "margin",
    "max_probability",
    "resolve_score",
    "to_probabilities",
]

ScoreFn = Callable[[np.ndarray], np.ndarray]
"""Maps outputs [n, classes] to uncertainty scores [n]."""

OutputKind = Literal["auto", "logits", "probabilities"]


def to_probabilities(values: np.ndarray, kind: OutputKind = "auto") -> np.ndarray:
    """Rows of class probabilities, shape [n, classes], as float64."""
    x = np.asarray(values, dtype=np.float64)
    x = x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], -1)
    if kind == "probabilities" or (
        kind == "auto"
        and x.size
        and x.min() >= 0.0
        and x.max() <= 1.0
        and np.allclose(x.sum(axis=1), 1.0, atol=1e-3)
    ):
        return x
    shifted = x - x.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def max_probability(probs: np.ndarray) -> np.ndarray:
    """1 - the top class probability."""
    return 1.0 - probs.max(axis=1)


def margin(probs: np.ndarray) -> np.ndarray:
    """1 - (top probability - runner-up probability)."""
    if probs.shape[1] < 2:
        return np.zeros(probs.shape[0])
    top2 = np.partition(probs, -2, axis=1)[:, -2:]
    return 1.0 - (top2[:, 1] - top2[:, 0])


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy normalized to [0, 1] by log(classes)."""
    k = probs.shape[1]
    if k < 2:
        return np.zeros(probs.shape[0])
    p = np.clip(probs, 1e-12, 1.0)
    return -(p * np.log(p)).sum(axis=1) / np.log(k)


SCORES: dict[str, ScoreFn] = {
    "max_probability": max_probability,
    "margin": margin,
    "entropy": entropy,
}


def resolve_score(score: str | ScoreFn) -> tuple[str, ScoreFn]:
    """A (name, function) pair for a built-in score name or a user callable."""
    if callable(score):
        return getattr(score, "__name__", "custom"), score
    try:
        return score, SCORES[score]
    except KeyError:
        raise ValueError(
            f"unknown score {score!r}; use one of {', '.join(SCORES)} or a callable"
        ) from None
