"""Sampled drafting for speculative decoding, pure: the draft's ``q``, drawn as the hub tests it.

The hub keeps the output distributed as its own model's (``accept_drafts`` in
``cloud_hub.language``) on one condition: each draft token was drawn from the
very ``q`` it tests against, which is the *compressed* row that travels
(``shared.encode_draft_dists``: the top ids and a uniform rest). So the
device computes its row (``draft_row``: softmax of the device model's logits
at the turn's temperature, then its top-k and top-p), and ``draw`` takes the
token from that row as it decodes on the hub (``SparseDists.sample``). Rows
compress independently, so ``pack`` of the rows kept decodes at the hub to
the rows drawn from. ``q`` need not be the device model's exact sampling
distribution for exactness; only this identity matters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shared import decode_draft_dists, encode_draft_dists

from ._generation import Sampling

__all__ = ["TOP", "draft_row", "draw", "pack"]

TOP = 32  # ids kept per row on the wire


def draft_row(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The device's distribution for its next draft, float32 [vocab], from one step's logits
    (any shape whose last axis is the vocabulary; the last position is read)."""
    row = np.asarray(logits, dtype=np.float64)
    row = row.reshape(-1, row.shape[-1])[-1]
    temperature = float(sampling.temperature or 1.0)
    weights = np.exp((row - row.max()) / temperature)
    if sampling.top_k is not None and sampling.top_k < row.size:
        cut = np.partition(weights, row.size - sampling.top_k)[row.size - sampling.top_k]
        weights[weights < cut] = 0.0
    if sampling.top_p is not None and sampling.top_p < 1.0:
        order = np.argsort(-weights, kind="stable")
        mass = np.cumsum(weights[order]) / weights.sum()
        keep = max(1, int(np.count_nonzero(mass - weights[order] / weights.sum() < sampling.top_p)))
        weights[order[keep:]] = 0.0
    return (weights / weights.sum()).astype(np.float32)


def draw(q: np.ndarray, rng: np.random.Generator) -> int:
    """A token from ``q`` as the hub will decode it (compressed to ``TOP`` ids a row)."""
    row = decode_draft_dists(encode_draft_dists(q[None], top=TOP), k=1, vocab=q.size)
    return row.sample(0, rng)


def pack(rows: Sequence[np.ndarray]) -> bytes:
    """The wire form of the rows the round's drafts were drawn from."""
    return encode_draft_dists(np.stack(rows), top=TOP)
