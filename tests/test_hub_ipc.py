"""Ring records and the ingress <-> executor link: what goes in comes out, to the right key."""

from __future__ import annotations

import os
import selectors
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cloud_hub import IpcClosedError
from cloud_hub.plane._ipc import (
    ExecutorConnection,
    IngressPeer,
    IpcListener,
    ModelInfo,
    executor_address,
)
from cloud_hub.plane._records import (
    read_reply,
    read_request,
    reply_size,
    request_size,
    write_reply,
    write_request,
)
from shared import DATATYPES, ErrorCode, TensorSpec

NUMERIC = [d for d in DATATYPES if d != "BYTES"]
INFO = ModelInfo(
    model="m",
    version="3",
    platform="onnxruntime",
    max_batch_size=8,
    inputs=(TensorSpec("x", "FP32", (4,)),),
    outputs=(TensorSpec("y", "FP32", (4,)),),
    device="CPUExecutionProvider",
)


@st.composite
def tensors(draw: st.DrawFn) -> list[tuple[int, np.ndarray]]:
    out = []
    for index in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from([*NUMERIC, "BYTES"]))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
        if datatype == "BYTES":
            items = draw(st.lists(st.binary(max_size=6), min_size=1, max_size=1))
            array = np.full(shape, items[0], dtype=object)
        else:
            array = draw(hnp.arrays(DATATYPES[datatype], shape))
        out.append((index, array))
    return out


def _same(a: list[tuple[int, np.ndarray]], b: list[tuple[int, np.ndarray]]) -> None:
    assert [i for i, _ in a] == [i for i, _ in b]
    for (_, x), (_, y) in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        if x.dtype == object:
            assert x.tolist() == y.tolist()
        else:
            np.testing.assert_array_equal(x, y)


@settings(max_examples=80, deadline=None)
@given(tensors(), st.one_of(st.none(), st.floats(0, 1e9)), st.integers(0, 2**64 - 1))
def test_request_records_round_trip(
    items: list[tuple[int, np.ndarray]], deadline: float | None, key: int
) -> None:
    size, prepared = request_size(items)
    buffer = bytearray(size)
    write_request(memoryview(buffer), key, deadline, 12.5, 3, prepared)
    record = read_request(memoryview(buffer))
    assert (record.key, record.deadline, record.arrival, record.rows) == (key, deadline, 12.5, 3)
    _same(items, record.tensors)


@settings(max_examples=60, deadline=None)
@given(tensors(), st.sampled_from(list(ErrorCode)), st.text(max_size=50))
def test_reply_records_round_trip(
    items: list[tuple[int, np.ndarray]], code: ErrorCode, message: str
) -> None:
    size, text, prepared = reply_size(message, items)
    buffer = bytearray(size)
    write_reply(
        memoryview(buffer),
        7,
        code,
        text,
        queue_ms=1.5,
        compute_ms=2.5,
        batch_rows=9,
        batch_requests=4,
        prepared=prepared,
    )
    record = read_reply(memoryview(buffer))
    assert (record.key, record.error, record.message) == (7, code, message)
    assert (record.queue_ms, record.compute_ms, record.batch_rows, record.batch_requests) == (
        1.5,
        2.5,
        9,
        4,
    )
    _same(items, record.tensors)


def test_a_corrupt_record_is_refused_not_misread() -> None:
    size, prepared = request_size([(0, np.ones((2, 3), np.float32))])
    buffer = bytearray(size)
    write_request(memoryview(buffer), 1, None, 0.0, 2, prepared)
    with pytest.raises(ValueError):
        read_request(memoryview(buffer)[: size - 8])


def test_a_reply_with_an_unknown_error_index_is_refused_not_misread() -> None:
    size, text, prepared = reply_size("boom", [])
    for index in (len(ErrorCode), 255):  # one past the last code, and the largest a byte holds
        buffer = bytearray(size)
        write_reply(memoryview(buffer), 7, ErrorCode.INTERNAL, text, prepared=prepared)
        buffer[8] = index  # the error code's byte, right after the 8-byte key
        with pytest.raises(ValueError, match="corrupt reply record"):
            read_reply(memoryview(buffer))
    buffer[8] = len(ErrorCode) - 1  # the last code is a real one
    assert read_reply(memoryview(buffer)).error is list(ErrorCode)[-1]


# -- the link over a real socket and real rings ----------------------------------------------


@pytest.fixture
def linked() -> Iterator[tuple[IpcListener, ExecutorConnection, IngressPeer, list]]:
    address = executor_address(uuid.uuid4().hex[:8], "m", "3", 0)
    server = IpcListener(address, INFO)
    replies: list = []
    link = ExecutorConnection(
        address, ingress_id="i0", on_reply=lambda r: replies.append(r), ring_bytes=8 << 20
    )
    info, peer = _connect(link, server)
    assert info == INFO
    yield server, link, peer, replies
    link.close()
    peer.close()
    server.close()


def _connect(link: ExecutorConnection, server: IpcListener) -> tuple[ModelInfo, IngressPeer]:
    """``connect`` waits for the executor's hello, so the executor accepts meanwhile."""
    accepted: list[IngressPeer] = []
    thread = threading.Thread(target=lambda: accepted.append(_accept(server)))
    thread.start()
    try:
        info = link.connect()
    finally:
        thread.join()
    return info, accepted[0]


def _accept(server: IpcListener) -> IngressPeer:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        peer = server.accept()
        if peer is not None:
            return peer
        time.sleep(0.001)
    raise AssertionError("no ingress connected")


def _wait_readable(fileno: int) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fileno, selectors.EVENT_READ)
        assert sel.select(5.0), "nothing arrived within 5 s"


def test_each_reply_reaches_its_own_request(linked: tuple) -> None:
    _, link, peer, replies = linked
    sent = {k: np.full((1, 4), k, np.float32) for k in range(50)}
    for k, x in sent.items():
        assert link.submit(k, None, time.monotonic(), 1, [(0, x)])
    got = []
    while len(got) < len(sent):  # the executor's side: read, say how far, read the rest
        _wait_readable(peer.fileno())
        got.extend(peer.requests())
        peer.flush()
        if len(got) < len(sent):
            _wait_readable(link.fileno())
            link.on_readable()  # takes "seen" and announces what was written meanwhile
    assert [r.key for r in got] == list(sent)  # arrival order kept
    for record in reversed(got):  # answer out of order, each with its own input doubled
        (_, x) = record.tensors[0]
        peer.reply(record.key, tensors=[(0, x * 2)], queue_ms=0.1, compute_ms=0.2)
    peer.flush()
    while len(replies) < len(sent):
        _wait_readable(link.fileno())
        link.on_readable()
    assert len(replies) == len(sent)
    for reply in replies:
        assert reply.error is ErrorCode.OK
        np.testing.assert_array_equal(reply.tensors[0][1], sent[reply.key] * 2)


def test_an_executor_that_dies_ends_the_link(linked: tuple) -> None:
    _, link, peer, _ = linked
    peer.close()
    _wait_readable(link.fileno())
    with pytest.raises(IpcClosedError):
        link.on_readable()
    link.close()
    with pytest.raises(IpcClosedError):
        link.submit(1, None, 0.0, 1, [(0, np.zeros((1, 4), np.float32))])


def test_a_full_request_ring_refuses_instead_of_blocking(linked: tuple) -> None:
    _, link, _, _ = linked
    big = np.zeros((1, 256 * 1024), np.float32)  # 1 MiB
    accepted = 0
    while link.submit(accepted, None, 0.0, 1, [(0, big)]):
        accepted += 1
        assert accepted < 100
    assert accepted >= 2  # about half of the 8 MiB ring, then back-pressure


def test_nobody_listening_is_an_os_error() -> None:
    link = ExecutorConnection(
        executor_address("nobody", "m", "1", 0), ingress_id="i", on_reply=lambda r: None
    )
    with pytest.raises(OSError):
        link.connect(timeout_s=1.0)


def test_no_descriptor_leaks_over_many_links() -> None:
    before = len(os.listdir("/proc/self/fd"))
    address = executor_address(uuid.uuid4().hex[:8], "m", "3", 0)
    server = IpcListener(address, INFO)
    try:
        for _ in range(30):
            link = ExecutorConnection(
                address, ingress_id="i", on_reply=lambda r: None, ring_bytes=1 << 20
            )
            _, peer = _connect(link, server)
            link.submit(1, None, 0.0, 1, [(0, np.zeros((1, 4), np.float32))])
            link.close()
            peer.close()
    finally:
        server.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_announcements_are_coalesced_and_none_is_lost(linked: tuple) -> None:
    _, link, peer, _ = linked
    x = np.zeros((1, 4), np.float32)
    for key in range(50):  # the executor is busy: it reads nothing meanwhile
        assert link.submit(key, None, 0.0, 1, [(0, x)])
    _wait_readable(peer.fileno())
    assert [r.key for r in peer.requests()] == [0]  # one announcement, for the first
    peer.flush()  # the executor says how far it read ...
    _wait_readable(link.fileno())
    link.on_readable()  # ... and the ingress announces everything written meanwhile, at once
    _wait_readable(peer.fileno())
    assert [r.key for r in peer.requests()] == list(range(1, 50))


def _memfd_pages_resident() -> int:
    """Resident KiB of this process's ring mappings."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef":
            inside = "/memfd:tandem-ring" in line
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_100000_requests_leak_no_descriptor_mapping_or_resident_page(linked: tuple) -> None:
    _, link, peer, replies = linked
    fds = len(os.listdir("/proc/self/fd"))
    x = np.arange(768, dtype=np.float32).reshape(1, 768)  # 3 KiB, as a device's request
    sent = 0
    while sent < 100_000:
        for _ in range(64):  # a burst, then the executor's side answers it
            assert link.submit(sent, None, 0.0, 1, [(0, x)])
            sent += 1
        got = 0
        while got < 64:
            _wait_readable(peer.fileno())
            for record in peer.requests():
                peer.reply(record.key, tensors=[(0, record.tensors[0][1][:, :10])])
                got += 1
            peer.flush()
            if got < 64:
                _wait_readable(link.fileno())
                link.on_readable()
        while len(replies) < 64:
            _wait_readable(link.fileno())
            link.on_readable()
        assert [r.key for r in replies] == list(range(sent - 64, sent))
        replies.clear()
    assert len(os.listdir("/proc/self/fd")) == fds
    # 100,000 x 3 KiB went through two 8 MiB rings many times over; the pages passed
    # are given back, so what stays resident is about a release chunk per ring.
    assert _memfd_pages_resident() <= 4 * 1024, _memfd_pages_resident()
