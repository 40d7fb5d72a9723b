"""What the vLLM engine (``_vllm``) computes without vLLM: pure, and tested without it.

* :func:`sampling_kwargs`: our :class:`Sampling` and ``max_tokens`` as
  ``vllm.SamplingParams`` keyword arguments (greedy is ``temperature=0``).
* :func:`finish_of`: vLLM's ``CompletionOutput.finish_reason`` (``"stop"``,
  ``"length"``, ``"abort"``, ``"error"``) as a :class:`TurnUpdate` finish.
* :class:`DeltaStream`: a turn's ``RequestOutputKind.DELTA`` outputs (new text,
  new token ids) accumulated into the updates a turn's sink receives, as
  ``LanguageEngine`` sends them (the whole token list so far, the text new since
  the last update, usage and cached tokens; an update only when text is new,
  the last one with ``finish``).
* :class:`ConversationHistories`: each kept conversation's token history
  (prompt + generated, an end-of-sequence token dropped), bounded exactly as
  ``_kept`` bounds the CPU engine's generators (``ConversationStore``: LRU of
  ``max_conversations``, idle TTL, a capacity of ``min(context,
  max(max_conversation_tokens or context, prompt + max_tokens))`` tokens and
  nothing kept that leaves no room for another token). vLLM's prefix cache
  holds the KV blocks; this is what says which turn continues which
  conversation (hits, misses, evictions) and how many of its prompt tokens
  it repeats.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._conversations import ConversationLimits, ConversationStore, Kept
from ._options import Sampling
from ._turn import TurnUpdate

__all__ = ["ConversationHistories", "DeltaStream", "finish_of", "sampling_kwargs"]

_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error"}


def sampling_kwargs(sampling: Sampling, max_tokens: int) -> dict[str, Any]:
    """``vllm.SamplingParams(**these, output_kind=RequestOutputKind.DELTA)`` for a turn.

    Greedy (``temperature`` 0) passes neither ``top_p`` nor ``seed``: vLLM
    takes the argmax whatever they are. Stop strings are vLLM's to match (it
    holds back a tail that may begin one, and leaves the stop string out of
    the text, as ``LanguageEngine`` does).
    """
    kwargs: dict[str, Any] = {"max_tokens": int(max_tokens), "n": 1}
    if sampling.temperature > 0:
        kwargs.update(temperature=float(sampling.temperature), top_p=float(sampling.top_p))
        if sampling.seed is not None:
            kwargs["seed"] = int(sampling.seed)
    else:
        kwargs["temperature"] = 0.0
    if sampling.stop:
        kwargs["stop"] = list(sampling.stop)
    return kwargs


def finish_of(reason: object) -> str:
    """vLLM's finish reason (a string, or v1's ``FinishReason`` enum) as ours."""
    name = getattr(reason, "name", reason)
    return _FINISH.get(str(name).lower(), "stop")


@dataclass
class DeltaStream:
    """One turn's outputs so far; :meth:`add` turns a delta into the sink's update (or None)."""

    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    cached: int = 0
    finished: bool = False

    def add(
        self,
        text: str,
        token_ids: Sequence[int],
        *,
        finish_reason: object = None,
        cached: int | None = None,
    ) -> TurnUpdate | None:
        """The update for one delta; None when it brings no new text and does not finish."""
        if self.finished:
            return None
        self.tokens.extend(int(t) for t in token_ids)
        if cached is not None:
            self.cached = max(self.cached, int(cached))
        self.text += text
        if finish_reason is None:
            return self._update(text, None) if text else None
        return self.finish(finish_of(finish_reason), delta=text)

    def finish(self, finish: str, *, delta: str = "", error: str | None = None) -> TurnUpdate:
        """The turn's last update: ``finish`` (``"error"`` carries ``error``)."""
        self.finished = True
        if finish == "error":
            return TurnUpdate("", tuple(self.tokens), "error", self.prompt_tokens, 0,
                              error or "the engine failed the turn", self.cached)  # fmt: skip
        return self._update(delta, finish)

    def _update(self, delta: str, finish: str | None) -> TurnUpdate:
        return TurnUpdate(
            delta,
            tuple(self.tokens),
            finish,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(self.tokens),
            cached_prompt_tokens=self.cached,
        )


def _options(sampling: Sampling) -> Hashable:
    """Which kept conversations a turn may continue: those of its sampling options.

    vLLM's KV cache does not depend on sampling, but the CPU engine keys kept
    conversations by them (``_kept``), and both engines count hits alike.
    """
    if sampling.temperature <= 0:
        return ("greedy",)
    return ("sample", sampling.temperature, sampling.top_p, sampling.seed)


class ConversationHistories:
    """Kept conversations' token histories, bounded like the CPU engine's (module docstring).

    Used from one thread (the vLLM engine's loop); the owner takes a lock for ``stats``.
    """

    def __init__(self, limits: ConversationLimits, *, context: int, eos: frozenset[int]) -> None:
        self.context, self.eos = context, eos
        self.budget = min(limits.max_tokens or context, context)
        self.store = ConversationStore(limits)

    def __len__(self) -> int:
        return len(self.store)

    def begin(self, key: str, prompt: np.ndarray, sampling: Sampling, max_tokens: int) -> Kept:
        """Take ``key``'s history for a turn (a hit), or start one; the ``Kept`` to :meth:`end`.

        ``Kept.history`` is cut to the prompt tokens the turn repeats (what vLLM's
        prefix cache may hold for it; it counts, per block, what it really reused).
        """
        options = _options(sampling)
        needed = len(prompt) + max_tokens
        kept, reuse = self.store.take(key, prompt, options, needed)
        if kept is None:
            capacity = min(self.context, max(self.budget, needed))
            kept = Kept(key, None, [], options, capacity, 0.0)
        kept.history = kept.history[:reuse]
        return kept

    def end(self, kept: Kept, prompt: Sequence[int] | np.ndarray, tokens: Sequence[int]) -> None:
        """The turn is over (finished, cancelled or cut): keep prompt + what it generated."""
        generated = list(map(int, tokens))
        if generated and generated[-1] in self.eos:
            generated.pop()
        kept.history = [*map(int, prompt), *generated]
        self.store.keep(kept)  # dropped when it leaves no room for another turn

    def forget(self, key: str) -> bool:
        """Drop ``key``'s history now; whether one was kept."""
        return self.store.drop(key)

    def expire(self) -> int:
        return self.store.expire()

    def clear(self) -> None:
        self.store.clear()
