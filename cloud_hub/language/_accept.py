"""The hub's side of speculative decoding, pure: which drafted tokens to keep, and the next one.

The device drafts ``k`` tokens ``d_0..d_{k-1}``; the hub runs its model once
over them and has ``k + 1`` rows of logits, row ``i`` predicting the token at
draft position ``i`` (row ``k`` the one after the last draft). ``accept_drafts``
turns those rows into an ``Acceptance``: how many drafts are kept and the
hub's own token that follows them, so that one round always yields
``accepted + 1`` tokens.

- Greedy (``temperature`` <= 0): keep drafts while ``d_i == argmax(row i)``;
  the next token is ``argmax(row accepted)``. The output is token for token
  what the hub alone would have produced greedily.
- Sampling: ``p_i = target_probs(row i)`` (temperature, then top-k, then
  top-p, the way the hub samples a turn); ``d_i`` is kept with probability
  ``min(1, p_i(d_i) / q_i(d_i))`` (Leviathan et al., Chen et al.); at the
  first rejection the next token is drawn from ``normalize(max(0, p_i - q_i))``;
  with every draft kept it is drawn from ``p_k``. Then every emitted token is
  distributed exactly as ``p`` (for any ``q``), on one condition: ``d_i`` was
  drawn from the same ``q_i`` the test and the residual use. Here ``q`` is the
  draft's *compressed* distribution (``shared.SparseDists``: the top ids and a
  uniform rest); the proof never needs ``q`` to be the draft model's true
  distribution, only that the token was drawn from it and that acceptance and
  residual use the same one, so the device drafts from the decoded
  ``SparseDists`` (``SparseDists.sample``) and exactness holds. Why: a token
  ``x`` comes out as a kept draft with probability ``q(x) * min(1, p(x)/q(x)) =
  min(p(x), q(x))``, and as the replacement with probability ``(1 - sum
  min(p, q)) * max(0, p(x) - q(x)) / sum max(0, p - q)``; both sums' complements
  are equal (``sum max(0, p - q) = 1 - sum min(p, q)``), so the total is
  ``min(p, q) + max(0, p - q) = p(x)``. Drafted from another ``q'`` (the
  uncompressed row), the output would be off ``p`` by at most ``2 * |q' - q|_1``
  in L1. A token
  ``q`` gives 0 (it cannot be drawn from ``q``; only a device drafting from the
  uncompressed row sends one) is kept whenever ``p`` gives it mass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared import SparseDists, TextSampling

from .._errors import InvalidRequestError
from ._options import Sampling

__all__ = ["Acceptance", "accept_drafts", "target_probs"]


@dataclass(frozen=True)
class Acceptance:
    """``accepted`` drafts kept (0..k), then the hub's ``next_token``."""

    accepted: int
    next_token: int


def target_probs(
    logits: np.ndarray, *, temperature: float, top_p: float = 1.0, top_k: int | None = None
) -> np.ndarray:
    """One row of logits to the distribution the hub samples from (float64 [vocab]).

    ``temperature`` <= 0: all mass on the argmax (the first on a tie). Else
    softmax(logits / temperature), then the ``top_k`` most probable ids (ties: the
    lower id), then the smallest set of most probable ids whose mass reaches
    ``top_p`` (``top_p`` >= 1 keeps all), renormalized. ``-inf`` logits get 0.
    """
    row = np.asarray(logits, dtype=np.float64)
    if row.ndim != 1 or row.size == 0 or np.any(np.isnan(row)) or np.any(row == np.inf):
        raise InvalidRequestError("logits must be one non-empty row without NaN or +inf")
    top = float(row.max())
    if top == -np.inf:
        raise InvalidRequestError("logits give every token probability 0")
    if temperature <= 0:
        out = np.zeros(row.size)
        out[int(np.argmax(row))] = 1.0
        return out
    weights = np.exp((row - top) / temperature)
    ids = np.arange(row.size)  # the ids still in, most probable first once truncated
    if top_k is not None and top_k < row.size:
        ids = _head(weights, max(1, top_k))[: max(1, top_k)]
    if top_p < 1.0:
        pool = weights[ids]
        total = float(pool.sum())
        m = min(64, ids.size)
        while True:  # sort only the head that the top_p set can reach (exact, see _head)
            order = _head(pool, m)
            before = (np.cumsum(pool[order]) - pool[order]) / total  # mass ahead of each id
            count = max(1, int(np.count_nonzero(before < top_p)))
            if count < order.size or order.size == pool.size:
                break
            m = min(pool.size, m * 4)
        ids = ids[order[:count]]
    out = np.zeros(row.size)
    out[ids] = weights[ids]
    return out / out.sum()


def _head(weights: np.ndarray, m: int) -> np.ndarray:
    """Indices of the ``m`` largest weights and every weight tied with the m-th, sorted.

    Sorted by weight descending, then index ascending: the first entries of a full
    stable sort of ``-weights``, in its order, without sorting the whole row.
    """
    if m >= weights.size:
        head = np.arange(weights.size)
    else:
        threshold = np.partition(weights, weights.size - m)[weights.size - m]
        head = np.flatnonzero(weights >= threshold)
    return head[np.lexsort((head, -weights[head]))]


def _draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn in proportion to ``weights`` (>= 0, some > 0); never a 0-weight one."""
    cumulative = np.cumsum(weights)
    return int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))


def _check(
    target_logits: np.ndarray, drafts: Sequence[int], draft: SparseDists | None, greedy: bool
) -> tuple[np.ndarray, list[int]]:
    logits = np.asarray(target_logits)
    ids = [int(d) for d in drafts]
    k = len(ids)
    if logits.ndim != 2 or logits.shape[0] != k + 1 or logits.shape[1] < 1:
        raise InvalidRequestError(
            f"target logits must be [{k + 1}, vocab] for {k} drafts, got {logits.shape}"
        )
    if logits.dtype.kind != "f" or np.isnan(logits).any() or np.isposinf(logits).any():
        raise InvalidRequestError("target logits must be floats without NaN or +inf")
    vocab = logits.shape[1]
    if any(not 0 <= d < vocab for d in ids):
        raise InvalidRequestError(f"a draft token outside 0..{vocab - 1}")
    if not greedy:
        if draft is None:
            raise InvalidRequestError("sampled speculative decoding needs the draft's q")
        if draft.k != k or draft.vocab != vocab:
            raise InvalidRequestError(
                f"draft distributions are {draft.k} rows over {draft.vocab} ids, "
                f"expected {k} over {vocab}"
            )
    return logits, ids


def accept_drafts(
    target_logits: np.ndarray,
    drafts: Sequence[int],
    draft: SparseDists | None,
    sampling: Sampling | TextSampling,
    rng: np.random.Generator,
    *,
    top_k: int | None = None,
) -> Acceptance:
    """The drafts the hub keeps and its next token (see the module docstring for the rule).

    ``target_logits`` [k+1, vocab], ``drafts`` k ids, ``draft`` their compressed
    distributions (may be None when greedy), ``rng`` the turn's generator (one
    uniform per tested draft, one per drawn token). ``sampling``: the hub's
    ``Sampling`` or the wire's ``shared.TextSampling`` (``temperature`` None or
    <= 0 is greedy, ``top_p`` None is 1, a ``top_k`` it has applies).
    ``top_k``, if given, replaces that one: the hub's ``Sampling`` carries none,
    but ONNX Runtime GenAI samples every turn with its model's ``search.top_k``
    from ``genai_config.json`` (50 in the models built here), so a verifier that
    must match the engine's sampling passes that one.
    ``InvalidRequestError`` for shapes, ids or distributions that do not match.
    """
    temperature = sampling.temperature or 0.0
    top_p = 1.0 if sampling.top_p is None else sampling.top_p
    greedy = not temperature > 0
    logits, ids = _check(target_logits, drafts, draft, greedy)
    if greedy:
        for i, d in enumerate(ids):
            best = int(np.argmax(logits[i]))
            if d != best:
                return Acceptance(accepted=i, next_token=best)
        return Acceptance(accepted=len(ids), next_token=int(np.argmax(logits[len(ids)])))
    assert draft is not None  # _check
    if top_k is None:
        top_k = getattr(sampling, "top_k", None)  # TextSampling's; the hub's Sampling has none
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InvalidRequestError(f"top_k must be an integer >= 1, got {top_k!r}")

    def p_row(i: int) -> np.ndarray:
        return target_probs(logits[i], temperature=temperature, top_p=top_p, top_k=top_k)

    for i, d in enumerate(ids):
        p = p_row(i)
        q = draft.dense(i)
        if rng.random() * q[d] < p[d]:  # probability min(1, p/q); q(d) = 0: kept if p(d) > 0
            continue
        residual = np.maximum(0.0, p - q)
        if not residual.sum() > 0 or not math.isfinite(residual.sum()):
            residual = p  # p == q to rounding: a rejection had probability ~0
        return Acceptance(accepted=i, next_token=_draw(residual, rng))
    return Acceptance(accepted=len(ids), next_token=_draw(p_row(len(ids)), rng))
