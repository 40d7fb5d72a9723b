"""A learned router: how likely offloading a request pays, from the edge output.

``LearnedScore`` is a logistic regression over features of the edge model's
output (``_router_features``: the ``"ranked"`` set by default, top
probabilities, margin, entropy, and which two classes the edge hesitates
between), plus, optionally, features of the input that an
``input_features`` callable computes (it must be cheap: it runs on every
request). Its score is the logit of "the edge is wrong and the cloud right"
(``target="gain"``, needs labels: what a budget should buy) or of "the
cloud's answer differs from the edge's" (``target="disagree"``, needs no
labels): higher means offloading helps more, so it plugs into
``UncertainCheck`` like the built-in scores and is calibrated to a budget
the same way.

Training (``fit``) uses numpy only (``_router_fit``): standardized features,
L2-regularized Newton iterations, the L2 chosen by five-fold cross-validation
inside the rows given (``l2="auto"``). Give it every labelled row the edge
model was not trained on: the calibration split, and, where the edge was
trained by cross-fitting, its out-of-fold predictions on the training rows
(a few hundred calibration rows hold only a few dozen edge errors). At run
time a score is a few numpy calls on the output row (tens of µs).
``update`` takes offloaded samples (edge and cloud answers; labels where
known) and moves the weights by a few gradient steps; those samples are the
ones the router chose, so feeding it only them biases it towards them: mix
in a share of random offloads when updating from a fleet. The weights
travel as JSON (``to_dict``/``from_dict``, ``save``/``load``), never pickled;
documents of the first format (``"basic"`` features) still load.

Invariants: ``fit`` refuses inputs it cannot learn from (no rows, one class
only, mismatched lengths) with ``ValueError``; a router scores only outputs
with the number of classes it was trained on; scores are finite; a document
that is not a router's (not JSON, unknown format, sizes that do not match,
weights that are not finite numbers) raises ``RouterLoadError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shared import atomic_write_bytes

from ._errors import RouterLoadError
from ._router_features import FEATURE_SETS, FeatureSet, feature_count, output_features
from ._router_fit import choose_l2, fit_logistic
from ._scores import OutputKind, to_probabilities

__all__ = ["InputFeatures", "LearnedScore", "output_features"]

InputFeatures = Callable[[Mapping[str, np.ndarray]], np.ndarray]
"""Maps a request's named inputs (rows first) to features [rows, f]."""

Target = Literal["disagree", "gain"]

_FORMAT = "tandem.learned-score/2"
_FORMAT_V1 = "tandem.learned-score/1"  # "basic" features, no "features" field


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
        features: FeatureSet = "basic",
    ) -> None:
        weights = np.asarray(weights, dtype=np.float64).ravel()
        if classes < 1:
            raise ValueError(f"a router scores at least one class, got {classes}")
        if not (weights.shape == np.shape(mean) == np.shape(scale)):
            raise ValueError("weights, mean and scale must have one value per feature")
        own = feature_count(classes, features)
        if weights.size < own or (input_features is None and weights.size != own):
            raise ValueError(
                f"{weights.size} weights cannot score {classes} classes with the "
                f"{features!r} features ({own} of them, plus input features if given)"
            )
        if not (np.all(np.isfinite(weights)) and math.isfinite(bias)):
            raise ValueError("weights and bias must be finite")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale))):
            raise ValueError("mean and scale must be finite")
        if target not in ("disagree", "gain"):
            raise ValueError(f"target must be 'disagree' or 'gain', got {target!r}")
        self.weights = weights
        self.bias = float(bias)
        self.mean = np.asarray(mean, dtype=np.float64)
        self.scale = np.where(np.asarray(scale, dtype=np.float64) > 0, scale, 1.0)
        self.classes = classes
        self.target = target
        self.features_kind: FeatureSet = features
        self.input_features = input_features
        self.l2: float | None = None  # the penalty it was fitted with, when known
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
        x = output_features(probs, self.features_kind)
        if self.input_features is None:
            return x
        if inputs is None:
            raise ValueError("this router scores inputs too: pass them (input_features= given)")
        return np.concatenate([x, _input_columns(self.input_features, inputs, len(x))], axis=1)

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
        features: FeatureSet = "ranked",
        l2: float | Literal["auto"] = "auto",
        outputs: OutputKind = "auto",
        iterations: int = 25,
    ) -> LearnedScore:
        """Train on labelled rows the edge never trained on: outputs [n, classes], labels [n].

        ``target`` defaults to ``"gain"`` with labels and ``"disagree"`` without.
        ``inputs`` (named arrays, rows first) are needed with ``input_features``.
        ``l2`` regularizes the standardized weights; ``"auto"`` picks it by
        cross-validation inside these rows. ``features="basic"`` is the
        smaller feature set of the first router format.
        """
        edge, cloud = _paired(edge_outputs, cloud_outputs, outputs)
        target = target or ("gain" if labels is not None else "disagree")
        y = _target(edge, cloud, labels, target)
        if y.min() == y.max():
            raise ValueError(
                f"every calibration row has the same {target!r} outcome: nothing to learn"
            )
        if l2 != "auto" and not (isinstance(l2, int | float) and l2 > 0):
            raise ValueError(f"l2 must be positive or 'auto', got {l2!r}")
        x = output_features(edge, features)
        if input_features is not None:
            if inputs is None:
                raise ValueError("input_features= needs the calibration inputs (inputs=)")
            x = np.concatenate([x, _input_columns(input_features, inputs, len(x))], axis=1)
        penalty = choose_l2(x, y) if l2 == "auto" else float(l2)
        weights, bias, (mean, scale) = fit_logistic(x, y, penalty, iterations=iterations)
        router = cls(
            weights,
            bias,
            mean,
            scale,
            classes=edge.shape[1],
            target=target,
            input_features=input_features,
            features=features,
        )
        router.l2 = penalty
        return router

    def update(
        self,
        edge_outputs: np.ndarray,
        cloud_outputs: np.ndarray,
        labels: np.ndarray | None = None,
        *,
        inputs: Mapping[str, np.ndarray] | None = None,
        learning_rate: float = 0.05,
        steps: int = 5,
        outputs: OutputKind = "auto",
    ) -> None:
        """Gradient steps on offloaded samples, towards what they showed.

        Without labels the target is "the cloud differs" (the cloud's answer
        stands in for the label, so "edge wrong, cloud right" is the same
        thing); with labels (user feedback), the router's own target.
        """
        edge, cloud = _paired(edge_outputs, cloud_outputs, outputs)
        target: Target = self.target if labels is not None else "disagree"
        y = _target(edge, cloud, labels, target)
        z = (self.features(edge, inputs) - self.mean) / self.scale
        w, b = self.weights.copy(), self.bias
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-np.clip(z @ w + b, -50.0, 50.0)))
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
            "features": self.features_kind,
            "input_features": self.weights.size - feature_count(self.classes, self.features_kind),
            "uses_inputs": self.uses_inputs,
            "weights": self.weights.tolist(),
            "bias": self.bias,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "l2": self.l2,
        }

    @classmethod
    def from_dict(
        cls, document: Mapping[str, Any], *, input_features: InputFeatures | None = None
    ) -> LearnedScore:
        """A router from ``to_dict``'s document; ``RouterLoadError`` if it is not one."""
        if not isinstance(document, Mapping):
            raise RouterLoadError(f"a router document is a JSON object, not {type(document)}")
        fmt = document.get("format")
        if fmt not in (_FORMAT, _FORMAT_V1):
            raise RouterLoadError(
                f"not a learned router document ({_FORMAT} or {_FORMAT_V1} expected, got "
                f"{str(fmt)[:60]!r})"
            )
        if bool(document.get("uses_inputs")) != (input_features is not None):
            raise RouterLoadError(
                "this router was trained with input features: pass input_features="
                if document.get("uses_inputs")
                else "this router was trained without input features: do not pass any"
            )
        target = document.get("target")
        if target not in ("disagree", "gain"):
            raise RouterLoadError(f"unknown router target {str(target)[:60]!r}")
        features = document.get("features", "basic") if fmt == _FORMAT else "basic"
        if features not in FEATURE_SETS:
            raise RouterLoadError(f"unknown router feature set {str(features)[:60]!r}")
        classes = document.get("classes")
        if not (isinstance(classes, int) and not isinstance(classes, bool) and classes >= 1):
            raise RouterLoadError(f"classes must be a positive integer, got {classes!r}")
        weights, mean, scale = (_numbers(document, key) for key in ("weights", "mean", "scale"))
        bias = _numbers(document, "bias", scalar=True)
        try:
            router = cls(
                weights,
                float(bias[0]),
                mean,
                scale,
                classes=classes,
                target=target,
                input_features=input_features,
                features=features,
            )
        except ValueError as e:
            raise RouterLoadError(f"not a usable router: {e}") from e
        l2 = document.get("l2")
        router.l2 = float(l2) if isinstance(l2, int | float) and not isinstance(l2, bool) else None
        return router

    def save(self, path: str | Path) -> None:
        """Write ``to_dict``'s document whole or not at all: an agent loading it while it is
        replaced reads the old router or the new one."""
        atomic_write_bytes(path, (json.dumps(self.to_dict()) + "\n").encode())

    @classmethod
    def load(cls, path: str | Path, *, input_features: InputFeatures | None = None) -> LearnedScore:
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError too
            raise RouterLoadError(f"cannot read a learned router from {path}: {e}") from e
        if not isinstance(document, dict):
            raise RouterLoadError(f"{path} does not hold a learned router")
        return cls.from_dict(document, input_features=input_features)


def _numbers(document: Mapping[str, Any], key: str, *, scalar: bool = False) -> np.ndarray:
    """A document's list (or number) of finite numbers as float64; RouterLoadError if not."""
    value = document.get(key)
    items = [value] if scalar else value
    if not isinstance(items, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in items
    ):
        kind = "a number" if scalar else "a list of numbers"
        raise RouterLoadError(f"router field {key!r} must be {kind}")
    array = np.asarray(items, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise RouterLoadError(f"router field {key!r} holds a value that is not finite")
    return array


def _input_columns(
    input_features: InputFeatures, inputs: Mapping[str, np.ndarray], rows: int
) -> np.ndarray:
    extra = np.asarray(input_features(inputs), dtype=np.float64)
    if extra.ndim == 0 or extra.shape[0] != rows:
        raise ValueError(
            f"input_features returned shape {list(extra.shape)} for {rows} rows: one row per "
            "request row expected"
        )
    return extra.reshape(rows, -1)


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
