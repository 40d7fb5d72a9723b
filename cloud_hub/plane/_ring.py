"""A single-producer, single-consumer byte ring in shared memory.

The hub's processes pass tensors through these rings: an ingress process
writes requests into one, its executor writes replies into another. The ring
is an anonymous memory file (``memfd_create``): it has no name, so nothing
outlives the processes that hold it (a crash leaks no segment), and it
reaches the peer as a file descriptor over a Unix socket (``_ipc``).

Layout: ``capacity`` bytes (a multiple of 8), records one after another::

    u32 length   u32 tag   payload (length bytes)   padding to 8 bytes

A record that would cross the end is preceded by a ``PAD`` header that
sends the reader back to offset 0. Positions (``head``, ``tail``) are
monotonic byte counts; the offset is ``position % capacity``.

Who knows what (no shared counters, no atomics): the writer owns ``head``
and learns the reader's progress (``acked``) from messages; the reader owns
``tail`` and reads up to the ``head`` a message told it. The messages travel
over a socket after the bytes are written, so the socket's ordering is the
memory barrier on every CPU, weakly ordered ones included.

Invariants:

- the writer never writes where the reader may still read: a record is
  written only into ``capacity - (head - acked)`` free bytes;
- the reader returns records in the order they were committed, each exactly
  as written, and never reads past the ``head`` it was told;
- a payload larger than ``max_payload`` (half the capacity, less one release
  chunk and the headers: a record that large fits at any offset once the
  reader has caught up) is refused at once (``reserve`` raises
  ``ValueError``); one that fits the capacity but not the free space gets
  ``None`` (back-pressure: the caller answers "overloaded");
- pages the reader has passed are given back to the kernel in whole
  ``release_bytes`` chunks (``MADV_REMOVE``), so a burst of large requests
  does not stay resident; the reader acknowledges only up to the last chunk
  it gave back (``acked``), so the writer never writes into a chunk that is
  about to be given back (which would zero what it wrote).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator

__all__ = ["PAD", "RELEASE_BYTES", "RingReader", "RingWriter", "create_ring_fd"]

_HEADER = struct.Struct("<II")
_HSIZE = _HEADER.size
PAD = 0xFFFFFFFF
RELEASE_BYTES = 1 << 20  # give back passed pages this many bytes at a time
_PAGE = mmap.PAGESIZE


def create_ring_fd(capacity: int, name: str = "tandem-ring") -> int:
    """A new anonymous shared-memory file of ``capacity`` bytes (sparse until written)."""
    _check_capacity(capacity)
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, capacity)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_capacity(capacity: int, release_bytes: int = _PAGE) -> None:
    if release_bytes < _PAGE or release_bytes % _PAGE:
        raise ValueError(f"release_bytes must be a multiple of the page size {_PAGE}")
    if capacity < 4 * release_bytes or capacity % release_bytes:
        raise ValueError(
            f"ring capacity must be a multiple of {release_bytes} and >= {4 * release_bytes}"
        )


def _align(n: int) -> int:
    return (n + 7) & ~7


class _Ring:
    def __init__(self, fd: int, capacity: int, release_bytes: int | None = None) -> None:
        if release_bytes is None:  # 1 MiB, or an eighth of a small ring
            release_bytes = max(_PAGE, min(RELEASE_BYTES, capacity // 8 // _PAGE * _PAGE))
        _check_capacity(capacity, release_bytes)
        if os.fstat(fd).st_size != capacity:
            raise ValueError(f"ring file holds {os.fstat(fd).st_size} bytes, not {capacity}")
        self.capacity = capacity
        self.release_bytes = release_bytes
        # Half the ring: a record always fits once the reader has caught up, whatever the
        # offset, even with the unacknowledged part of one release chunk.
        self.max_payload = capacity // 2 - release_bytes - 2 * _HSIZE
        self._mm = mmap.mmap(fd, capacity)
        self.view = memoryview(self._mm)

    def close(self) -> None:
        """Unmap; views handed out earlier must be gone (``BufferError`` otherwise)."""
        with contextlib.suppress(BufferError):
            self.view.release()
            self._mm.close()


class RingWriter(_Ring):
    """The producer's side: ``reserve`` room, fill it, ``commit``; ``ack`` what the peer freed."""

    def __init__(self, fd: int, capacity: int, release_bytes: int | None = None) -> None:
        super().__init__(fd, capacity, release_bytes)
        self.head = 0
        self.acked = 0
        self._offset = -1  # where the reserved record's header goes; -1: nothing reserved
        self._length = 0

    @property
    def used(self) -> int:
        """Bytes between the reader's last ack and the head (what the reader has not freed)."""
        return self.head - self.acked

    def ack(self, tail: int) -> None:
        """The reader has consumed everything before ``tail``."""
        if not self.acked <= tail <= self.head:
            raise ValueError(f"ack {tail} outside [{self.acked}, {self.head}]")
        self.acked = tail

    def reserve(self, length: int) -> memoryview | None:
        """A writable view of ``length`` bytes for the next record, or ``None`` if full now."""
        if length > self.max_payload or length < 0:
            raise ValueError(f"a record of {length} bytes does not fit a ring of {self.capacity}")
        total = _align(_HSIZE + length)
        offset = self.head % self.capacity
        tail_room = self.capacity - offset
        needed = total if total <= tail_room else tail_room + total
        if self.capacity - self.used < needed:
            return None
        if total > tail_room:  # the record goes to the start; mark the rest of the lap
            _HEADER.pack_into(self._mm, offset, 0, PAD)
            self.head += tail_room
            offset = 0
        self._offset, self._length = offset, length
        start = offset + _HSIZE
        return self.view[start : start + length]

    def commit(self, tag: int) -> int:
        """Publish the reserved record under ``tag``; returns the new head (tell the reader)."""
        if self._offset < 0:
            raise RuntimeError("commit without reserve")
        if tag == PAD or not 0 <= tag < PAD:
            raise ValueError(f"bad record tag {tag}")
        _HEADER.pack_into(self._mm, self._offset, self._length, tag)
        self.head += _align(_HSIZE + self._length)
        self._offset = -1
        return self.head


class RingReader(_Ring):
    """The consumer's side: read records up to the head the writer announced."""

    def __init__(self, fd: int, capacity: int, release_bytes: int | None = None) -> None:
        super().__init__(fd, capacity, release_bytes)
        self.tail = 0
        self.head = 0  # the writer's last announced head
        self.acked = 0  # everything before this was given back to the kernel: tell the writer

    @property
    def pending(self) -> bool:
        """Whether announced records are still unread."""
        return self.tail < self.head

    def announce(self, head: int) -> None:
        """The writer says records exist up to ``head`` (older announcements are ignored)."""
        if head > self.head:
            if head - self.tail > self.capacity:
                raise ValueError(f"announced head {head} is more than a lap past tail {self.tail}")
            self.head = head

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(tag, payload view)`` for every announced record, advancing ``tail``.

        A view is valid until the writer learns the new tail: copy what must
        outlive the caller's ack.
        """
        while self.tail < self.head:
            offset = self.tail % self.capacity
            length, tag = _HEADER.unpack_from(self._mm, offset)
            if tag == PAD:
                self.tail += self.capacity - offset
                continue
            start = offset + _HSIZE
            if length > self.max_payload or start + length > self.capacity:
                raise ValueError(f"corrupt ring record at {self.tail}: length {length}")
            self.tail += _align(_HSIZE + length)
            yield tag, self.view[start : start + length]
        self._release()

    def _release(self) -> None:
        """Give back whole chunks the reader has passed; ``acked`` moves with them."""
        step = self.release_bytes
        end = self.tail - self.tail % step
        if end > self.acked:
            start = self.acked % self.capacity
            length = end - self.acked
            first = min(length, self.capacity - start)  # the range may wrap once
            self._mm.madvise(mmap.MADV_REMOVE, start, first)
            if length > first:
                self._mm.madvise(mmap.MADV_REMOVE, 0, length - first)
            self.acked = end
