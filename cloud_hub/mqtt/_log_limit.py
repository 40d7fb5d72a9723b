"""A warning that a peer can trigger at will, logged at a bounded rate.

A device can send junk or retained frames as fast as the broker takes them;
one warning line each filled 3.8 MB of log in 6 s. ``RateLimitedLog`` logs
the first ``burst`` lines of each ``window_s`` in full and only counts the
rest; the count comes out as one summary line when the next window starts
(with its first line) or at ``flush`` (the hub stopping). No timer thread:
nothing runs while nothing is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """``warning`` at most ``burst`` times per ``window_s``, then a count of the rest."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        burst: int = 10,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or window_s <= 0:
            raise ValueError("burst must be >= 1 and window_s > 0")
        self.logger = logger
        self.what = what  # "dropped frames": what the summary line counts
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_end = 0.0
        self._logged = 0
        self._suppressed = 0
        self._window_start = 0.0

    def warning(self, message: str, *args: object) -> None:
        with self._lock:
            now = self._clock()
            if now >= self._window_end:
                self._summary(now)
                self._window_start, self._window_end, self._logged = now, now + self.window_s, 0
            if self._logged >= self.burst:
                self._suppressed += 1
                return
            self._logged += 1
        self.logger.warning(message, *args)

    def flush(self) -> None:
        """Log the count of what was not logged yet, if any (when stopping)."""
        with self._lock:
            self._summary(self._clock())

    def _summary(self, now: float) -> None:
        if self._suppressed:
            self.logger.warning(
                "%d more %s in the last %.0fs, not logged one by one",
                self._suppressed,
                self.what,
                now - self._window_start,
            )
            self._suppressed = 0
