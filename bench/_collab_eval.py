"""Part (a)'s arithmetic: what each router recovers of the edge-to-cloud gap on one dataset.

Pure: it takes a dataset's model outputs (``_collab_data``) and returns
figures, nothing else. Routers (``_collab_routers``): the built-in scores,
the learned router and its variants (fitted on each split's calibration and
out-of-fold rows, never its test rows), ``random`` and ``oracle``, and the
learned recipe's ceiling (fitted on the test rows themselves).

Two kinds of figure, both pooled over a dataset's splits:

* **exact**: offload exactly the top 20% of each split's test rows by score:
  what a router's ranking is worth when its threshold is perfect;
* **deployed**: the threshold calibrated to the budget on the calibration
  rows (``UncertainCheck.calibrate``), test rows decided one at a time, in
  order, ``frozen`` (``adapt=False``) or adapting (``adapt=True``, the
  default): what a device offloads and answers.

Gap recovered = (accuracy - edge only) / (cloud only - edge only).
``paired_points`` compares two exact routers row by row: the difference in
points of gap and its standard error (the rows where they offload
differently decide it; the test rows are a sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent import SCORES, LearnedScore, Route, UncertainCheck, to_probabilities

from ._collab_data import Dataset, Trial
from ._collab_routers import (
    BUILT_IN,
    CEILING,
    LEARNED,
    fit_ceiling,
    fit_router,
    router_inputs,
)

__all__ = ["BUILT_IN", "CEILING", "DEPLOYED", "LEARNED", "DatasetFigures", "evaluate"]

DEPLOYED = (*BUILT_IN, "learned", "learned (disagree)")
_MODES = {"frozen": False, "adapt": True}


@dataclass
class DatasetFigures:
    dataset: Dataset
    budget: float
    edge_accuracy: float
    cloud_accuracy: float
    counts: dict[str, int]
    edge_right: np.ndarray  # pooled test rows
    cloud_right: np.ndarray
    exact: dict[str, dict[str, float]] = field(default_factory=dict)
    exact_masks: dict[str, np.ndarray] = field(default_factory=dict)  # pooled, per router
    deployed: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    curves: dict[str, np.ndarray] = field(default_factory=dict)  # one-split datasets only
    routers: dict[str, list[LearnedScore]] = field(default_factory=dict)  # per split

    @property
    def gap(self) -> float:
        return self.cloud_accuracy - self.edge_accuracy

    def share(self, accuracy: float) -> float:
        return (accuracy - self.edge_accuracy) / self.gap if self.gap > 0 else math.nan

    @property
    def best_built_in(self) -> str:
        return max(BUILT_IN, key=lambda s: self.exact[s]["gap_recovered"])

    def paired_points(self, a: str, b: str) -> tuple[float, float]:
        """Exact router ``a`` minus ``b`` in points of gap, and the standard error of that."""
        gain = self.cloud_right.astype(float) - self.edge_right.astype(float)
        per_row = (self.exact_masks[a].astype(float) - self.exact_masks[b]) * gain
        gap_rows = self.gap * len(gain)
        if gap_rows <= 0:
            return math.nan, math.nan
        spread = math.sqrt(len(gain) * float(per_row.var()))
        return 100.0 * float(per_row.sum()) / gap_rows, 100.0 * spread / gap_rows


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
        er,
        cr,
    )
    for name in BUILT_IN:
        fn = SCORES[name]
        scores = [fn(to_probabilities(t.edge_test, kind)) for t in dataset.trials]
        _record(figures, name, scores, [name] * len(dataset.trials), edge_right, cloud_right)
    for name, spec in LEARNED.items():
        routers = [fit_router(t, kind, spec) for t in dataset.trials]
        figures.routers[name] = routers
        scores = [_test_scores(r, t, kind) for r, t in zip(routers, dataset.trials, strict=True)]
        _record(figures, name, scores, routers, edge_right, cloud_right)
    ceiling = [fit_ceiling(t, kind) for t in dataset.trials]
    _record(figures, CEILING, ceiling, None, edge_right, cloud_right)
    rng = np.random.default_rng(0)
    randoms = [rng.permutation(len(t.labels_test)) for t in dataset.trials]
    figures.exact["random"] = _exact(figures, randoms, edge_right, cloud_right)
    oracles = [
        np.argsort(-(c.astype(int) - e.astype(int)), kind="stable")
        for e, c in zip(edge_right, cloud_right, strict=True)
    ]
    figures.exact["oracle"] = _exact(figures, oracles, edge_right, cloud_right)
    if len(dataset.trials) == 1:
        figures.curves = _curves(
            dataset.trials[0], kind, figures.routers["learned"][0], edge_right[0], cloud_right[0]
        )
    return figures


def _record(
    figures: DatasetFigures,
    name: str,
    scores: list[np.ndarray],
    check_scores: list[Any] | None,
    edge_right: list[np.ndarray],
    cloud_right: list[np.ndarray],
) -> None:
    """Exact figures from ``scores``; deployed ones where ``name`` is a deployed policy."""
    orders = [np.argsort(-s, kind="stable") for s in scores]
    figures.exact[name] = _exact(figures, orders, edge_right, cloud_right, name=name)
    if check_scores is None or name not in DEPLOYED:
        return
    kind, budget = figures.dataset.outputs, figures.budget
    figures.deployed[name] = {
        mode: _pooled(
            figures,
            [
                _deploy(score, trial, kind, budget, adapt)
                for score, trial in zip(check_scores, figures.dataset.trials, strict=True)
            ],
            edge_right,
            cloud_right,
        )
        for mode, adapt in _MODES.items()
    }


def _test_scores(router: LearnedScore, trial: Trial, kind: Any) -> np.ndarray:
    inputs = router_inputs(trial.inputs_test) if router.uses_inputs else None
    return router.logits(to_probabilities(trial.edge_test, kind), inputs)


# -- figures ---------------------------------------------------------------------------------


def _exact(
    figures: DatasetFigures,
    orders: list[np.ndarray],
    edge_right: list[np.ndarray],
    cloud_right: list[np.ndarray],
    *,
    name: str | None = None,
) -> dict[str, float]:
    """Offload exactly the top ``budget`` share of each split by ``orders``; pooled."""
    masks, caught, errors = [], 0, 0
    for order, e in zip(orders, edge_right, strict=True):
        mask = np.zeros(len(e), bool)
        mask[order[: round(figures.budget * len(e))]] = True
        masks.append(mask)
        caught += int((~e & mask).sum())
        errors += int((~e).sum())
    if name is not None:
        figures.exact_masks[name] = np.concatenate(masks)
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
    reads = check.uses_inputs
    check.calibrate(trial.edge_cal, inputs=router_inputs(trial.inputs_cal) if reads else None)
    edge, rows = trial.edge_test, trial.inputs_test
    cloud = Route.CLOUD
    decided = []
    for i in range(len(edge)):
        inputs = {"x": rows[i : i + 1]} if reads and rows is not None else None
        decided.append(check.decide(check.scores(edge[i : i + 1], inputs)).route is cloud)
    return np.array(decided)


def _curves(
    trial: Trial,
    kind: Any,
    router: LearnedScore,
    edge_right: np.ndarray,
    cloud_right: np.ndarray,
) -> dict[str, np.ndarray]:
    from tandem.demo import accuracy_curve, sweep

    curves = sweep(trial.edge_test, trial.cloud_test, trial.labels_test)
    order = np.argsort(-_test_scores(router, trial, kind), kind="stable")
    curves["learned"] = accuracy_curve(order, edge_right, cloud_right)
    return curves
