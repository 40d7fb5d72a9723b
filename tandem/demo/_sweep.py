"""Accuracy against offload rate, computed offline from edge and cloud outputs.

Given the edge's and the cloud's outputs on the same samples, offloading a set
S of samples yields accuracy = (edge right outside S + cloud right inside S)/n.
Each curve offloads the k most uncertain samples by one score, for every k;
``random`` offloads in a random order; ``oracle`` offloads first the samples
the edge gets wrong and the cloud gets right (the upper limit of any router).
"""

from __future__ import annotations

import numpy as np

from edge_agent import SCORES, to_probabilities

__all__ = ["accuracy_curve", "sweep"]


def accuracy_curve(
    order: np.ndarray, edge_right: np.ndarray, cloud_right: np.ndarray
) -> np.ndarray:
    """Accuracy after offloading the first k samples of ``order``, for k = 0..n."""
    gain = (cloud_right.astype(int) - edge_right.astype(int))[order]
    return (edge_right.sum() + np.concatenate([[0], np.cumsum(gain)])) / len(edge_right)


def sweep(
    edge_logits: np.ndarray, cloud_logits: np.ndarray, labels: np.ndarray, seed: int = 0
) -> dict[str, np.ndarray]:
    """Curves keyed by name; index k of each is the accuracy at offload rate k/n."""
    edge_right = edge_logits.argmax(axis=1) == labels
    cloud_right = cloud_logits.argmax(axis=1) == labels
    probs = to_probabilities(edge_logits, "logits")
    curves = {
        name: accuracy_curve(np.argsort(-fn(probs), kind="stable"), edge_right, cloud_right)
        for name, fn in SCORES.items()
    }
    rng = np.random.default_rng(seed)
    curves["random"] = accuracy_curve(rng.permutation(len(labels)), edge_right, cloud_right)
    benefit = cloud_right.astype(int) - edge_right.astype(int)
    curves["oracle"] = accuracy_curve(np.argsort(-benefit, kind="stable"), edge_right, cloud_right)
    return curves
