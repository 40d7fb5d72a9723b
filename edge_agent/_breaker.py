"""Circuit breaker for the cloud path.

States and transitions (``failure_threshold`` consecutive failures open it)::

    CLOSED --N failures--> OPEN --cool-down elapsed--> HALF_OPEN
       ^                     ^                            |
       |                     +------ probe failed --------+  (cool-down doubles,
       +------------------- probe succeeded --------------+   up to max_cooldown_s)

Invariants: while OPEN, ``allow()`` is false until the cool-down ends; in
HALF_OPEN exactly one caller at a time is let through as the probe; any
success closes the breaker and resets the cool-down. Pure logic with an
injectable clock; thread-safe.
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

    def record_failure(self) -> None:
        with self._lock:
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
