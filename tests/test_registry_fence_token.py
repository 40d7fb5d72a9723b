"""The lease fence checks the token, not only the holder, on both registry backends.

The SQL is written once (``model_cdn/registry/_sql.py``); this runs it on a
SQLite file and on a PostgreSQL schema of the test's own (``registry``
fixture). A holder that lost the lease and took it back holds a new token:
a write still carrying its old fence comes from the paused, stale leader
and is refused.
"""

from __future__ import annotations

import pytest

from model_cdn import LeaseLostError
from model_cdn.registry import Registry, RolloutRecord

LEASE = "rollout-leader"


def _record(state: str) -> RolloutRecord:
    return RolloutRecord("ro-0123456789ab", "mnist", 2, state, {"rollout": {}}, 1.0, 2.0)


def test_a_fence_from_the_holders_earlier_term_is_refused(registry: Registry) -> None:
    first = registry.acquire_lease(LEASE, "a", 30)
    assert first is not None
    registry.release_lease(first.fence)
    b = registry.acquire_lease(LEASE, "b", 30)
    assert b is not None
    registry.release_lease(b.fence)
    second = registry.acquire_lease(LEASE, "a", 30)  # the same holder, a later term
    assert second is not None and second.token == first.token + 2

    with pytest.raises(LeaseLostError):
        registry.commit_rollout(_record("running"), fence=first.fence)
    assert registry.list_rollouts() == []  # refused, and nothing written
    assert registry.commit_rollout(_record("paused"), fence=second.fence)
    assert registry.get_rollout("ro-0123456789ab").state == "paused"


def test_releasing_with_a_fence_from_an_earlier_term_keeps_the_lease(registry: Registry) -> None:
    first = registry.acquire_lease(LEASE, "a", 30)
    assert first is not None
    registry.release_lease(first.fence)
    b = registry.acquire_lease(LEASE, "b", 30)
    assert b is not None
    registry.release_lease(b.fence)
    second = registry.acquire_lease(LEASE, "a", 30)
    assert second is not None and second.token == first.token + 2
    registry.release_lease(first.fence)  # the stale leader's late release: a no-op
    assert registry.acquire_lease(LEASE, "b", 30) is None  # "a" still holds it
    registry.release_lease(second.fence)
    assert registry.acquire_lease(LEASE, "b", 30) is not None
