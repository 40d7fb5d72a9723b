"""A count of calls inside a section (the local model's run), kept without a lock.

Two ``itertools.count`` objects: one advanced on entry, one on exit. Advancing
one is a single C call (``next``) that the GIL never splits, so concurrent
entries and exits are all counted, where ``n += 1`` on an attribute is three
steps another thread may interleave with. The count is ``entered - left``.

Reading advances both counters once (``itertools.count`` has no way to read
without advancing), which leaves their difference unchanged: readers never
make the count drift. A reading is a moment's view while other threads enter
and leave; while a reader is between its two steps, another thread's reading
may come out lower (by one per reader caught mid-way), so readings are
clamped at zero. Callers use it as a
hint (the queue depth that predicts local latency), never for bookkeeping.

This is the local hot path: entering and leaving cost about as much as one
attribute increment, well below an uncontended lock's acquire and release.
"""

from __future__ import annotations

import itertools

__all__ = ["InflightCounter"]


class InflightCounter:
    """How many calls are between ``enter()`` and ``leave()`` now; thread-safe."""

    __slots__ = ("_entered", "_left")

    def __init__(self) -> None:
        self._entered = itertools.count()
        self._left = itertools.count()

    def enter(self) -> None:
        next(self._entered)

    def leave(self) -> None:
        next(self._left)

    @property
    def value(self) -> int:
        # Exits first: a call that enters and leaves between the two reads then shows
        # as still inside (a moment's overestimate) rather than as a negative count.
        left = next(self._left)
        entered = next(self._entered)
        return max(0, entered - left)
