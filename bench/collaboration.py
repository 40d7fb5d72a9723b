"""(a) Collaboration quality: how much of the edge-to-cloud accuracy gap a budget buys.

Four streams (``_collab_data``): the demo's MNIST with its INT8 / float CNN
pair, scikit-learn's digits and breast-cancer sets with model pairs the
bench trains, and the MNIST test digits rotated (a shifted stream, with the
threshold calibrated on upright digits). Each model runs once over the
calibration and test rows; every router is then offline arithmetic on their
outputs (``_collab_eval``), so the figures are exact, not sampled.

Targets, per dataset, at a 20% budget: the best built-in score recovers at
least 85% of the gap; the learned router (``LearnedScore``, fitted on the
calibration rows) beats the best built-in score by at least 5 points of gap
on average over the datasets; the realized offload rate of the deployed
policy (calibrated threshold, adapting, the default) is within ±2 points of
the budget. The report (``_collab_report``) states each figure beside its
target, and what limits it where missed.
"""

from __future__ import annotations

from typing import Any

from ._collab_eval import evaluate
from ._report import RESULTS_DIR

__all__ = ["run"]

BUDGET = 0.2
_PLOT = "collaboration_accuracy_vs_offload.png"


def run() -> dict[str, Any]:
    from tandem._plot import plot_accuracy_vs_offload

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
    return result(figures, BUDGET, plot=_PLOT)
