"""The kept-conversation bookkeeping on its own: prefix reuse, LRU bound, idle TTL, budget.

Pure logic (no engine): states are plain objects and the clock is the test's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cloud_hub.language import ConversationLimits
from cloud_hub.language._conversations import ConversationStore, Kept, reusable_prefix


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def store(**limits: Any) -> tuple[ConversationStore, list[object], Clock]:
    released: list[object] = []
    clock = Clock()
    return ConversationStore(ConversationLimits(**limits), release=released.append,
                             clock=clock), released, clock  # fmt: skip


def kept(key: str, history: list[int], capacity: int = 100) -> Kept:
    return Kept(key, object(), history, ("greedy",), capacity, 0.0)


def p(*ids: int) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


def test_reusable_prefix_stops_at_the_first_different_token_and_leaves_one_to_feed() -> None:
    assert reusable_prefix([1, 2, 3], p(1, 2, 3, 4)) == 3
    assert reusable_prefix([1, 2, 3], p(1, 9, 3, 4)) == 1
    assert reusable_prefix([1, 2, 3], p(1, 2, 3)) == 2  # all history: the last is fed again
    assert reusable_prefix([5], p(1, 2)) == 0
    assert reusable_prefix([], p(1)) == 0


def test_a_hit_takes_the_state_out_and_other_options_or_a_long_turn_miss() -> None:
    s, released, _ = store()
    k = kept("a", [1, 2, 3])
    s.keep(k)
    assert s.take("a", p(1, 2, 3, 4), ("greedy",), 10) == (k, 3) and len(s) == 0
    s.keep(k)
    assert s.take("a", p(1, 2, 3, 4), ("sample", 1.0, 1.0, None), 10) == (None, 0)
    assert released == [k.state]  # the state that cannot serve is released, not leaked
    s.keep(k2 := kept("b", [1, 2], capacity=10))
    assert s.take("b", p(1, 2, 3), ("greedy",), 11) == (None, 0)  # would overflow its cache
    assert k2.state in released
    assert (s.counters["hits"], s.counters["misses"]) == (1, 2)


def test_the_least_recently_kept_is_evicted_at_the_bound_and_the_idle_expire() -> None:
    s, released, clock = store(max_conversations=2, idle_ttl_s=10.0)
    a, b, c = kept("a", [1, 2]), kept("b", [1, 2]), kept("c", [1, 2])
    s.keep(a)
    clock.now += 1
    s.keep(b)
    s.keep(c)
    assert released == [a.state] and s.counters["evictions"] == 1 and len(s) == 2
    clock.now += 10.5  # b was kept 10.5 s ago, c too: both idle past the TTL
    assert s.expire() == 2 and len(s) == 0 and s.counters["expired"] == 2


def test_nothing_is_kept_without_room_for_another_turn_or_with_keeping_off() -> None:
    s, released, _ = store()
    s.keep(full := kept("a", list(range(99)), capacity=100))
    assert len(s) == 0 and released == [full.state]
    off, released_off, _ = store(max_conversations=0)
    off.keep(k := kept("a", [1]))
    assert len(off) == 0 and released_off == [k.state]


@pytest.mark.parametrize(
    "bad", [{"max_conversations": -1}, {"idle_ttl_s": 0}, {"max_tokens": 1}, {"max_tokens": 2.5}]
)
def test_bad_limits_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="generation\\."):
        ConversationLimits(**bad)
