"""What a learned router reads from the edge output: two feature sets, pure numpy.

* ``"basic"`` (``[n, 4 + classes]``): one minus the top probability, one
  minus the margin, normalized entropy, the log-ratio of the top two
  probabilities, and which class won (one-hot). Routers saved in the first
  document format use it.
* ``"ranked"`` (``[n, 4 + min(5, classes) + 2 * classes]``): the same, plus
  the top five probabilities' logarithms in decreasing order (how the rest
  of the mass is spread, which the top two do not show) and which class came
  second (one-hot): with the winner, that names the pair of classes the edge
  hesitates between, and some pairs are harder than others.

Invariants: every feature is finite for any probability rows (zeros are
clipped before a logarithm); ties between classes go to the lower index, as
``argmax`` does; a feature set's width depends only on the class count.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

__all__ = ["FEATURE_SETS", "FeatureSet", "feature_count", "output_features"]

FeatureSet = Literal["basic", "ranked"]
FEATURE_SETS: tuple[FeatureSet, ...] = ("basic", "ranked")

_EPS = 1e-12
_TOP = 5  # ranked: how many sorted log-probabilities


def feature_count(classes: int, features: FeatureSet = "basic") -> int:
    """The width of ``output_features`` for rows of ``classes`` probabilities."""
    if features == "basic":
        return 4 + classes
    if features == "ranked":
        return 4 + min(_TOP, classes) + 2 * classes
    raise ValueError(f"unknown feature set {features!r}; choose from {', '.join(FEATURE_SETS)}")


def output_features(probs: np.ndarray, features: FeatureSet = "basic") -> np.ndarray:
    """A router's features of probability rows [n, classes] (see the module docstring)."""
    probs = np.asarray(probs, dtype=np.float64)
    n, k = probs.shape
    width = feature_count(k, features)  # also rejects an unknown feature set
    p = np.clip(probs, _EPS, 1.0)
    # Stable on the negated row: equal probabilities keep index order, as argmax does.
    order = np.argsort(-p, axis=1, kind="stable")
    rows = np.arange(n)
    p1 = p[rows, order[:, 0]]
    p2 = p[rows, order[:, 1]] if k >= 2 else np.full(n, _EPS)
    entropy = -(p * np.log(p)).sum(axis=1) / math.log(max(k, 2))
    out = np.zeros((n, width))
    out[:, 0] = 1.0 - p1
    out[:, 1] = 1.0 - (p1 - p2)
    out[:, 2] = entropy
    out[:, 3] = np.log(p1 / p2)
    if features == "basic":
        out[rows, 4 + order[:, 0]] = 1.0
        return out
    top = min(_TOP, k)
    out[:, 4 : 4 + top] = np.log(p[rows[:, None], order[:, :top]])  # as take_along_axis, µs less
    winner = 4 + top
    out[rows, winner + order[:, 0]] = 1.0
    if k >= 2:
        out[rows, winner + k + order[:, 1]] = 1.0
    return out
