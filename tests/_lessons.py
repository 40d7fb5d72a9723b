"""Collected examples for refine tests, made the way the hub keeps them, without a fleet.

The demo's INT8 edge model and its cloud model answer drifted digits; the
least sure ``budget`` share are "offloaded", and of those the rows where the
two disagree, plus every ``sample_every``-th of the rest, are written as
shards with ``shared.write_shard``, as the hub's collector writes them.
(``tests/test_learning_loop.py`` runs the real path: agents, broker, hub.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from shared import EdgeAnswer, ExampleRows, input_digests, top_classes
from shared.server import write_shard
from shared.server.store import BlobStore

__all__ = ["collect_offline", "logits_of"]


def logits_of(model: Path | bytes, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {session.get_inputs()[0].name: images})[0]


def _margin(logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    top = np.sort(p, axis=1)
    return 1.0 - (top[:, -1] - top[:, -2])


def collect_offline(
    store: BlobStore,
    edge: Path,
    cloud: Path,
    images: np.ndarray,
    *,
    budget: float = 0.2,
    sample_every: int = 10,
    keep_inputs: bool = True,
    shard_rows: int = 200,
) -> int:
    """Write shards of what a hub would keep from ``images``; the number of rows kept."""
    edge_out, cloud_out = logits_of(edge, images), logits_of(cloud, images)
    uncertain = _margin(edge_out)
    offloaded = np.flatnonzero(uncertain > np.quantile(uncertain, 1.0 - budget))
    edge_top, cloud_top = top_classes(edge_out), top_classes(cloud_out)
    reasons = {}
    for n, i in enumerate(offloaded):
        if edge_top[i] != cloud_top[i]:
            reasons[int(i)] = "disagree"
        elif n % sample_every == 0:
            reasons[int(i)] = "sample"
    kept = np.array(sorted(reasons))
    for start in range(0, len(kept), shard_rows):
        index = kept[start : start + shard_rows]
        inputs = {"image": images[index]}
        answer = EdgeAnswer(model="mnist-edge@1")
        rows = ExampleRows(
            inputs=inputs if keep_inputs else {},
            input_sha256=input_digests(inputs),
            outputs={"logits": cloud_out[index]},
            cloud_labels=cloud_top[index],
            edge_labels=edge_top[index],
            edge_scores=uncertain[index].astype(np.float32),
            reasons=[reasons[int(i)] for i in index],
            devices=[f"dev-{int(i) % 4}" for i in index],
            edge_models=[str(answer.model)] * len(index),
            cloud_versions=["1"] * len(index),
            times=np.full(len(index), 1.7e9),
        )
        write_shard(store, "mnist", rows, writer="offline", seq=start)
    return len(kept)
