"""How strange a prompt is to the device model, before it writes a token: pure, then I/O.

The **prompt score** is the device model's own perplexity of the prompt,
kept as its logarithm: the mean negative log-likelihood (nats per token) of
each prompt token given the ones before it. A prompt the device model finds
surprising is one it is likely to continue badly, so a turn whose score is
above a threshold may go to the hub whole, before the device writes anything
(prompt-level routing; ``HandoffPolicy(prompt_share=...)``).

``PromptScore`` also keeps what a learned router may read beside it: the
number of tokens scored, the highest surprisal of any token, and the entropy
of the next-token distribution at the end of the prompt (how sure the model
is of what comes first).

The pure part, ``prompt_score(logits, ids)``, takes the logits of every
prompt position and the ids. The I/O costs nothing extra: the turn's own
prefill (``append_tokens`` of the prompt on the ONNX Runtime GenAI
generator that then decodes) leaves the logits of every appended position
in ``generator.get_output("logits")``; ``prefill_logits`` reads them. A
conversation's turn appends only its new tokens, so its score is that of
the new turn given the history. The first appended token has no logits
before it in this prefill and is not scored; a prompt of one token scores
0 with ``tokens == 0`` (nothing to judge it by).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PROMPT_FEATURES", "PromptScore", "prefill_logits", "prompt_score"]

PROMPT_FEATURES = ("mean_nll", "tokens", "max_surprisal", "last_entropy")


@dataclass(frozen=True, slots=True)
class PromptScore:
    """A prompt as the device model sees it; ``mean_nll`` (log-perplexity) is the score."""

    tokens: int  # prompt tokens scored (the prompt's length minus one)
    mean_nll: float  # nats per token: log of the device model's perplexity of the prompt
    max_surprisal: float  # the highest -log p of one prompt token
    last_entropy: float  # entropy (nats) of the next-token distribution after the prompt

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)

    def features(self) -> tuple[float, ...]:
        """The values named by ``PROMPT_FEATURES``, for a learned router."""
        return (self.mean_nll, float(self.tokens), self.max_surprisal, self.last_entropy)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def prompt_score(logits: Any, ids: Sequence[int]) -> PromptScore:
    """The score of prompt ``ids`` from ``logits`` of every one of its positions.

    ``logits`` is ``[positions, vocabulary]`` or ``[1, positions, vocabulary]``
    (what ``get_output("logits")`` gives after appending ``ids``); position
    ``i`` predicts ``ids[i + 1]``. ``ValueError`` when the shapes disagree or an
    id is outside the vocabulary.
    """
    rows = np.asarray(logits, dtype=np.float64)
    if rows.ndim == 3 and rows.shape[0] == 1:
        rows = rows[0]
    ids = [int(i) for i in ids]
    if rows.ndim != 2 or rows.shape[0] != len(ids) or not ids:
        raise ValueError(
            f"logits must be [positions, vocabulary] for {len(ids)} ids, got {np.shape(logits)}"
        )
    vocab = rows.shape[1]
    if any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"a prompt id is outside the vocabulary of {vocab}")
    log_p = _log_softmax(rows)
    last = log_p[-1]
    last_entropy = max(float(-(np.exp(last) * last).sum()), 0.0)
    if len(ids) == 1:
        return PromptScore(0, 0.0, 0.0, last_entropy)
    surprisal = -log_p[np.arange(len(ids) - 1), ids[1:]]
    return PromptScore(len(ids) - 1, float(surprisal.mean()), float(surprisal.max()), last_entropy)


def prefill_logits(generator: Any) -> np.ndarray:
    """The logits of every position the last ``append_tokens`` fed (ONNX Runtime GenAI)."""
    return np.asarray(generator.get_output("logits"))
