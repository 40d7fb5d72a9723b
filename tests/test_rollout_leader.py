"""One rollout leader among CDN replicas: the registry's lease, fencing, queued commands.

On both registry backends (a SQLite file and a PostgreSQL schema of the test's
own). Controllers run in this process over one registry, as two replicas
would; the same with two real server processes and kill -9 is in
tests/test_rollout_leader_failover.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from model_cdn import (
    AssignmentSender,
    LeaseLostError,
    NoRolloutLeaderError,
    RolloutNotFoundError,
    RolloutRequestError,
    open_registry,
)
from model_cdn.registry import Registry, RolloutRecord
from model_cdn.registry._base import AssignmentWrite
from model_cdn.registry._leases import RolloutCommand
from model_cdn.rollout import RolloutStateError
from model_cdn.rollout._commands import view_answer
from model_cdn.rollout._controller import RolloutController
from model_cdn.rollout._leader import LeaderLease
from shared import DeviceReport, SigningKey, verify_assignment

from ._cdn import RecordingLink, make_assignment_doc, make_manifest_doc

MODEL = "mnist"
LEASE = "rollout-leader"


def wait_for(predicate: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def record(rid: str = "ro-0123456789ab", state: str = "running") -> RolloutRecord:
    return RolloutRecord(rid, MODEL, 2, state, {"rollout": {"x": 1}}, 1.0, 2.0)


# -- the lease and the fence in the registry ------------------------------------------------


def test_the_lease_has_one_holder_and_its_token_grows_only_when_it_changes_hands(
    registry: Registry,
) -> None:
    a = registry.acquire_lease(LEASE, "a", 30)
    assert a is not None and a.holder == "a"
    assert registry.acquire_lease(LEASE, "b", 30) is None  # held: b waits
    again = registry.acquire_lease(LEASE, "a", 30)  # a renews: same token, later expiry
    assert again is not None and again.token == a.token and again.expires_at >= a.expires_at
    registry.release_lease(a.fence)
    b = registry.acquire_lease(LEASE, "b", 30)  # released: taken at once
    assert b is not None and b.token == a.token + 1
    assert registry.acquire_lease(LEASE, "a", 30) is None


def test_an_expired_lease_is_taken_over_and_the_old_fence_writes_nothing(
    registry: Registry,
) -> None:
    key = SigningKey.generate()
    a = registry.acquire_lease(LEASE, "a", 0.3)
    assert a is not None
    doc = make_assignment_doc(key, "dev-1", MODEL, 2)
    assert registry.commit_rollout(record(), [AssignmentWrite("dev-1", MODEL, doc)], fence=a.fence)
    taken: list[Any] = []
    wait_for(lambda: taken.append(registry.acquire_lease(LEASE, "b", 30)) or taken[-1])
    b = taken[-1]
    assert b.token == a.token + 1
    # the old holder wakes up and writes as if it still led: refused, and nothing changes
    later = make_assignment_doc(key, "dev-1", MODEL, 3)
    with pytest.raises(LeaseLostError):
        registry.commit_rollout(
            record(state="paused"), [AssignmentWrite("dev-1", MODEL, later)], fence=a.fence
        )
    assert registry.get_rollout("ro-0123456789ab").state == "running"
    assert registry.get_assignment("dev-1", MODEL) == doc
    assert registry.commit_rollout(record(state="paused"), fence=b.fence)
    assert registry.get_rollout("ro-0123456789ab").state == "paused"


def test_a_fence_is_its_token_not_its_holder_a_leader_back_again_cannot_use_its_old_one(
    registry: Registry,
) -> None:
    a1 = registry.acquire_lease(LEASE, "a", 30)
    assert a1 is not None
    registry.release_lease(a1.fence)
    b = registry.acquire_lease(LEASE, "b", 30)
    assert b is not None
    registry.release_lease(b.fence)
    a2 = registry.acquire_lease(LEASE, "a", 30)  # a leads again, under a new token
    assert a2 is not None and a1.token < b.token < a2.token
    # a write still carrying a's first fence (a thread of a's first term, paused meanwhile)
    for stale in (a1.fence, b.fence):
        with pytest.raises(LeaseLostError):
            registry.commit_rollout(record(state="paused"), fence=stale)
    with pytest.raises(RolloutNotFoundError):
        registry.get_rollout("ro-0123456789ab")  # nothing was written
    assert registry.commit_rollout(record(), fence=a2.fence)
    assert registry.get_rollout("ro-0123456789ab").state == "running"


def test_servers_racing_for_an_expired_lease_get_it_exactly_once(registry_url: str) -> None:
    registries = [open_registry(registry_url) for _ in range(6)]
    try:
        old = registries[0].acquire_lease(LEASE, "old", 0.2)
        assert old is not None
        wait_for(lambda: time.time() > old.expires_at + 0.05)  # one host: one clock
        barrier = threading.Barrier(len(registries))
        won: list[int] = []

        def race(i: int) -> None:
            barrier.wait()
            lease = registries[i].acquire_lease(LEASE, f"s{i}", 60)
            if lease is not None:
                won.append(lease.token)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(registries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert won == [old.token + 1]
    finally:
        for r in registries:
            r.close()


def test_a_queued_command_is_answered_with_the_state_or_withdrawn_and_never_applied(
    registry: Registry,
) -> None:
    lease = registry.acquire_lease(LEASE, "a", 30)
    assert lease is not None
    command = RolloutCommand("rc-0123456789abcdef", "pause", "ro-0123456789ab", None, 1.0)
    registry.add_rollout_command(command)
    assert [c.id for c in registry.pending_rollout_commands()] == [command.id]
    answer = view_answer(command, {"state": "paused"})
    assert registry.commit_rollout(record(state="paused"), fence=lease.fence, command=answer)
    assert registry.pending_rollout_commands() == []
    done = registry.withdraw_rollout_command(command.id)
    assert done is not None and done.result == {"view": {"state": "paused"}}

    # withdrawn before the leader got to it: the leader's commit writes nothing
    late = RolloutCommand("rc-fedcba9876543210", "resume", "ro-0123456789ab", None, 2.0)
    registry.add_rollout_command(late)
    withdrawn = registry.withdraw_rollout_command(late.id)
    assert withdrawn is not None and withdrawn.state == "pending"
    assert not registry.commit_rollout(
        record(state="running"), fence=lease.fence, command=view_answer(late, {})
    )
    assert registry.get_rollout("ro-0123456789ab").state == "paused"


class ManualClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_leader_that_cannot_renew_stops_acting_before_its_lease_can_expire(
    registry: Registry,
) -> None:
    clock = ManualClock()
    lease = LeaderLease(registry, holder="a", ttl_s=30, clock=clock)
    fence = lease.try_acquire()
    assert fence is not None and lease.current() == fence
    clock.now += 30 - lease.margin_s - 0.5  # not renewed since (the registry is unreachable)
    assert lease.current() == fence
    clock.now += 1.0  # past ttl - margin of its own clock: another server may lead soon
    assert lease.current() is None
    assert lease.try_acquire() == fence  # renewed: trusted again, same token
    assert lease.current() == fence


# -- controllers as replicas ------------------------------------------------------------------


class FrozenClock:
    """A monotonic clock that stands still: a process paused while it believed it led."""

    def __call__(self) -> float:
        return 1000.0


class Replica:
    def __init__(self, url: str, key: SigningKey, name: str, **lease: Any) -> None:
        self.registry = open_registry(url)
        self.key = key
        self.link = RecordingLink()
        self.lease = LeaderLease(self.registry, holder=name, **lease)
        sender = AssignmentSender(self.link, key=key)
        self.controller = RolloutController(
            self.registry, sender, lease=self.lease, tick_s=0.05, command_timeout_s=10
        )

    def heartbeats(self, n: int, version: int = 1) -> None:
        for i in range(n):
            self.controller.submit(
                DeviceReport(device=f"dev-{i:03d}", at=time.time(), model=MODEL, version=version)
            )

    def close(self) -> None:
        self.registry.close()


@pytest.fixture
def replicas(registry_url: str) -> Iterator[Callable[..., Replica]]:
    key = SigningKey.generate()
    setup = open_registry(registry_url)
    for v in (1, 2):
        setup.add_version(make_manifest_doc(key, MODEL, v))
    setup.close()
    made: list[Replica] = []

    def make(name: str, **lease: Any) -> Replica:
        made.append(Replica(registry_url, key, name, **lease))
        return made[-1]

    yield make
    for r in made:
        r.controller.stop(timeout_s=5)
        r.close()


def test_a_paused_leader_can_neither_write_nor_assign_after_losing_the_lease(
    replicas: Callable[..., Replica],
) -> None:
    old = replicas("old", ttl_s=0.5, clock=FrozenClock())  # believes in its lease forever
    assert old.lease.try_acquire() is not None
    old.heartbeats(20)
    old.controller.step()
    rid = old.controller.create({"model": MODEL, "version": 2, "waves": "10%,100%", "soak_s": 0})[
        "id"
    ]
    first_wave = {d for d, _doc in old.link.published}
    assert len(first_wave) == 2

    new = replicas("new", ttl_s=30)
    wait_for(lambda: new.lease.try_acquire() is not None)  # the old lease expired
    new.controller.step()  # takes over: loads the rollout, re-sends the stored assignments
    assert new.controller.leading and new.controller.get(rid)["wave"] == 0
    assert {d for d, _doc in new.link.published} == first_wave
    resent = {d: doc for d, doc in new.link.published}
    assert all(resent[d] == old.registry.get_assignment(d, MODEL) for d in first_wave)

    # the old leader wakes up: its first wave installs, the soak is over, wave 2 is due
    old.link.clear()
    for device in sorted(first_wave):
        old.controller.submit(DeviceReport(device=device, at=time.time(), model=MODEL, version=2))
    with pytest.raises(LeaseLostError):
        old.controller.step()
    assert old.link.published == []  # signed, refused by the registry, never sent
    assert not old.controller.leading
    assert old.registry.get_rollout(rid).snapshot == new.registry.get_rollout(rid).snapshot
    for device in [f"dev-{i:03d}" for i in range(20)]:
        if device not in first_wave:
            assert new.registry.get_assignment(device, MODEL) is None


def test_a_follower_reads_from_the_registry_and_queues_commands_for_the_leader(
    replicas: Callable[..., Replica],
) -> None:
    leader = replicas("leader", ttl_s=30)
    follower = replicas("follower", ttl_s=30)
    leader.controller.start()
    follower.controller.start()
    assert leader.controller.leading and not follower.controller.leading
    leader.heartbeats(10)
    follower.heartbeats(10)  # a follower hears the fleet too, and writes nothing of it
    assert leader.controller.wait_idle() and follower.controller.wait_idle()
    assert len(follower.controller.devices(model=MODEL)) == 10

    body = {"model": MODEL, "version": 2, "waves": "50%,100%", "soak_s": 600}
    created = follower.controller.create(body)  # applied by the leader, answered here
    rid = created["id"]
    assert leader.controller.get(rid)["state"] == "running"
    wait_for(lambda: len(leader.link.published) == 5)  # sent once stored
    assert follower.link.published == []
    for device, doc in leader.link.published:
        assert verify_assignment(doc, [leader.key.public_key]).device == device
    assert follower.controller.command(rid, "pause")["state"] == "paused"
    assert follower.controller.get(rid)["state"] == "paused"
    # skip-gate carries its reason and who asked through the registry to the leader
    args = {"by": "key ab12", "reason": "checked by hand"}
    skipped = follower.controller.command(rid, "skip-gate", args)
    assert skipped["state"] == "running" and skipped["history"][-1]["reason"] == "checked by hand"
    assert leader.controller.get(rid)["history"][-1]["by"] == "key ab12"
    with pytest.raises(RolloutRequestError, match="needs a reason"):
        follower.controller.command(rid, "skip-gate", {"by": "key ab12"})
    assert follower.controller.command(rid, "pause")["state"] == "paused"
    assert [r["id"] for r in follower.controller.rollouts()] == [rid]
    # the leader's refusals reach the follower's caller as the same errors
    assert follower.controller.command(rid, "abort")["state"] == "aborted"
    with pytest.raises(RolloutStateError):
        follower.controller.command(rid, "pause")
    with pytest.raises(RolloutNotFoundError):
        follower.controller.command("ro-000000000000", "resume")
    assert follower.registry.pending_rollout_commands() == []

    # no leader: the follower's command is withdrawn after its timeout, never applied later
    follower.lease.stop(release=False)  # it will not take over
    leader.controller.stop()
    follower.controller.commands.timeout_s = 0.3
    with pytest.raises(NoRolloutLeaderError):
        follower.controller.command(rid, "rollback")
    assert follower.registry.pending_rollout_commands() == []
    assert follower.controller.get(rid)["state"] == "aborted"
