"""The verifier's sessions: committed ids and KV caches, bounded, least recently used out.

A session is keyed by (device, session id): a device can never reach
another's. Bounds (``SessionLimits``): a count, an idle time, and the bytes
of all KV caches together; going over evicts the least recently used
sessions (the idle ones first). An evicted session's next round finds no
session and is answered ``resend`` (the device sends its whole committed
context again): eviction costs a prefill, never a wrong token. Not
thread-safe: the verifier's one worker thread owns it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SessionLimits", "VerifySession", "VerifySessions"]


@dataclass(frozen=True, kw_only=True)
class SessionLimits:
    """How many sessions a model's verifier keeps, for how long idle, in how many bytes."""

    max_sessions: int = 64
    idle_s: float = 60.0
    max_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.idle_s <= 0 or self.max_bytes < 1:
            raise ValueError("max_sessions, idle_s and max_bytes must be positive")


@dataclass
class VerifySession:
    """Committed ids; the KV cache of the first ``kv_len`` of them; its random stream."""

    tokens: list[int]
    kv: list[np.ndarray]
    rng: Any
    used_at: float = field(default_factory=time.monotonic)

    @property
    def kv_len(self) -> int:
        return int(self.kv[0].shape[2]) if self.kv else 0

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in self.kv)


class VerifySessions:
    """``SessionLimits``-bounded sessions, least recently used first."""

    def __init__(self, limits: SessionLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._sessions: OrderedDict[tuple[str, str], VerifySession] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._sessions.values())

    def get(self, key: tuple[str, str]) -> VerifySession | None:
        session = self._sessions.get(key)
        if session is not None:
            session.used_at = self._clock()
            self._sessions.move_to_end(key)
        return session

    def put(self, key: tuple[str, str], session: VerifySession) -> None:
        session.used_at = self._clock()
        self._sessions[key] = session
        self._sessions.move_to_end(key)

    def pop(self, key: tuple[str, str]) -> VerifySession | None:
        return self._sessions.pop(key, None)

    def trim(self, keep: tuple[str, str] | None = None) -> None:
        """Evict idle sessions, then the least recently used while over a bound (never
        ``keep``, the session of the round in hand)."""
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if now - s.used_at > self.limits.idle_s]:
            if key != keep:
                self._evict(key)
        total = self.nbytes
        for key in list(self._sessions):
            if len(self._sessions) <= self.limits.max_sessions and total <= self.limits.max_bytes:
                break
            if key == keep:
                continue
            total -= self._sessions[key].nbytes
            self._evict(key)

    def _evict(self, key: tuple[str, str]) -> None:
        del self._sessions[key]
        self.evicted += 1
