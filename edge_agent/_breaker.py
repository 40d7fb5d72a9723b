"""Circuit breaker for the cloud path.

States and transitions (``failure_threshold`` consecutive failures open it)::

    CLOSED --N failures--> OPEN --cool-down elapsed--> HALF_OPEN
       ^                     ^                            |
       |                     +------ probe failed --------+  (cool-down doubles,
       +------------------- probe succeeded --------------+   up to max_cooldown_s)

Invariants: while OPEN, ``allow()`` is false until the cool-down ends, or,
when what opened it was silence (``record_failure(answered=False)``: a
timeout, a lost broker), until ``probe_now()`` says the cloud was heard from
again (a late reply, an answered hub probe after a reconnect), whichever
comes first; a hub that answered "overloaded" was never gone, so hearing
from it does not cut its cool-down short. In HALF_OPEN exactly one caller at
a time is let through as the probe; any success closes the breaker and
resets the cool-down. Pure logic with an injectable clock; thread-safe.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        cooldown_s: float = 1.0,
        max_cooldown_s: float = 30.0,
        probe_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or cooldown_s <= 0 or max_cooldown_s < cooldown_s:
            raise ValueError("need failure_threshold >= 1 and 0 < cooldown_s <= max_cooldown_s")
        self.failure_threshold = failure_threshold
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.probe_timeout_s = probe_timeout_s  # a probe that never reports frees the slot
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown_s = cooldown_s
        self._opened_at = 0.0
        self._probe_started: float | None = None
        self._last_answered = False  # was the last failure a reply (overloaded, …)?

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._tick()
            return self._state

    def allow(self) -> bool:
        """Whether a call to the cloud may be attempted now."""
        with self._lock:
            self._tick()
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.HALF_OPEN:
                now = self._clock()
                if self._probe_started is None or now - self._probe_started > self.probe_timeout_s:
                    self._probe_started = now
                    return True
            return False

    def record_success(self) -> None:
        with self._lock:
            self._state = BreakerState.CLOSED
            self._failures = 0
            self._cooldown_s = self.base_cooldown_s
            self._probe_started = None

    @property
    def awaiting_silence(self) -> bool:
        """OPEN because the cloud went silent: hearing from it would end the cool-down."""
        with self._lock:
            self._tick()
            return self._state is BreakerState.OPEN and not self._last_answered

    def probe_now(self) -> None:
        """End an open breaker's cool-down now: the next ``allow()`` lets one probe through.

        For evidence that the cloud is back which the cool-down cannot see: a
        reply that came after its request gave up, a hub probe answered after a
        reconnect. Only a breaker opened by silence listens: one opened by
        error replies (overloaded, …) keeps its cool-down. A failing probe
        still doubles the cool-down, so a hub that is heard from but cannot
        answer in time is not flooded.
        """
        with self._lock:
            if self._state is BreakerState.OPEN and not self._last_answered:
                self._state = BreakerState.HALF_OPEN
                self._probe_started = None

    def record_failure(self, *, answered: bool = False) -> None:
        """One failed call; ``answered``: the hub replied with an error (it is there)."""
        with self._lock:
            self._last_answered = answered
            self._tick()
            if self._state is BreakerState.HALF_OPEN:
                self._cooldown_s = min(self._cooldown_s * 2, self.max_cooldown_s)
                self._open()
                return
            self._failures += 1
            if self._state is BreakerState.CLOSED and self._failures >= self.failure_threshold:
                self._open()

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._probe_started = None

    def _tick(self) -> None:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self._cooldown_s:
            self._state = BreakerState.HALF_OPEN
