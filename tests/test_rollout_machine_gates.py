"""The rollout state machine's gates: the failure-rate gate (failed, rolled-back and
timed-out devices, counted across waves) and the health gates, which compare a
control cohort kept on the previous version with the wave's new one (agreement,
error rate, p99 latency, offloads) at each look, halt the rollout when a margin is
broken or the evidence stays inconclusive; resume goes on judging, and only the
operator's recorded skip_gate waives a wave's health.

Pure and fast: no broker, no clock; time is whatever ``now`` the test passes.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from model_cdn.rollout import DeviceStatus, Notify, Rollout, RolloutState, RolloutStateError

from ._rollout_machine import (
    _assigned,
    _cohorts,
    _fleet,
    _gated,
    _install_all,
    _roundtrip,
    _spec,
    _Traffic,
)

# ------------------------------------------------------------------ gates


def test_failure_threshold_halts_automatically_and_holds() -> None:
    r = Rollout(_spec("10%,all", max_failure_rate=0.1))
    wave0 = _assigned(r.start(_fleet(100), now=0))
    assert r.report(wave0[0], "failed", 2, 1) == []  # 1/10 is not above 0.1
    acts = r.report(wave0[1], "rolled-back", 2, 2)  # the device undid it itself: a failure
    assert [a.state for a in acts if isinstance(a, Notify)] == [RolloutState.HALTED]
    assert "failure rate 2/10" in r.reason
    _install_all(r, wave0[2:], 3)
    assert r.tick(1000) == [] and r.wave == 0 and r.state is RolloutState.HALTED


def test_reports_of_two_waves_at_once_count_together() -> None:
    r = Rollout(_spec("10,20,all", max_failure_rate=0.05, min_reports=5))
    wave0 = _assigned(r.start(_fleet(100), now=0))
    _install_all(r, wave0[:9], 1)
    wave1 = _assigned(r.tick(60))  # wave 0's last device has not reported yet
    assert r.wave == 1 and len(wave1) == 10
    # a burst: wave 0's straggler and a wave 1 device fail in the same batch
    assert r.report(wave0[9], "failed", 2, 61) == []  # 1/20
    r.report(wave1[0], "failed", 2, 61)  # 2/20 > 0.05
    assert r.state is RolloutState.HALTED
    assert r.failure_rate == pytest.approx(0.1)


def test_the_control_cohort_matches_the_new_one_and_is_never_assigned() -> None:
    fleet = {f"dev-{i:03d}": {"region": "eu", "hw": "npu" if i % 4 else "cpu"} for i in range(40)}
    fleet.update({f"us-{i}": {"region": "us", "hw": "cpu"} for i in range(5)})
    r = Rollout(_gated())
    wave0 = _assigned(r.start(fleet, now=0))
    new, control = _cohorts(r)
    assert sorted(new) == sorted(wave0) and len(control) == len(new) == 10
    assert not set(control) & set(r.devices)  # kept on the previous version
    assert Counter(fleet[d]["hw"] for d in control) == Counter(fleet[d]["hw"] for d in new)
    assert all(fleet[d]["region"] == "eu" for d in control)  # the rest of the target first
    r.check_invariants()


def test_health_gate_halts_when_agreement_drops_beyond_margin() -> None:
    r = Rollout(_gated())
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    assert r.tick(5) == [] and r.health.state == "waiting"  # before the first look
    for now in range(2, 11):
        t.beat(new, 2, now, agreement=0.80)
        t.beat(control, 1, now, agreement=0.97)
    [halt] = r.tick(10)
    assert isinstance(halt, Notify) and halt.state is RolloutState.HALTED
    assert halt.reason.startswith("health gate: agreement drop")
    assert "10 vs 10 devices" in halt.reason
    [j] = r.health.judgements
    assert j["verdict"] == "fail" and j["lower"] > 0.02
    assert r.tick(200) == [] and r.wave == 0


def test_health_within_margin_lets_the_wave_advance_at_a_look() -> None:
    r = Rollout(_gated(max_p99_latency_ratio=1.5))
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    for now in range(2, 11):
        t.beat(new, 2, now, agreement=0.965, p99=11.0)
        t.beat(control, 1, now, agreement=0.97, p99=10.0)
        t.beat(["us-0"], 7, now, agreement=0.1)  # another version, another device: not ours
    assert len(_assigned(r.tick(10))) == 30
    assert r.health.looks_done == 0  # the next wave's looks begin afresh


@pytest.mark.parametrize(
    ("gate", "old", "new"),
    [
        ({"max_error_rate_increase": 0.01}, {"errors": 0.01}, {"errors": 0.2}),
        ({"max_p99_latency_ratio": 1.2}, {"p99": 10.0}, {"p99": 20.0}),
        ({"max_offload_rate_increase": 0.05}, {"offloads": 0.1}, {"offloads": 0.5}),
    ],
)
def test_each_health_gate_halts(
    gate: dict[str, Any], old: dict[str, float], new: dict[str, float]
) -> None:
    r = Rollout(_gated(**{"max_agreement_drop": None, **gate}))
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new_devices, control = _cohorts(r)
    for now in range(2, 11):
        t.beat(new_devices, 2, now, **new)
        t.beat(control, 1, now, **old)
    r.tick(10)
    assert r.state is RolloutState.HALTED and r.reason.startswith("health gate"), r.reason


def test_a_wave_still_inconclusive_at_its_last_look_halts() -> None:
    r = Rollout(_gated(min_health_samples=10**6))
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    for now in (10, 20):
        t.beat(new, 2, now)
        t.beat(control, 1, now)
        assert r.tick(now) == []
        assert any("health inconclusive" in w for w in r.waiting(now))
    [halt] = r.tick(30)
    assert halt.state is RolloutState.HALTED
    assert halt.reason.startswith("health gate inconclusive after 3 looks")


def test_telemetry_naming_another_version_than_expected_is_not_evidence() -> None:
    r = Rollout(_gated())
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    for now in range(2, 11):
        t.beat(control, 2, now, agreement=0.5)  # controls claiming the new version
        t.beat(new, 1, now, agreement=0.5)  # and new ones claiming the old
    assert r.tick(10) == []
    [j] = r.health.judgements
    assert j["new"]["devices"] == j["control"]["devices"] == 0
    assert r.health.view()["mismatched_reports"] == 2 * 10 * 9


def _halted_on_a_drop() -> tuple[Rollout, _Traffic]:
    r = Rollout(_gated("10%,50%,all"))
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    for now in range(2, 11):
        t.beat(new, 2, now, agreement=0.8)
        t.beat(control, 1, now)
    r.tick(10)
    assert r.state is RolloutState.HALTED and r.reason.startswith("health gate: agreement")
    return r, t


def test_resume_after_a_pause_goes_on_judging_the_wave() -> None:
    # issue 21: pause then resume accepted the wave's inconclusive health data and the
    # next wave started at once; now the judgement goes on and holds the wave
    r = Rollout(_gated("10%,50%,all", min_health_samples=10**6))
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    t.beat(new, 2, 5)
    t.beat(control, 1, 5)
    r.pause()
    r.resume(6)
    assert r.health.state == "waiting" and r.reason == "resumed"
    for now in (10, 12, 20):
        t.beat(new, 2, now)
        t.beat(control, 1, now)
        assert _assigned(r.tick(now)) == [] and r.wave == 0  # inconclusive: no next wave
    [halt] = r.tick(30)  # and at the last look it halts, as without the pause
    assert halt.state is RolloutState.HALTED and "inconclusive after 3 looks" in halt.reason
    r.check_invariants()


def test_resume_after_a_health_halt_judges_again_with_new_looks() -> None:
    r, t = _halted_on_a_drop()
    acts = r.resume(11)
    assert acts[0].reason == "resumed; health judged again (3 more looks to 30 s)"
    assert r.state is RolloutState.RUNNING and r.health.state == "waiting"
    new, control = _cohorts(r)
    for now in range(12, 22):
        t.beat(new, 2, now, agreement=0.8)
        t.beat(control, 1, now)
        r.tick(now)
        assert r.wave == 0  # the drop still holds the wave
    assert r.state is RolloutState.HALTED and r.reason.startswith("health gate: agreement")
    r.check_invariants()


def test_skip_gate_is_the_operators_recorded_way_past_a_health_halt() -> None:
    r, t = _halted_on_a_drop()
    with pytest.raises(ValueError, match="needs a reason"):
        r.skip_gate(11, by="ops", reason="  ")
    acts = r.skip_gate(11, by="key tdm_ab12", reason="drop is the known label fix")
    assert acts[0] == Notify(
        RolloutState.RUNNING,
        0,
        "gate of wave 1 skipped by key tdm_ab12: drop is the known label fix",
    )
    [entry] = [e for e in r.history if e["action"] == "skip-gate"]
    assert entry["at"] == 11 and entry["wave"] == 0 and entry["by"] == "key tdm_ab12"
    assert entry["reason"] == "drop is the known label fix" and "agreement" in entry["gate"]
    assert r.health.state == "waived"
    r.check_invariants()
    wave1 = _assigned(r.tick(12))
    assert len(wave1) == 16 and r.health.state == "waiting"  # the next wave is judged again
    _install_all(r, wave1, 13)
    new, control = _cohorts(r)
    for now in range(14, 23):
        t.beat(new, 2, now, agreement=0.8)
        t.beat(control, 1, now)
    r.tick(22)
    assert r.state is RolloutState.HALTED and r.wave == 1
    assert _roundtrip(r).history == r.history  # kept across restarts
    r.abort()
    with pytest.raises(
        RolloutStateError, match="cannot skip the gate of a rollout that is aborted"
    ):
        r.skip_gate(30, by="ops", reason="late")


def test_invariant_11_catches_a_waiver_without_skip_gate() -> None:
    r, _t = _halted_on_a_drop()
    r.health.waive()  # what resume() did before issue 21
    with pytest.raises(AssertionError, match="11:"):
        r.check_invariants()


def test_device_timeout_counts_as_failure() -> None:
    r = Rollout(_spec("10%,all", device_timeout_s=100.0, soak_s=1e6, max_failure_rate=0.0))
    wave0 = _assigned(r.start(_fleet(20), now=0))
    r.report(wave0[0], "installed", 2, 5)
    r.report(wave0[1], "downloading", 2, 5)  # progress is not a final report
    assert r.tick(99.9) == []
    acts = r.tick(100)
    assert r.devices[wave0[1]].status is DeviceStatus.TIMED_OUT
    assert acts == [
        Notify(
            RolloutState.HALTED,
            0,
            "failure rate 1/2 = 50% above max 0% (failed or timed out, over the waves so "
            "far; with 2 devices, 1 failure halts it)",
        )
    ]
    # a late report replaces the timeout
    r.report(wave0[1], "installed", 2, 150)
    assert r.devices[wave0[1]].status is DeviceStatus.INSTALLED and r.failed == 0


def test_one_failure_in_a_wave_of_five_halts_and_says_why() -> None:
    # issue 21: one failed report halted a wave of 5 by arithmetic alone, without saying so
    r = Rollout(_spec("5,all", max_failure_rate=0.1))
    wave0 = _assigned(r.start(_fleet(40), now=0))
    _install_all(r, wave0[:4], 1)
    [halt] = r.report(wave0[4], "failed", 2, 2)
    assert halt.reason == (
        "failure rate 1/5 = 20% above max 10% (failed or timed out, over the waves so far; "
        "with 5 devices, 1 failure halts it)"
    )
