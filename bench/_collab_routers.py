"""Part (a)'s routers: the built-in scores and the learned router, fitted one recipe for all.

The learned router's recipe was fixed on development streams (the same
recipes with other seeds: four more MNIST model pairs, other splits of the
scikit-learn sets) before it ran on these, and is the same on every stream:

* rows: every labelled row the edge did not train on: the calibration split
  and the out-of-fold rows of the training split (``_collab_folds``);
* features: ``LearnedScore``'s ``"ranked"`` output features, plus, for the
  image streams, ``image_moments`` of the input (ink, centre, spread and slant:
  seven numbers, a few µs);
* target ``gain`` ("the edge is wrong and the cloud right"), L2 chosen by
  cross-validation inside those rows (``l2="auto"``).

The variants show what each part buys: ``learned (disagree)`` (no labels),
``learned (outputs only)`` (no input features), ``learned (calibration rows
only)`` (no out-of-fold rows). ``CEILING`` is not a router: the same recipe
fitted on the test rows it then ranks, an upper bound on what these features
can tell apart on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edge_agent import SCORES, LearnedScore, to_probabilities

from ._collab_data import OutputKind, Trial

__all__ = [
    "BUILT_IN",
    "CEILING",
    "LEARNED",
    "RouterSpec",
    "fit_ceiling",
    "fit_router",
    "image_moments",
    "router_inputs",
]

BUILT_IN = tuple(SCORES)


@dataclass(frozen=True)
class RouterSpec:
    target: str = "gain"
    out_of_fold_rows: bool = True
    input_features: bool = True


LEARNED: dict[str, RouterSpec] = {
    "learned": RouterSpec(),
    "learned (disagree)": RouterSpec(target="disagree"),
    "learned (outputs only)": RouterSpec(input_features=False),
    "learned (calibration rows only)": RouterSpec(out_of_fold_rows=False),
}
CEILING = "learned, fitted on the test rows (a ceiling, not a router)"


def image_moments(inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Seven moments of square grey images, flat rows [n, side * side]: [n, 7].

    Ink (mean intensity), centre (x, y), spread (x, y), covariance, and its
    normalized size (slant): what a digit's shape does to a small model
    beyond its output.
    """
    x = np.asarray(inputs["x"], dtype=np.float64)
    n, d = x.shape
    side = round(float(np.sqrt(d)))
    if side * side != d:
        raise ValueError(f"image_moments needs square images, got rows of {d} values")
    image = x.reshape(n, side, side)
    axis = np.arange(side) / (side - 1) - 0.5
    rows, cols = image.sum(axis=2), image.sum(axis=1)
    mass = rows.sum(axis=1) + 1e-9
    cy, cx = rows @ axis / mass, cols @ axis / mass
    yy, xx = rows @ axis**2 / mass - cy**2, cols @ axis**2 / mass - cx**2
    xy = np.einsum("nij,i,j->n", image, axis, axis) / mass - cx * cy
    slant = np.abs(xy) / np.sqrt(np.maximum(xx * yy, 0.0) + 1e-9)
    return np.stack([mass / d, cx, cy, xx, yy, xy, slant], axis=1)


def router_inputs(rows: np.ndarray | None) -> dict[str, np.ndarray] | None:
    return None if rows is None else {"x": rows}


def fit_router(trial: Trial, kind: OutputKind, spec: RouterSpec) -> LearnedScore:
    """The recipe of the module docstring on one split's rows (never its test rows)."""
    edge, cloud, labels = [trial.edge_cal], [trial.cloud_cal], [trial.labels_cal]
    inputs = [trial.inputs_cal]
    if spec.out_of_fold_rows and trial.folds is not None:
        edge.append(trial.folds.edge)
        cloud.append(trial.folds.cloud)
        labels.append(trial.folds.labels)
        inputs.append(trial.folds.inputs)
    reads_inputs = spec.input_features and all(rows is not None for rows in inputs)
    return LearnedScore.fit(
        np.concatenate([to_probabilities(e, kind) for e in edge]),
        np.concatenate([to_probabilities(c, kind) for c in cloud]),
        np.concatenate(labels) if spec.target == "gain" else None,
        target=spec.target,  # type: ignore[arg-type]
        inputs={"x": np.concatenate(inputs)} if reads_inputs else None,  # type: ignore[arg-type]
        input_features=image_moments if reads_inputs else None,
        outputs="probabilities",
    )


def fit_ceiling(trial: Trial, kind: OutputKind) -> np.ndarray:
    """``learned``'s recipe fitted on the test rows, scoring them: not a router."""
    reads_inputs = trial.inputs_test is not None
    router = LearnedScore.fit(
        trial.edge_test,
        trial.cloud_test,
        trial.labels_test,
        inputs=router_inputs(trial.inputs_test),
        input_features=image_moments if reads_inputs else None,
        outputs=kind,
    )
    return router.logits(to_probabilities(trial.edge_test, kind), router_inputs(trial.inputs_test))
