"""(a) Collaboration quality: how much of the edge-to-cloud accuracy gap a budget buys.

Four streams (``_collab_data``): the demo's MNIST with its INT8 / float CNN
pair, scikit-learn's digits and breast-cancer sets with model pairs the
bench trains, and the MNIST test digits rotated (a shifted stream, with the
threshold calibrated on upright digits). Each model runs once over the
calibration and test rows; every router is then offline arithmetic on their
outputs (``_collab_eval``), so the figures are exact, not sampled.

Targets, per dataset, at a 20% budget: the best built-in score recovers at
least 85% of the gap; the learned router (``LearnedScore``, fitted on the
calibration and out-of-fold training rows, ``_collab_routers``) beats the
best built-in score by at least 5 points of gap on average over the
datasets; the realized offload rate of the deployed policy (calibrated
threshold, adapting, the default) is within ±2 points of the budget, and
stays there on each stretch of the drift demo's shifted stream at 20% and
30% (``_collab_drift``). The
report (``_collab_report``) states each figure beside its target, and what
limits it where missed. Beside them, what a score costs on one row
(``router_costs``): the device runs it on every request.
"""

from __future__ import annotations

import functools
import json
import statistics
import timeit
from collections.abc import Callable
from typing import Any

from ._collab_eval import DatasetFigures, evaluate
from ._report import RESULTS_DIR

__all__ = ["router_costs", "run"]

BUDGET = 0.2
_PLOT = "collaboration_accuracy_vs_offload.png"


def run() -> dict[str, Any]:
    from tandem.demo import plot_accuracy_vs_offload

    from ._collab_data import load_datasets
    from ._collab_report import result

    figures = [evaluate(dataset, BUDGET) for dataset in load_datasets()]
    mnist = figures[0]
    deployed = mnist.deployed
    plot_accuracy_vs_offload(
        mnist.curves,
        [
            ("edge only", 0.0, mnist.edge_accuracy),
            ("cloud only", 1.0, mnist.cloud_accuracy),
            (
                "margin, adapting threshold",
                deployed["margin"]["adapt"]["offload_rate"],
                deployed["margin"]["adapt"]["accuracy"],
            ),
            (
                "learned router, adapting threshold",
                deployed["learned"]["adapt"]["offload_rate"],
                deployed["learned"]["adapt"]["accuracy"],
            ),
        ],
        RESULTS_DIR / _PLOT,
        budget=BUDGET,
        title="Accuracy against offload rate (demo MNIST test split, INT8 edge + cloud CNN)",
    )
    from ._collab_drift import drift_rates

    return result(figures, BUDGET, plot=_PLOT, costs=router_costs(mnist), drift=drift_rates())


def router_costs(mnist: DatasetFigures) -> list[dict[str, Any]]:
    """µs per call of each score on one MNIST row: the score alone and the check's path."""
    from edge_agent import SCORES, UncertainCheck, to_probabilities

    trial = mnist.dataset.trials[0]
    row, probs = trial.edge_test[:1], to_probabilities(trial.edge_test[:1], "logits")
    rows = {"x": trial.inputs_test[:1]} if trial.inputs_test is not None else None
    costs = []
    for name in ("margin", "learned (outputs only)", "learned"):
        router = mnist.routers[name][0] if name in mnist.routers else None
        check = UncertainCheck(router or name, budget=BUDGET, outputs="logits")
        inputs = rows if check.uses_inputs else None
        if router is None:
            call: Callable[[], object] = functools.partial(SCORES[name], probs)
        else:
            call = functools.partial(router.logits, probs, inputs)
        costs.append(
            {
                "score": name + (" (+ image moments)" if inputs else ""),
                "call_us": _us_per_call(call),
                "check_us": _us_per_call(functools.partial(check.scores, row, inputs)),
                "weights": router.weights.size if router is not None else 0,
                "json_bytes": len(json.dumps(router.to_dict())) if router is not None else 0,
            }
        )
    return costs


def _us_per_call(call: Callable[[], object], *, number: int = 2000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6
