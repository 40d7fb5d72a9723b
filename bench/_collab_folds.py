"""More rows for the learned router: out-of-fold outputs on each split's training rows.

A calibration split of 114-500 rows holds 8-25 edge errors: too few to learn
which outputs hide an error. The training rows are many more, but the edge
model has seen them (the demo's INT8 CNN is right on 99.2% of its training
digits against 94.7% of the test digits), so its outputs there say little.
Cross-fitting gives honest rows: the edge recipe is retrained on four fifths
of the training rows and run on the fifth it did not see, five times, so
every training row gets an output from a model that never trained on it.
The test rows are never touched.

* scikit-learn sets: ``cross_val_predict`` of both recipes (5 stratified folds);
* MNIST: the demo's edge recipe (``tandem.demo.models``) retrained in torch, in
  float (the deployed edge is its INT8 export, which answers as the float
  model does on nearly every row), a few seconds on a CPU; the cloud's
  outputs on these rows are its in-sample ones (the ``gain`` target needs
  the cloud's answer; it is right on 99.3% of them).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FOLDS", "RouterRows", "mnist_out_of_fold", "sklearn_out_of_fold"]

FOLDS = 5


@dataclasses.dataclass(frozen=True, eq=False)
class RouterRows:
    """Labelled rows the edge did not train on, beyond the calibration split."""

    edge: np.ndarray  # [n, classes], as the edge emits them
    cloud: np.ndarray
    labels: np.ndarray
    inputs: np.ndarray | None  # [n, features] flat, where the router reads inputs


def sklearn_out_of_fold(
    x: np.ndarray,
    y: np.ndarray,
    *,
    edge: Callable[[], Any],
    cloud: Callable[[], Any],
    edge_columns: slice,
    seed: int,
    one_hot: Callable[[np.ndarray], np.ndarray],
    keep_inputs: bool,
) -> RouterRows:
    """Both recipes cross-fitted on (x, y), a split's training rows."""
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    folds = StratifiedKFold(FOLDS, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter, as in the main fits
        edge_out = cross_val_predict(
            edge(), x[:, edge_columns], y, cv=folds, method="predict_proba"
        )
        cloud_out = cross_val_predict(cloud(), x, y, cv=folds)
    return RouterRows(edge_out, one_hot(cloud_out), y, x if keep_inputs else None)


def mnist_out_of_fold(splits: Any, cloud_outputs: np.ndarray) -> RouterRows:
    """The demo's edge recipe cross-fitted on the MNIST training digits (logits)."""
    import torch

    from tandem.demo.models import TrainingRecipe, edge_net, train_net

    recipe = TrainingRecipe()
    images, labels = np.asarray(splits.train_images), np.asarray(splits.train_labels)
    fold = np.random.default_rng(recipe.split_seed).permutation(len(labels)) % FOLDS
    out = np.zeros((len(labels), 10), np.float32)
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.set_num_threads(min(4, threads))
        try:
            for k in range(FOLDS):
                held = fold == k
                part = dataclasses.replace(
                    splits, train_images=images[~held], train_labels=labels[~held]
                )
                model = train_net(edge_net, part, recipe, "edge", torch.device("cpu"), _quiet)
                with torch.no_grad():
                    out[held] = model(torch.from_numpy(images[held])).numpy()
        finally:
            torch.set_num_threads(threads)
    return RouterRows(out, cloud_outputs, labels, images.reshape(len(labels), -1))


def _quiet(fraction: float) -> None:
    """Progress of a fold's training: not shown."""
