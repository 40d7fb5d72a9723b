"""A count of calls inside a section (the local model's run), kept without a lock.

The count is the length of a ``collections.deque``: entering appends, leaving
pops, reading takes ``len``. Each is a single C call that the documentation
promises thread-safe (the GIL never splits one, and free-threaded builds lock
the deque), so concurrent entries and exits are all counted and a reading is
the exact count at one moment; ``n += 1`` on an attribute, by contrast, is a
read and a write that another thread may interleave with.

This is the local hot path: an append and a pop cost about what one attribute
increment does, well below an uncontended lock's acquire and release.
"""

from __future__ import annotations

from collections import deque

__all__ = ["InflightCounter"]


class InflightCounter:
    """How many calls are between ``enter()`` and ``leave()`` now; thread-safe."""

    __slots__ = ("_inside",)

    def __init__(self) -> None:
        self._inside: deque[None] = deque()

    def enter(self) -> None:
        self._inside.append(None)

    def leave(self) -> None:
        """After a matching ``enter()`` only (an unmatched one raises ``IndexError``)."""
        self._inside.pop()

    @property
    def value(self) -> int:
        return len(self._inside)
