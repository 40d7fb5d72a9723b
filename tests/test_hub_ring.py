"""The shared-memory ring between hub processes: order, integrity, space, page release."""

from __future__ import annotations

import mmap
import os
from collections import deque
from collections.abc import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cloud_hub.plane._ring import RingReader, RingWriter, create_ring_fd

PAGE = mmap.PAGESIZE


@pytest.fixture
def ring() -> Iterator[tuple[RingWriter, RingReader]]:
    capacity = 16 * PAGE
    fd = create_ring_fd(capacity)
    writer, reader = RingWriter(fd, capacity, PAGE), RingReader(fd, capacity, PAGE)
    os.close(fd)  # both mappings keep the memory alive
    yield writer, reader
    writer.close()
    reader.close()


def _write(writer: RingWriter, payload: bytes, tag: int) -> bool:
    view = writer.reserve(len(payload))
    if view is None:
        return False
    view[:] = payload
    del view
    writer.commit(tag)
    return True


def _payload(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3 * PAGE), st.integers(0, 4)),  # (size, reads before next write)
        min_size=1,
        max_size=120,
    )
)
def test_records_come_out_in_order_and_intact(plan: list[tuple[int, int]]) -> None:
    capacity = 16 * PAGE
    fd = create_ring_fd(capacity)
    writer, reader = RingWriter(fd, capacity, PAGE), RingReader(fd, capacity, PAGE)
    os.close(fd)
    sent: deque[tuple[int, bytes]] = deque()
    refused = 0
    try:
        for i, (size, reads) in enumerate(plan):
            payload = _payload(i, size)
            if _write(writer, payload, i % 1000):
                sent.append((i % 1000, payload))
            else:
                refused += 1
                assert writer.used + size > capacity // 2 - PAGE  # refused only when short of room
            reader.announce(writer.head)
            for _ in range(reads):
                for tag, view in reader.records():
                    assert (tag, bytes(view)) == sent.popleft()
                    del view
                writer.ack(reader.acked)
        reader.announce(writer.head)
        for tag, view in reader.records():
            assert (tag, bytes(view)) == sent.popleft()
            del view
        assert not sent
        assert reader.tail == writer.head
    finally:
        writer.close()
        reader.close()


def _drain(reader: RingReader, sent: deque[tuple[int, bytes]]) -> None:
    for tag, view in reader.records():
        assert (tag, bytes(view)) == sent.popleft()
        del view


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        # (record size, records the reader leaves unread after the writer filled the ring)
        st.tuples(st.integers(0, 3 * PAGE), st.integers(0, 6)),
        min_size=1,
        max_size=40,
    )
)
@example([(3 * PAGE, 1), (5 * PAGE // 2, 0), (3 * PAGE, 2), (PAGE, 0)])
@example([(5 * PAGE // 2, 5), (2 * PAGE, 5)])  # fails at once if the wrap padding is not counted
def test_a_ring_filled_up_to_and_across_its_end_keeps_every_record(
    plan: list[tuple[int, int]],
) -> None:
    """The writer fills the ring until it refuses, again and again: every fill ends at or
    across the wrap point with only part of the ring freed, where a free-space check that
    forgets the padding to the end would write over records not read yet."""
    capacity = 16 * PAGE
    fd = create_ring_fd(capacity)
    writer, reader = RingWriter(fd, capacity, PAGE), RingReader(fd, capacity, PAGE)
    os.close(fd)
    sent: deque[tuple[int, bytes]] = deque()
    wrapped = 0
    try:
        for step, (size, unread) in enumerate(plan):
            heads = []
            laps = writer.head // capacity
            while _write(writer, payload := _payload(len(heads) + 7 * step, size), step % 1000):
                sent.append((step % 1000, payload))
                heads.append(writer.head)
                assert writer.used <= capacity
            wrapped += writer.head // capacity > laps
            # full: the reader reads all but the last ``unread`` records and frees what it can
            if len(heads) > unread:
                reader.announce(heads[len(heads) - 1 - unread])
                _drain(reader, sent)
                writer.ack(reader.acked)
        reader.announce(writer.head)
        _drain(reader, sent)
        assert not sent and reader.tail == writer.head
        if len(plan) >= 4 and plan[0] == (3 * PAGE, 1):
            assert wrapped  # the explicit example does cross the end
    finally:
        writer.close()
        reader.close()


def test_a_full_ring_refuses_until_the_reader_acks(ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    size = 2 * PAGE
    written = 0
    while _write(writer, _payload(written, size), 1):
        written += 1
    assert written >= 3
    assert writer.reserve(size) is None  # full: back-pressure, not an error
    reader.announce(writer.head)
    assert len(list(reader.records())) == written
    writer.ack(reader.acked)
    assert writer.reserve(size) is not None


def test_a_record_too_large_for_the_ring_is_refused_at_once(
    ring: tuple[RingWriter, RingReader],
) -> None:
    writer, _ = ring
    with pytest.raises(ValueError, match="does not fit"):
        writer.reserve(writer.max_payload + 1)
    assert writer.reserve(writer.max_payload) is not None


@pytest.mark.parametrize(("chunks", "release_pages"), [(4, 1), (5, 1), (5, 2), (7, 1)])
def test_the_largest_record_fits_wherever_the_caught_up_reader_stands(
    chunks: int, release_pages: int
) -> None:
    """``max_payload`` is a promise: once the reader has read and freed what it could, a
    record that large is taken at any offset (even one that must wrap), with the unfreed part
    of a release chunk still held; and it is close to half the ring, not a timid fraction.
    An odd number of release chunks is where half the ring is not a chunk boundary."""
    release = release_pages * PAGE
    capacity = chunks * release
    for target in range(0, capacity, 8):
        fd = create_ring_fd(capacity)
        writer, reader = RingWriter(fd, capacity, release), RingReader(fd, capacity, release)
        os.close(fd)
        try:
            assert capacity // 2 - release - 64 <= writer.max_payload < capacity // 2
            while writer.head < target:  # records up to the target offset, each read and freed
                step = min(target - writer.head, writer.max_payload)
                assert _write(writer, bytes(step - 8), 1)
                reader.announce(writer.head)
                assert len(list(reader.records())) == 1
                writer.ack(reader.acked)
            assert writer.head == target and writer.used < release
            assert writer.reserve(writer.max_payload) is not None, (target, writer.used)
        finally:
            writer.close()
            reader.close()


def test_the_reader_never_reads_past_the_announced_head(
    ring: tuple[RingWriter, RingReader],
) -> None:
    writer, reader = ring
    _write(writer, b"first", 1)
    announced = writer.head
    _write(writer, b"second", 2)
    reader.announce(announced)
    assert [bytes(v) for _, v in reader.records()] == [b"first"]
    reader.announce(writer.head)
    assert [bytes(v) for _, v in reader.records()] == [b"second"]
    with pytest.raises(ValueError):
        reader.announce(reader.tail + writer.capacity + 8)


def test_passed_pages_are_given_back_and_acked_only_then(
    ring: tuple[RingWriter, RingReader],
) -> None:
    writer, reader = ring
    for i in range(6):
        assert _write(writer, _payload(i, PAGE // 2), 3)
    reader.announce(writer.head)
    for _ in reader.records():
        pass
    # Released whole pages only; the page the tail is in stays unacknowledged.
    assert reader.acked == reader.tail - reader.tail % PAGE
    assert reader.acked > 0
    # The given-back page reads as zeros through the writer's mapping too.
    assert bytes(writer.view[0:PAGE]) == bytes(PAGE)


def test_commit_needs_a_reservation_and_a_real_tag(ring: tuple[RingWriter, RingReader]) -> None:
    writer, _ = ring
    with pytest.raises(RuntimeError):
        writer.commit(1)
    writer.reserve(8)
    with pytest.raises(ValueError):
        writer.commit(0xFFFFFFFF)


def test_the_ring_file_has_no_name_and_dies_with_its_holders() -> None:
    capacity = 16 * PAGE
    fd = create_ring_fd(capacity)
    target = os.readlink(f"/proc/self/fd/{fd}")
    assert target.startswith("/memfd:") and "(deleted)" in target
    os.close(fd)
    with pytest.raises(ValueError):
        create_ring_fd(PAGE + 1)
