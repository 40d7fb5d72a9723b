"""``tandem demo --drift``: the fleet's inputs drift, and one learning loop runs unattended.

``Drift`` (the drifted digits), ``MIN_DRIFT_DEVICES`` and ``plot_learning_loop`` are
public for the CLI, bench and tests."""

from ._data import Drift
from ._plot import plot_learning_loop
from ._run import (
    MIN_DRIFT_DEVICES,
    DriftConfig,
    DriftReport,
    run_drift_demo,
)

__all__ = [
    "MIN_DRIFT_DEVICES",
    "Drift",
    "DriftConfig",
    "DriftReport",
    "plot_learning_loop",
    "run_drift_demo",
]
