"""The rollout state machine: waves, commands (pause/resume/abort), rollback, persistence.

Pure and fast: no broker, no clock; time is whatever ``now`` the test passes.
The failure and health gates are tested in ``test_rollout_machine_gates``, the
invariants under random event sequences in ``test_rollout_machine_invariants``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import model_cdn.rollout as rollout_pkg
from model_cdn.rollout import (
    Assign,
    DeviceStatus,
    Notify,
    Rollout,
    RolloutState,
    RolloutStateError,
    Unassign,
    Wave,
    parse_waves,
    plan_waves,
)
from shared import UpdateState

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


def test_public_api_is_what_all_names() -> None:
    public = {n for n in dir(rollout_pkg) if not n.startswith("_")}
    assert set(rollout_pkg.__all__) == public - {"annotations"}


# ------------------------------------------------------------------ waves


def test_waves_progress_on_success_and_complete() -> None:
    r = Rollout(_spec())
    acts = r.start(_fleet(20), now=0)
    wave0 = _assigned(acts)
    assert len(wave0) == 2 and all(d.startswith("dev-") for d in wave0)
    assert Notify(RolloutState.RUNNING, 0, "wave 1 of 3") in acts
    _install_all(r, wave0, 10)
    assert r.tick(30) == []  # soak not over
    acts = r.tick(60)
    wave1 = _assigned(acts)
    assert r.wave == 1 and len(wave1) == 8 and not set(wave1) & set(wave0)
    _install_all(r, wave1, 70)
    wave2 = _assigned(r.tick(120))
    assert r.wave == 2 and len(wave2) == 10
    assert r.tick(200) == []  # nobody in the last wave reported yet
    _install_all(r, wave2, 200)
    assert r.tick(200) == [Notify(RolloutState.COMPLETED, 2, "")]
    assert r.state is RolloutState.COMPLETED
    everyone = Counter(wave0 + wave1 + wave2)
    assert len(everyone) == 20 and set(everyone.values()) == {1}
    assert r.tick(10_000) == []
    r.check_invariants()


def test_min_reports_hold_the_next_wave() -> None:
    r = Rollout(_spec("5,all", min_reports=3))
    wave0 = _assigned(r.start(_fleet(10), now=0))
    _install_all(r, wave0[:2], 1)
    assert r.tick(100) == [] and r.wave == 0
    _install_all(r, wave0[2:3], 101)
    assert len(_assigned(r.tick(101))) == 5


def test_zero_device_wave_is_refused_at_creation() -> None:
    spec = _spec("1%,all")
    with pytest.raises(ValueError, match=r"wave 1 \(1%\) would hold 0 devices for a fleet of 40"):
        plan_waves(spec, 40)
    assert plan_waves(spec, 50) == [1, 50]  # 0.5 rounds up
    r = Rollout(spec)
    with pytest.raises(ValueError, match="0 devices"):
        r.start(_fleet(40), now=0)
    assert r.state is RolloutState.PENDING and r.devices == {}
    with pytest.raises(ValueError, match="no device matches"):
        Rollout(_spec()).start({"x": {"region": "us"}}, now=0)
    # counts are capped at the fleet: 'all' after 50 adds nothing to 30 devices
    with pytest.raises(ValueError, match=r"wave 3 \(all\)"):
        plan_waves(_spec("5,50,all"), 30)
    assert plan_waves(_spec("5,50,all"), 80) == [5, 50, 80]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "comma-separated"),
        ("1%,,all", "item 2 is empty"),
        ("0%", "not in"),
        ("150%", "not in"),
        ("abc", "neither a percentage"),
        ("0.5", "neither a percentage"),
        ("-5", "neither a percentage"),
        ("0", "count of 0"),
        ("10%,5%", "must increase"),
        ("50,5", "must increase"),
        ("all,50%", "not last"),
    ],
)
def test_malformed_waves_are_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_waves(text)


def test_parse_waves_forms() -> None:
    assert parse_waves("1%, 10%,50%,100%") == [
        Wave(fraction=0.01),
        Wave(fraction=0.1),
        Wave(fraction=0.5),
        Wave(fraction=1.0),
    ]
    assert [str(w) for w in parse_waves("5,50,ALL")] == ["5", "50", "all"]


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 1},
        {"max_failure_rate": 1.5},
        {"min_reports": 0},
        {"device_timeout_s": 0},
        {"max_p99_latency_ratio": 0.9},
        {"waves": []},
        {"target": {"region": 3}},
    ],
)
def test_spec_validates_in_constructor(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _spec(**bad)


# ------------------------------------------------------- messy input, joins


def test_device_joining_mid_rollout_lands_in_current_wave() -> None:
    r = Rollout(_spec())
    _install_all(r, _assigned(r.start(_fleet(20), now=0)), 1)
    r.tick(60)
    assert r.wave == 1
    assert r.device_joined("late-1", {"region": "eu"}, 61) == [Assign("late-1", 2)]
    assert r.devices["late-1"].wave == 1
    assert r.device_joined("late-1", {"region": "eu"}, 62) == []  # already in
    assert r.device_joined("late-us", {"region": "us"}, 62) == []  # not targeted
    assert "late-us" not in r.devices


def test_stray_duplicate_and_stale_reports_are_ignored() -> None:
    r = Rollout(_spec())
    wave0 = _assigned(r.start(_fleet(20), now=0))
    assert r.report("stranger", "failed", 2, 1) == []
    assert r.report(wave0[0], "failed", 7, 1) == []  # another version
    r.report(wave0[0], "installed", 2, 10)
    r.report(wave0[0], "installed", 2, 10)  # duplicate
    assert r.report(wave0[0], "failed", 2, 5) == []  # older than the last report
    assert r.devices[wave0[0]].status is DeviceStatus.INSTALLED
    assert r.failed == 0 and r.ignored_reports == 3
    r.check_invariants()


def test_pause_and_resume() -> None:
    r = Rollout(_spec())
    wave0 = _assigned(r.start(_fleet(20), now=0))
    _install_all(r, wave0, 1)
    assert r.pause() == [Notify(RolloutState.PAUSED, 0, "paused by operator")]
    assert r.pause() == []
    assert r.tick(500) == [] and r.wave == 0
    assert r.device_joined("late-1", {"region": "eu"}, 501) == []  # queued, not assigned
    assert r.devices["late-1"].status is DeviceStatus.QUEUED
    acts = r.resume(502)
    assert acts == [Notify(RolloutState.RUNNING, 0, "resumed"), Assign("late-1", 2)]
    r.report("late-1", "installed", 2, 503)
    assert len(_assigned(r.tick(503))) == 8 and r.wave == 1


def test_resume_after_halt_accepts_known_failures_only() -> None:
    r = Rollout(_spec("10%,all", max_failure_rate=0.0))
    wave0 = _assigned(r.start(_fleet(20), now=0))
    r.report(wave0[0], "failed", 2, 1)
    assert r.state is RolloutState.HALTED
    r.resume(2)
    r.report(wave0[1], "installed", 2, 3)
    wave1 = _assigned(r.tick(60))
    assert r.state is RolloutState.RUNNING and len(wave1) == 18
    r.report(wave1[0], "failed", 2, 61)  # a new failure trips the gate again
    assert r.state is RolloutState.HALTED


def test_abort_withdraws_unreported_assignments() -> None:
    r = Rollout(_spec())
    wave0 = _assigned(r.start(_fleet(20), now=0))
    r.report(wave0[0], "installed", 2, 1)
    assert r.abort() == [Unassign(wave0[1]), Notify(RolloutState.ABORTED, 0, "aborted by operator")]
    assert r.tick(1000) == [] and r.device_joined("x", {"region": "eu"}, 1) == []
    with pytest.raises(RolloutStateError, match="cannot resume a rollout that is aborted"):
        r.resume(2)


def test_invalid_commands_raise() -> None:
    r = Rollout(_spec())
    with pytest.raises(RolloutStateError):
        r.resume(0)
    with pytest.raises(RolloutStateError):
        r.pause()
    with pytest.raises(RolloutStateError):
        r.rollback(0)
    r.start(_fleet(20), now=0)
    with pytest.raises(RolloutStateError):
        r.start(_fleet(20), now=0)


# ---------------------------------------------------------------- rollback


def test_rollback_sends_every_device_back_and_tracks_until_all_report() -> None:
    r = Rollout(_spec("10%,all", soak_s=0))
    wave0 = _assigned(r.start(_fleet(10), now=0))
    _install_all(r, wave0, 1)
    wave1 = _assigned(r.tick(1))
    _install_all(r, wave1, 2)
    r.tick(3)
    assert r.state is RolloutState.COMPLETED
    acts = r.rollback(10)
    back = _assigned(acts, rollback=True)
    assert sorted(back) == sorted(wave0 + wave1)
    assert all(a.version == 1 for a in acts if isinstance(a, Assign))
    assert acts[-1] == Notify(RolloutState.ROLLING_BACK, 1, "rollback requested")
    assert r.rollback(11) == []
    devs = sorted(back)
    r.report(devs[0], "installed", 2, 12)  # stale: the new version, not a rollback
    r.report(devs[1], "failed", 1, 12)  # rollback failed there: still awaited
    assert r.devices[devs[1]].status is DeviceStatus.ROLLBACK_FAILED
    for d in devs[:-1]:
        assert r.report(d, "installed", 1, 13) == []
    assert r.state is RolloutState.ROLLING_BACK
    r.check_invariants()
    r = _roundtrip(r)  # a restart while rolling back changes nothing
    acts = r.report(devs[-1], "rolled-back", 2, 14)
    assert acts == [
        Notify(
            RolloutState.ROLLED_BACK,
            1,
            "every device is back on the version it ran before (10 on version 1)",
        )
    ]
    r.check_invariants()
    with pytest.raises(RolloutStateError):
        r.resume(15)


def test_rollback_skips_devices_never_assigned() -> None:
    r = Rollout(_spec("10%,all"))
    wave0 = _assigned(r.start(_fleet(20), now=0))
    r.pause()
    r.device_joined("late", {"region": "eu"}, 1)  # queued, never told to update
    acts = r.rollback(2)
    assert sorted(_assigned(acts, rollback=True)) == sorted(wave0)


# ------------------------------------------------------------- persistence


def test_to_dict_round_trip_mid_rollout_continues_identically() -> None:
    a = Rollout(_gated(min_health_samples=1))
    wave0 = _assigned(a.start(_fleet(20), now=0))
    a.report(wave0[0], "installed", 2, 1)
    _Traffic(a).beat(_cohorts(a)[1], 1, 1.5)
    b = _roundtrip(a)
    assert b.to_dict() == a.to_dict()
    for r in (a, b):
        r.report(wave0[1], "installed", 2, 2)
        _Traffic(r).beat(_cohorts(r)[0], 2, 2.5, agreement=0.88)
    assert a.tick(60) == b.tick(60)
    assert a.to_dict() == b.to_dict()
    with pytest.raises(ValueError, match="format"):
        Rollout.from_dict({**a.to_dict(), "format": 99})


# A snapshot as the release before update states became enums persisted it.
_EARLIER_SNAPSHOT = json.loads(
    """{"format": 1, "spec": {"model": "mnist", "version": 2, "previous_version": 1,
    "target": {}, "max_failure_rate": 0.05, "min_reports": 1, "soak_s": 0.0,
    "device_timeout_s": 100.0, "max_error_rate_increase": null,
    "max_p99_latency_ratio": null, "max_offload_rate_increase": null,
    "max_agreement_drop": null, "min_health_samples": 100,
    "waves": [{"fraction": 0.5}, {"fraction": 1.0}]}, "state": "halted", "wave": 0,
    "wave_ends": [2, 4], "order": ["a", "d", "b", "c"],
    "devices": {"a": {"wave": 0, "status": "installed", "assigned_at": 0, "reported_at": 1,
    "assigns": 1, "rollback_assigns": 0}, "d": {"wave": 0, "status": "failed",
    "assigned_at": 0, "reported_at": 2, "assigns": 1, "rollback_assigns": 0}},
    "wave_started_at": 0, "reason": "failure rate 1/2 above 0.05", "health": {},
    "waived_failures": -1, "health_waived": false, "ignored_reports": 0}"""
)


def test_a_snapshot_persisted_by_an_earlier_release_loads_and_goes_on() -> None:
    r = Rollout.from_dict(_EARLIER_SNAPSHOT)
    assert r.state is RolloutState.HALTED
    assert r.devices["d"].status is DeviceStatus.FAILED
    again = json.loads(json.dumps(r.to_dict()))  # written in today's format
    assert again["format"] == 3 and Rollout.from_dict(again).to_dict() == r.to_dict()
    r.resume(3)
    assert sorted(_assigned(r.tick(4))) == ["b", "c"]
    _install_all(r, ["b", "c"], 5)
    assert r.tick(6) == [Notify(RolloutState.COMPLETED, 1, "")]
    r.check_invariants()


def test_update_states_are_members_and_their_wire_values_mean_the_same() -> None:
    by_member, by_value = Rollout(_spec()), Rollout(_spec())
    wave0 = _assigned(by_member.start(_fleet(20), now=0))
    assert _assigned(by_value.start(_fleet(20), now=0)) == wave0
    events = [
        (wave0[0], UpdateState.DOWNLOADING),
        (wave0[0], UpdateState.INSTALLED),
        (wave0[1], UpdateState.ROLLED_BACK),  # the device undid the update: a failure
    ]
    for i, (device, state) in enumerate(events):
        assert by_member.report(device, state, 2, i) == by_value.report(device, state.value, 2, i)
    assert by_member.to_dict() == by_value.to_dict()
    assert by_member.devices[wave0[1]].status is DeviceStatus.FAILED
    # a state this build does not know (a newer device) is no decision, and no crash
    assert by_member.report(wave0[0], "warming-up", 2, 9) == []
    # snapshots hold plain strings only: JSON as they are
    assert json.loads(json.dumps(by_member.to_dict())) == by_member.to_dict()
