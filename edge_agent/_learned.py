"""A learned router: how likely offloading a request changes its answer, from the edge output.

``LearnedScore`` is a logistic regression over a handful of features of the
edge model's output (one minus the top probability, one minus the margin,
normalized entropy, the log-ratio of the top two probabilities, and which
class won, as one-hot), plus, optionally, features of the input that an
``input_features`` callable computes (it must be cheap: it runs on every
request). Its score is the logit of "the cloud's answer differs from the
edge's" (``target="disagree"``, needs no labels) or of "the edge is wrong
and the cloud right" (``target="gain"``, needs labels): higher means
offloading helps more, so it plugs into ``UncertainCheck`` like the
built-in scores and is calibrated to a budget the same way.

Training (``fit``) uses numpy only: standardized features, L2-regularized
Newton iterations on the calibration split's edge outputs, cloud outputs and
(for ``gain``) labels. At run time a score is a few numpy calls on the
output row (about 10 µs). ``update`` takes offloaded samples (edge and cloud
answers, no labels) and moves the weights by a few gradient steps on the
disagreement target; those samples are the ones the router chose, so
feeding it only them biases it towards them: mix in a share of random
offloads when updating from a fleet. The weights travel as JSON
(``to_dict``/``from_dict``, ``save``/``load``): never pickled.

Invariants: ``fit`` refuses inputs it cannot learn from (no rows, one
class only, mismatched lengths) with ``ValueError``; a router scores only
outputs with the number of classes it was trained on; scores are finite.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._scores import OutputKind, to_probabilities

__all__ = ["InputFeatures", "LearnedScore", "output_features"]

InputFeatures = Callable[[Mapping[str, np.ndarray]], np.ndarray]
"""Maps a request's named inputs (rows first) to features [rows, f]."""

Target = Literal["disagree", "gain"]

_FORMAT = "tandem.learned-score/1"
_EPS = 1e-12


def output_features(probs: np.ndarray) -> np.ndarray:
    """The router's features of probability rows [n, classes]: [n, 4 + classes]."""
    n, k = probs.shape
    p = np.clip(probs, _EPS, 1.0)
    top2 = np.partition(p, -2, axis=1)[:, -2:] if k >= 2 else np.c_[np.zeros(n), p[:, :1]]
    p1, p2 = top2[:, 1], top2[:, 0]
    entropy = -(p * np.log(p)).sum(axis=1) / math.log(max(k, 2))
    summary = np.stack([1.0 - p1, 1.0 - (p1 - p2), entropy, np.log(p1 / p2)], axis=1)
    winner = np.zeros((n, k))
    winner[np.arange(n), probs.argmax(axis=1)] = 1.0
    return np.concatenate([summary, winner], axis=1)


class LearnedScore:
    """A logistic-regression score (higher: offloading helps more); build with ``fit``."""

    def __init__(
        self,
        weights: np.ndarray,
        bias: float,
        mean: np.ndarray,
        scale: np.ndarray,
        *,
        classes: int,
        target: Target = "disagree",
        input_features: InputFeatures | None = None,
    ) -> None:
        weights = np.asarray(weights, dtype=np.float64).ravel()
        if not (weights.shape == np.shape(mean) == np.shape(scale)):
            raise ValueError("weights, mean and scale must have one value per feature")
        if weights.size < 4 + classes or classes < 1:
            raise ValueError(f"{weights.size} weights cannot score {classes} classes")
        if not (np.all(np.isfinite(weights)) and math.isfinite(bias)):
            raise ValueError("weights and bias must be finite")
        self.weights = weights
        self.bias = float(bias)
        self.mean = np.asarray(mean, dtype=np.float64)
        self.scale = np.where(np.asarray(scale, dtype=np.float64) > 0, scale, 1.0)
        self.classes = classes
        self.target = target
        self.input_features = input_features
        self.__name__ = f"learned:{target}"  # what UncertainCheck reports as its score name

    @property
    def uses_inputs(self) -> bool:
        """Whether scoring needs the request's inputs too (``input_features`` was given)."""
        return self.input_features is not None

    # -- scoring ------------------------------------------------------------------------------

    def features(
        self, probs: np.ndarray, inputs: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        probs = np.asarray(probs, dtype=np.float64)
        if probs.ndim != 2 or probs.shape[1] != self.classes:
            raise ValueError(
                f"this router was trained on {self.classes} classes, got outputs of shape "
                f"{list(probs.shape)}"
            )
        x = output_features(probs)
        if self.input_features is None:
            return x
        if inputs is None:
            raise ValueError("this router scores inputs too: pass them (input_features= given)")
        extra = np.asarray(self.input_features(inputs), dtype=np.float64).reshape(len(x), -1)
        return np.concatenate([x, extra], axis=1)

    def logits(
        self, probs: np.ndarray, inputs: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        z = (self.features(probs, inputs) - self.mean) / self.scale
        if z.shape[1] != self.weights.size:
            raise ValueError(f"{z.shape[1]} features for {self.weights.size} weights")
        return np.nan_to_num(z @ self.weights + self.bias, nan=0.0, posinf=50.0, neginf=-50.0)

    def __call__(self, probs: np.ndarray) -> np.ndarray:
        """Scores of probability rows (a ``ScoreFn``); a router on inputs needs ``logits``."""
        return self.logits(probs)

    def probability(
        self, probs: np.ndarray, inputs: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """P(target) per row: the chance that offloading changes (or fixes) the answer."""
        return 1.0 / (1.0 + np.exp(-self.logits(probs, inputs)))

    # -- training -----------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        edge_outputs: np.ndarray,
        cloud_outputs: np.ndarray,
        labels: np.ndarray | None = None,
        *,
        target: Target | None = None,
        inputs: Mapping[str, np.ndarray] | None = None,
        input_features: InputFeatures | None = None,
        l2: float = 10.0,
        outputs: OutputKind = "auto",
        iterations: int = 25,
    ) -> LearnedScore:
        """Train on a calibration split: edge and cloud outputs [n, classes], labels [n].

        ``target`` defaults to ``"gain"`` with labels and ``"disagree"`` without.
        ``inputs`` (named arrays, rows first) are needed with ``input_features``.
        ``l2`` regularizes the standardized weights (more for fewer rows).
        """
        edge, cloud = _paired(edge_outputs, cloud_outputs, outputs)
        target = target or ("gain" if labels is not None else "disagree")
        y = _target(edge, cloud, labels, target)
        if y.min() == y.max():
            raise ValueError(
                f"every calibration row has the same {target!r} outcome: nothing to learn"
            )
        if l2 <= 0:
            raise ValueError("l2 must be positive")
        k = edge.shape[1]
        x = output_features(edge)
        if input_features is not None:
            if inputs is None:
                raise ValueError("input_features= needs the calibration inputs (inputs=)")
            extra = np.asarray(input_features(inputs), dtype=np.float64).reshape(len(x), -1)
            x = np.concatenate([x, extra], axis=1)
        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        weights, bias = _newton((x - mean) / scale, y, l2, iterations)
        return cls(
            weights,
            bias,
            mean,
            scale,
            classes=k,
            target=target,
            input_features=input_features,
        )

    def update(
        self,
        edge_outputs: np.ndarray,
        cloud_outputs: np.ndarray,
        *,
        inputs: Mapping[str, np.ndarray] | None = None,
        learning_rate: float = 0.05,
        steps: int = 5,
        outputs: OutputKind = "auto",
    ) -> None:
        """Gradient steps towards "the cloud differs" on offloaded samples (no labels)."""
        edge, cloud = _paired(edge_outputs, cloud_outputs, outputs)
        y = _target(edge, cloud, None, "disagree")
        z = (self.features(edge, inputs) - self.mean) / self.scale
        w, b = self.weights.copy(), self.bias
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
            w -= learning_rate * (z.T @ (p - y) / len(y))
            b -= learning_rate * float(np.mean(p - y))
        if np.all(np.isfinite(w)) and math.isfinite(b):  # a bad batch leaves the router as it was
            self.weights, self.bias = w, b

    # -- persistence (JSON, never pickle) ----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "target": self.target,
            "classes": self.classes,
            "uses_inputs": self.uses_inputs,
            "weights": self.weights.tolist(),
            "bias": self.bias,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
        }

    @classmethod
    def from_dict(
        cls, document: Mapping[str, Any], *, input_features: InputFeatures | None = None
    ) -> LearnedScore:
        if document.get("format") != _FORMAT:
            raise ValueError(f"not a learned router document ({_FORMAT} expected)")
        if bool(document.get("uses_inputs")) != (input_features is not None):
            raise ValueError("this router was trained with input features: pass input_features=")
        target = document.get("target")
        if target not in ("disagree", "gain"):
            raise ValueError(f"unknown router target {target!r}")
        return cls(
            np.asarray(document["weights"], dtype=np.float64),
            float(document["bias"]),
            np.asarray(document["mean"], dtype=np.float64),
            np.asarray(document["scale"], dtype=np.float64),
            classes=int(document["classes"]),
            target=target,
            input_features=input_features,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path, *, input_features: InputFeatures | None = None) -> LearnedScore:
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read a learned router from {path}: {e}") from e
        if not isinstance(document, dict):
            raise ValueError(f"{path} does not hold a learned router")
        return cls.from_dict(document, input_features=input_features)


def _paired(
    edge_outputs: np.ndarray, cloud_outputs: np.ndarray, kind: OutputKind
) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' outputs as probability rows, checked to pair up row by row."""
    edge_shape, cloud_shape = np.shape(edge_outputs), np.shape(cloud_outputs)
    if edge_shape != cloud_shape or not edge_shape or edge_shape[0] == 0:
        raise ValueError(
            "need edge and cloud outputs of the same non-empty shape, got "
            f"{list(edge_shape)} and {list(cloud_shape)}"
        )
    return to_probabilities(edge_outputs, kind), to_probabilities(cloud_outputs, kind)


def _target(
    edge: np.ndarray, cloud: np.ndarray, labels: np.ndarray | None, target: Target
) -> np.ndarray:
    edge_answer, cloud_answer = edge.argmax(axis=1), cloud.argmax(axis=1)
    if target == "disagree":
        return (edge_answer != cloud_answer).astype(np.float64)
    if target != "gain":
        raise ValueError(f"target must be 'disagree' or 'gain', got {target!r}")
    if labels is None:
        raise ValueError("target='gain' needs labels")
    y = np.asarray(labels).ravel()
    if y.shape[0] != edge.shape[0]:
        raise ValueError(f"{y.shape[0]} labels for {edge.shape[0]} outputs")
    return ((edge_answer != y) & (cloud_answer == y)).astype(np.float64)


def _newton(z: np.ndarray, y: np.ndarray, l2: float, iterations: int) -> tuple[np.ndarray, float]:
    """L2-regularized logistic regression (the bias unpenalized) by Newton's method."""
    n, f = z.shape
    design = np.concatenate([z, np.ones((n, 1))], axis=1)
    penalty = np.full(f + 1, l2)
    penalty[-1] = 0.0
    w = np.zeros(f + 1)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -50.0, 50.0)))
        gradient = design.T @ (p - y) + penalty * w
        hessian = (design * (p * (1.0 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return w[:-1], float(w[-1])
