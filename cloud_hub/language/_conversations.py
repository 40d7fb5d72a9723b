"""Kept conversations: which turn may continue from which cached history (pure bookkeeping).

A conversation's state (for ONNX Runtime GenAI, an ``og.Generator`` whose KV
cache holds the history) is kept after its turn under the client's opaque
conversation id. The next turn of that id reuses the longest prefix of the
kept history that its prompt starts with, compared token id by token id: the
cache is rewound to that point and only the rest of the prompt is prefilled.
Anything else (an unknown or evicted id, a history the prompt does not start
with, other sampling options, a prompt too long for the kept cache, the state
in use by another turn) is a miss: the turn prefills from scratch, never an
error.

Bounded: at most ``max_conversations`` states (least recently used evicted
first), each dropped after ``idle_ttl_s`` unused, and none kept beyond
``max_tokens`` (its cache is sized to it). This module holds no engine: the
owner passes states in and gets them back, and it is used from one thread
(the engine's), so it takes no lock.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ConversationLimits", "ConversationStore", "Kept", "reusable_prefix"]


@dataclass(frozen=True, kw_only=True)
class ConversationLimits:
    """Bounds on kept conversations (``generation`` in config.json: ``max_conversations``,
    ``conversation_ttl_s``, ``max_conversation_tokens``)."""

    max_conversations: int = 64  # 0: keep none (every turn prefills its whole prompt)
    idle_ttl_s: float = 600.0
    max_tokens: int | None = None  # a conversation's cache; None: the model's context

    def __post_init__(self) -> None:
        n = self.max_conversations
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"generation.max_conversations must be a whole number >= 0, got {n!r}")
        if not isinstance(self.idle_ttl_s, int | float) or not self.idle_ttl_s > 0:
            raise ValueError(f"generation.conversation_ttl_s must be > 0, got {self.idle_ttl_s!r}")
        t = self.max_tokens
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 2):
            raise ValueError(
                f"generation.max_conversation_tokens must be a whole number >= 2, got {t!r}"
            )


@dataclass(eq=False)
class Kept:
    """One conversation's cached state: ``history`` is what its cache holds, token by token."""

    key: str
    state: Any
    history: list[int]
    options: Hashable  # the sampling options the state was made with (fixed per state)
    capacity: int  # the most tokens the state can hold
    last_used: float


def reusable_prefix(history: Sequence[int], prompt: np.ndarray) -> int:
    """How many leading tokens of ``prompt`` equal ``history``'s, leaving one to feed.

    At least one prompt token must be fed to the model to get the next token's
    logits, so a prompt that is all history reuses all but its last token.
    """
    n = min(len(history), len(prompt) - 1)
    if n <= 0:
        return 0
    differ = np.flatnonzero(np.asarray(history[:n], dtype=np.int64) != prompt[:n])
    return int(differ[0]) if differ.size else n


class ConversationStore:
    """States by conversation id, least recently used first; see the module docstring."""

    def __init__(
        self,
        limits: ConversationLimits,
        *,
        release: Callable[[Any], None] = lambda state: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._release = release
        self._clock = clock
        self._kept: collections.OrderedDict[str, Kept] = collections.OrderedDict()
        self.counters = collections.Counter[str]()

    def __len__(self) -> int:
        return len(self._kept)

    def take(
        self, key: str, prompt: np.ndarray, options: Hashable, needed: int
    ) -> tuple[Kept | None, int]:
        """The kept state ``key``'s turn may continue and how many prompt tokens it reuses.

        The state leaves the store (the turn owns it until :meth:`keep`); on a miss
        it is released and ``(None, 0)`` returned. ``needed`` is the tokens the turn
        may reach (prompt + its output limit). Counts ``hits`` and ``misses``.
        """
        self.expire()
        kept = self._kept.pop(key, None)
        reuse = 0
        if kept is not None:
            if kept.options == options and needed <= kept.capacity:
                reuse = reusable_prefix(kept.history, prompt)
            if reuse == 0:
                self._release(kept.state)
                kept = None
        self.counters["hits" if kept is not None else "misses"] += 1
        return kept, reuse

    def keep(self, kept: Kept) -> None:
        """Keep ``kept`` after its turn (replacing one of its key), evicting beyond the bounds."""
        if self.limits.max_conversations == 0 or len(kept.history) >= kept.capacity - 1:
            self._release(kept.state)  # no room for another turn's token: not worth keeping
            return
        kept.last_used = self._clock()
        old = self._kept.pop(kept.key, None)
        if old is not None:  # two turns of one id at once: the last to finish is kept
            self._release(old.state)
        self._kept[kept.key] = kept
        while len(self._kept) > self.limits.max_conversations:
            _, evicted = self._kept.popitem(last=False)
            self._release(evicted.state)
            self.counters["evictions"] += 1

    def drop(self, key: str) -> bool:
        """Release ``key``'s kept state now (neither a hit nor a miss); whether one was kept."""
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._release(kept.state)
        return kept is not None

    def expire(self) -> int:
        """Release the states unused for ``idle_ttl_s``; how many."""
        horizon = self._clock() - self.limits.idle_ttl_s
        stale = [k for k, kept in self._kept.items() if kept.last_used < horizon]
        for key in stale:
            self._release(self._kept.pop(key).state)
        self.counters["evictions"] += len(stale)
        self.counters["expired"] += len(stale)
        return len(stale)

    def clear(self) -> None:
        while self._kept:
            self._release(self._kept.popitem()[1].state)
