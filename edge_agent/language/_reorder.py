"""Putting a turn's chunks back in order, without I/O: ``ReorderBuffer``.

QoS 1 delivers at least once, and a broker (or a bridge, or the hub's
threads) may hand messages over out of order. The hub numbers a turn's
messages: chunks ``seq`` 0, 1, 2, ... and the final after the last chunk.
``push(seq, item)`` returns the items that are now next in order (none, or
a run of them); an item whose seq was delivered or is already held is a
duplicate and dropped, so the user never sees text twice or out of order,
and never a gap: nothing after a missing seq is released until it comes.
At most ``max_ahead`` items wait beyond the next seq (a peer cannot make it
hold more); one further ahead is dropped and counted (``too_far``).
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["ReorderBuffer"]

T = TypeVar("T")


class ReorderBuffer(Generic[T]):
    """Items in seq order from 0, each once (see the module docstring)."""

    def __init__(self, *, max_ahead: int = 4096) -> None:
        if max_ahead < 1:
            raise ValueError("max_ahead must be >= 1")
        self.max_ahead = max_ahead
        self.next_seq = 0
        self.duplicates = 0
        self.too_far = 0
        self._held: dict[int, T] = {}

    def push(self, seq: int, item: T) -> list[T]:
        """The items now in order (``seq`` first when it is the next one)."""
        if seq < self.next_seq or seq in self._held:
            self.duplicates += 1
            return []
        if seq - self.next_seq > self.max_ahead:
            self.too_far += 1
            return []
        if seq != self.next_seq:
            self._held[seq] = item
            return []
        ready = [item]
        self.next_seq += 1
        held = self._held
        while self.next_seq in held:
            ready.append(held.pop(self.next_seq))
            self.next_seq += 1
        return ready

    @property
    def waiting(self) -> int:
        """Items held until the gap before them is filled."""
        return len(self._held)
