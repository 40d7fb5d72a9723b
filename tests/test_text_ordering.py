"""The device's reorder buffer and the hub's chunk coalescer: pure logic, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloud_hub import Coalescing
from cloud_hub.mqtt._coalesce import ChunkCoalescer
from edge_agent.language._reorder import ReorderBuffer


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[int, list[int]]:
    """n messages, each delivered at least once, in any order, some repeated."""
    n = draw(st.integers(1, 30))
    seqs = list(range(n)) + draw(st.lists(st.integers(0, n - 1), max_size=20))
    return n, draw(st.permutations(seqs))


@given(deliveries())
def test_any_order_with_duplicates_comes_out_in_order_once(case: tuple[int, list[int]]) -> None:
    n, arrivals = case
    buffer: ReorderBuffer[str] = ReorderBuffer()
    out: list[str] = []
    for seq in arrivals:
        out += buffer.push(seq, f"m{seq}")
    assert out == [f"m{i}" for i in range(n)]
    assert buffer.duplicates == len(arrivals) - n and buffer.waiting == 0


@given(deliveries(), st.data())
def test_nothing_after_a_gap_is_released(case: tuple[int, list[int]], data: st.DataObject) -> None:
    n, arrivals = case
    missing = data.draw(st.integers(0, n - 1))
    buffer: ReorderBuffer[int] = ReorderBuffer()
    out = [item for seq in arrivals if seq != missing for item in buffer.push(seq, seq)]
    assert out == list(range(missing))  # in order, and stopped at the gap


def test_a_peer_cannot_make_it_hold_more_than_max_ahead() -> None:
    buffer: ReorderBuffer[int] = ReorderBuffer(max_ahead=3)
    assert buffer.push(3, 3) == [] and buffer.push(4, 4) == []
    assert buffer.too_far == 1 and buffer.waiting == 1
    assert buffer.push(0, 0) == [0] and buffer.push(2, 2) == [] and buffer.push(1, 1) == [1, 2, 3]


def test_the_first_token_goes_out_at_once_then_at_most_one_chunk_per_delay() -> None:
    c = ChunkCoalescer(Coalescing(max_delay_s=0.02, max_bytes=100, max_tokens=10))
    assert c.add("a", [1], now=5.0)  # nothing sent yet: at once
    assert c.take(5.0) == ("a", (1,))
    assert not c.add("b", [2], now=5.005) and c.due_at() == pytest.approx(5.02)
    assert not c.add("c", [3], now=5.01)
    assert c.add("d", [4], now=5.03)  # the delay has passed since the last chunk
    assert c.take(5.03) == ("bcd", (2, 3, 4))
    assert c.due_at() is None and not c.pending
    assert c.add("e", [5], now=9.0)  # a quiet link: at once again


def test_size_sends_a_chunk_before_its_time() -> None:
    c = ChunkCoalescer(Coalescing(max_delay_s=60.0, max_bytes=4, max_tokens=3))
    c.add("x", [1], now=0.0)
    c.take(0.0)
    assert not c.add("é", [2], now=0.1)  # 2 bytes
    assert c.add("éé", [3], now=0.2)  # 6 bytes >= 4
    c.take(0.2)
    assert not c.add("", [4, 5], now=0.3) and c.add("", [6], now=0.3)  # 3 tokens
    with pytest.raises(ValueError, match="max_delay_s"):
        Coalescing(max_delay_s=-1)
