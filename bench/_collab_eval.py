"""Part (a)'s arithmetic: what each router recovers of the edge-to-cloud gap on one dataset.

Pure: it takes a dataset's model outputs (``_collab_data``) and returns
figures, nothing else. Routers: the built-in scores, the learned router
(``LearnedScore`` fitted on each split's calibration rows, target ``gain``,
and ``disagree`` as a label-free variant), ``random`` and ``oracle``.

Two kinds of figure, both pooled over a dataset's splits:

* **exact**: offload exactly the top 20% of each split's test rows by score:
  what a router's ranking is worth when its threshold is perfect;
* **deployed**: the threshold calibrated to the budget on the calibration
  rows (``UncertainCheck.calibrate``), test rows decided one at a time, in
  order, ``frozen`` (``adapt=False``) or adapting (``adapt=True``, the
  default): what a device offloads and answers.

Gap recovered = (accuracy - edge only) / (cloud only - edge only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent import SCORES, LearnedScore, Route, UncertainCheck, to_probabilities

from ._collab_data import Dataset, Trial

__all__ = ["BUILT_IN", "LEARNED", "DatasetFigures", "evaluate"]

BUILT_IN = tuple(SCORES)
LEARNED = ("learned", "learned (disagree)")
_MODES = {"frozen": False, "adapt": True}


@dataclass
class DatasetFigures:
    dataset: Dataset
    budget: float
    edge_accuracy: float
    cloud_accuracy: float
    counts: dict[str, int]
    exact: dict[str, dict[str, float]] = field(default_factory=dict)
    deployed: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    curves: dict[str, np.ndarray] = field(default_factory=dict)  # one-split datasets only

    @property
    def gap(self) -> float:
        return self.cloud_accuracy - self.edge_accuracy

    def share(self, accuracy: float) -> float:
        return (accuracy - self.edge_accuracy) / self.gap if self.gap > 0 else math.nan

    @property
    def best_built_in(self) -> str:
        return max(BUILT_IN, key=lambda s: self.exact[s]["gap_recovered"])


def evaluate(dataset: Dataset, budget: float) -> DatasetFigures:
    kind = dataset.outputs
    edge_right = [t.edge_test.argmax(1) == t.labels_test for t in dataset.trials]
    cloud_right = [t.cloud_test.argmax(1) == t.labels_test for t in dataset.trials]
    er, cr = np.concatenate(edge_right), np.concatenate(cloud_right)
    figures = DatasetFigures(
        dataset,
        budget,
        float(er.mean()),
        float(cr.mean()),
        {
            "edge_errors": int((~er).sum()),
            "fixable": int((~er & cr).sum()),
            "both_wrong": int((~er & ~cr).sum()),
            "cloud_only_wrong": int((er & ~cr).sum()),
        },
    )
    routers = [_score_router(name, kind) for name in BUILT_IN]
    routers += [_learned_router(kind, "gain"), _learned_router(kind, "disagree")]
    for name, scorer, check_score in routers:
        orders, deployed = [], {mode: [] for mode in _MODES}
        for trial in dataset.trials:
            scores, score_fn = scorer(trial), check_score(trial)
            orders.append(np.argsort(-scores, kind="stable"))
            for mode, adapt in _MODES.items():
                deployed[mode].append(_deploy(score_fn, trial, kind, budget, adapt))
        figures.exact[name] = _exact(figures, orders, edge_right, cloud_right)
        figures.deployed[name] = {
            mode: _pooled(figures, masks, edge_right, cloud_right)
            for mode, masks in deployed.items()
        }
    rng = np.random.default_rng(0)
    randoms = [rng.permutation(len(t.labels_test)) for t in dataset.trials]
    figures.exact["random"] = _exact(figures, randoms, edge_right, cloud_right)
    oracles = [
        np.argsort(-(c.astype(int) - e.astype(int)), kind="stable")
        for e, c in zip(edge_right, cloud_right, strict=True)
    ]
    figures.exact["oracle"] = _exact(figures, oracles, edge_right, cloud_right)
    if len(dataset.trials) == 1:
        figures.curves = _curves(dataset.trials[0], kind, edge_right[0], cloud_right[0])
    return figures


# -- routers: (name, scores of a trial's test rows, the score UncertainCheck uses) -----------


def _score_router(name: str, kind: Any) -> tuple[str, Any, Any]:
    fn = SCORES[name]
    return name, (lambda t: fn(to_probabilities(t.edge_test, kind))), (lambda t: name)


def _learned_router(kind: Any, target: str) -> tuple[str, Any, Any]:
    fitted: dict[int, LearnedScore] = {}

    def router(trial: Trial) -> LearnedScore:
        key = id(trial)
        if key not in fitted:
            labels = trial.labels_cal if target == "gain" else None
            fitted[key] = LearnedScore.fit(
                trial.edge_cal, trial.cloud_cal, labels, target=target, outputs=kind
            )  # type: ignore[arg-type]
        return fitted[key]

    name = "learned" if target == "gain" else "learned (disagree)"
    return name, (lambda t: router(t)(to_probabilities(t.edge_test, kind))), router


# -- figures ---------------------------------------------------------------------------------


def _exact(
    figures: DatasetFigures,
    orders: list[np.ndarray],
    edge_right: list[np.ndarray],
    cloud_right: list[np.ndarray],
) -> dict[str, float]:
    """Offload exactly the top ``budget`` share of each split by ``orders``; pooled."""
    masks, caught, errors = [], 0, 0
    for order, e in zip(orders, edge_right, strict=True):
        mask = np.zeros(len(e), bool)
        mask[order[: round(figures.budget * len(e))]] = True
        masks.append(mask)
        caught += int((~e & mask).sum())
        errors += int((~e).sum())
    row = _pooled(figures, masks, edge_right, cloud_right)
    row["edge_errors_caught"] = caught / max(errors, 1)
    return row


def _pooled(
    figures: DatasetFigures,
    masks: list[np.ndarray],
    edge_right: list[np.ndarray],
    cloud_right: list[np.ndarray],
) -> dict[str, float]:
    mask = np.concatenate(masks)
    right = np.where(mask, np.concatenate(cloud_right), np.concatenate(edge_right))
    accuracy = float(right.mean())
    return {
        "offload_rate": float(mask.mean()),
        "accuracy": accuracy,
        "gap_recovered": figures.share(accuracy),
    }


def _deploy(score: Any, trial: Trial, kind: Any, budget: float, adapt: bool) -> np.ndarray:
    """Calibrate on the calibration rows, then decide the test rows one by one, in order."""
    check = UncertainCheck(score, budget=budget, adapt=adapt, outputs=kind)
    check.calibrate(trial.edge_cal)
    edge = trial.edge_test
    cloud = Route.CLOUD
    return np.array(
        [check.decide(check.scores(edge[i : i + 1])).route is cloud for i in range(len(edge))]
    )


def _curves(
    trial: Trial, kind: Any, edge_right: np.ndarray, cloud_right: np.ndarray
) -> dict[str, np.ndarray]:
    from tandem._sweep import accuracy_curve, sweep

    curves = sweep(trial.edge_test, trial.cloud_test, trial.labels_test)
    router = LearnedScore.fit(trial.edge_cal, trial.cloud_cal, trial.labels_cal, outputs=kind)
    order = np.argsort(-router(to_probabilities(trial.edge_test, kind)), kind="stable")
    curves["learned"] = accuracy_curve(order, edge_right, cloud_right)
    return curves
