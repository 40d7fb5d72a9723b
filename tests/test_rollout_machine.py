"""The rollout state machine: waves, gates, pause/resume, rollback, persistence.

Pure and fast: no broker, no clock; time is whatever ``now`` the test passes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import model_cdn.rollout as rollout_pkg
from model_cdn.rollout import (
    Assign,
    DeviceStatus,
    Notify,
    Rollout,
    RolloutSpec,
    RolloutState,
    RolloutStateError,
    Unassign,
    Wave,
    parse_waves,
    plan_waves,
)
from shared import UpdateState

EU = {"region": "eu", "hw": "npu"}


def _fleet(n: int, *, others: int = 3) -> dict[str, dict[str, str]]:
    fleet = {f"dev-{i:03d}": dict(EU) for i in range(n)}
    fleet.update({f"us-{i}": {"region": "us", "hw": "npu"} for i in range(others)})
    return fleet


def _spec(waves: str = "10%,50%,all", **kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {
        "model": "mnist",
        "version": 2,
        "previous_version": 1,
        "waves": parse_waves(waves),
        "target": {"region": "eu"},
        "max_failure_rate": 0.1,
        "min_reports": 1,
        "soak_s": 60.0,
        "device_timeout_s": 1000.0,
    }
    base.update(kw)
    return RolloutSpec(**base)


def _assigned(actions: list[Any], *, rollback: bool = False) -> list[str]:
    return [a.device for a in actions if isinstance(a, Assign) and a.rollback == rollback]


def _install_all(r: Rollout, devices: list[str], now: float) -> list[Any]:
    out: list[Any] = []
    for d in devices:
        out += r.report(d, "installed", 2, now)
    return out


def _roundtrip(r: Rollout) -> Rollout:
    return Rollout.from_dict(json.loads(json.dumps(r.to_dict())))


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


class _Traffic:
    """Cumulative counters per device, fed to the rollout as heartbeats."""

    def __init__(self, r: Rollout) -> None:
        self.r = r
        self.counts: dict[str, list[int]] = {}

    def beat(
        self,
        devices: list[str],
        version: int,
        now: float,
        *,
        n: int = 100,
        agreement: float = 0.97,
        errors: float = 0.0,
        offloads: float = 1.0,
        p99: float = 10.0,
    ) -> None:
        for i, d in enumerate(devices):
            c = self.counts.setdefault(d, [0, 0, 0, 0])
            jitter = (i % 3) - 1  # devices differ a little: the variance is not zero
            c[0] += n
            c[1] += round(errors * n)
            c[2] += round(offloads * n)
            c[3] += min(n, max(0, round(agreement * n) + jitter))
            report = {
                "version": version,
                "requests": c[0],
                "errors": c[1],
                "offloads": c[2],
                "agreement_samples": c[0],
                "agreed": c[3],
                "p99_ms": p99 * (1 + 0.01 * jitter),
            }
            self.r.telemetry(d, report, now)


def _gated(waves: str = "25%,all", **kw: Any) -> RolloutSpec:
    gates: dict[str, Any] = {
        "max_agreement_drop": 0.02,
        "min_health_samples": 50,
        "soak_s": 10.0,
        "looks": 3,
        "max_soak_s": 30.0,
        **kw,
    }
    return _spec(waves, **gates)


def _cohorts(r: Rollout) -> tuple[list[str], list[str]]:
    book = r.health.book
    assert book is not None
    return book.members("new"), book.members("control")


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


def test_resume_waives_the_health_of_the_halted_wave_only() -> None:
    r = Rollout(_gated("10%,50%,all"))
    t = _Traffic(r)
    _install_all(r, _assigned(r.start(_fleet(40), now=0)), 1)
    new, control = _cohorts(r)
    for now in range(2, 11):
        t.beat(new, 2, now, agreement=0.8)
        t.beat(control, 1, now)
    r.tick(10)
    assert r.state is RolloutState.HALTED
    r.resume(11)  # the operator accepts the drop
    wave1 = _assigned(r.tick(12))
    assert len(wave1) == 16 and r.health.state == "waiting"  # the next wave is judged again
    _install_all(r, wave1, 13)
    new, control = _cohorts(r)
    for now in range(14, 23):
        t.beat(new, 2, now, agreement=0.8)
        t.beat(control, 1, now)
    r.tick(22)
    assert r.state is RolloutState.HALTED and r.wave == 1


def test_device_timeout_counts_as_failure() -> None:
    r = Rollout(_spec("10%,all", device_timeout_s=100.0, soak_s=1e6, max_failure_rate=0.0))
    wave0 = _assigned(r.start(_fleet(20), now=0))
    r.report(wave0[0], "installed", 2, 5)
    r.report(wave0[1], "downloading", 2, 5)  # progress is not a final report
    assert r.tick(99.9) == []
    acts = r.tick(100)
    assert r.devices[wave0[1]].status is DeviceStatus.TIMED_OUT
    assert acts == [Notify(RolloutState.HALTED, 0, "failure rate 1/2 above 0")]
    # a late report replaces the timeout
    r.report(wave0[1], "installed", 2, 150)
    assert r.devices[wave0[1]].status is DeviceStatus.INSTALLED and r.failed == 0


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
        Notify(RolloutState.ROLLED_BACK, 1, "every device is back on the previous version")
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
    assert again["format"] == 2 and Rollout.from_dict(again).to_dict() == r.to_dict()
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


# ----------------------------------------------------- property: invariants

_N = 12
_DEVICES = [f"dev-{i:03d}" for i in range(_N + 4)] + ["us-0", "stranger"]
_TERMINAL_EXITS = {
    # rollback() of a rollout that assigned nothing is rolled back at once
    RolloutState.COMPLETED: {RolloutState.ROLLING_BACK, RolloutState.ROLLED_BACK},
    RolloutState.ABORTED: {RolloutState.ROLLING_BACK, RolloutState.ROLLED_BACK},
    RolloutState.ROLLED_BACK: set(),
}

# A device is a name (maybe a stranger) or, more often, an index into the rollout's own devices.
_report = st.tuples(
    st.just("report"),
    st.sampled_from([*_DEVICES, *range(24)]).flatmap(
        lambda d: st.integers(0, 40) if isinstance(d, int) else st.just(d)
    ),
    st.sampled_from(
        [UpdateState.INSTALLED] * 4
        + [UpdateState.FAILED, UpdateState.ROLLED_BACK, UpdateState.DOWNLOADING, "installed"]
    ),
    st.sampled_from([2, 2, 2, 2, 1, 7]),
)
_tick = st.tuples(st.just("tick"))
# Reports and ticks are drawn more often than commands so that runs get past wave 0.
_health = st.tuples(
    st.just("beat"), st.integers(0, 40), st.sampled_from([1, 2]), st.integers(0, 30)
)
_command = st.sampled_from(["start", "pause", "resume", "abort", "rollback"]).map(lambda c: (c,))
_join = st.tuples(st.just("join"), st.sampled_from(_DEVICES), st.booleans())
# Reports and ticks are drawn far more often than commands so that runs get past wave 0.
_event = st.sampled_from(
    [*[_report] * 10, *[_tick] * 5, _health, _health, _join, _command]
).flatmap(lambda s: s)
_step = st.tuples(_event, st.floats(-2, 8))  # negative: an out-of-order timestamp


def _prop_spec() -> RolloutSpec:
    return _spec(
        "2,50%,all",
        max_failure_rate=0.5,
        min_reports=2,
        soak_s=10.0,
        device_timeout_s=60.0,
        max_agreement_drop=0.05,
        min_health_samples=5,
        looks=3,
        max_soak_s=30.0,
    )


def _resolve(r: Rollout, event: tuple[Any, ...]) -> tuple[Any, ...]:
    """Turn a device index into the name of one of the rollout's devices (or a stranger)."""
    if event[0] == "report" and isinstance(event[1], int):
        names = list(r.devices)
        return (event[0], names[event[1] % len(names)] if names else "stranger", *event[2:])
    return event


def _apply(r: Rollout, event: tuple[Any, ...], now: float) -> Any:
    kind = event[0]
    try:
        if kind == "start":
            return r.start(_fleet(_N, others=1), now)
        if kind == "join":
            return r.device_joined(event[1], {"region": "eu" if event[2] else "us"}, now)
        if kind == "report":
            return r.report(event[1], event[2], event[3], now)
        if kind == "beat":
            names = sorted(r.labels)
            device = names[event[1] % len(names)] if names else "stranger"
            report = {"version": event[2], "requests": event[3], "offloads": event[3]}
            report.update(agreement_samples=event[3], agreed=event[3] * 9 // 10)
            return r.telemetry(device, report, now)
        if kind == "tick":
            return r.tick(now)
        if kind in ("pause", "abort"):
            return getattr(r, kind)()
        return getattr(r, kind)(now)
    except RolloutStateError as e:
        return f"refused: {e}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_step, max_size=80), split=st.integers(0, 80), begin=st.booleans())
def test_invariants_hold_and_snapshots_resume_identically(
    steps: list[tuple[tuple[Any, ...], float]], split: int, begin: bool
) -> None:
    if begin:
        steps = [(("start",), 0.0), *steps]
    a = Rollout(_prop_spec())
    b: Rollout | None = None
    now = 0.0
    new_assigns: Counter[str] = Counter()
    back_assigns: Counter[str] = Counter()
    for i, (event, dt) in enumerate(steps):
        if i == split:
            b = _roundtrip(a)
            assert b.to_dict() == a.to_dict()
        now += dt
        event = _resolve(a, event)
        before, wave_before = a.state, a.wave
        out = _apply(a, event, now)
        if b is not None:
            assert _apply(b, event, now) == out
        if isinstance(out, list):
            for act in out:
                if isinstance(act, Assign):
                    (back_assigns if act.rollback else new_assigns)[act.device] += 1
        a.check_invariants()
        assert set(new_assigns.values()) <= {1} and set(back_assigns.values()) <= {1}
        # the wave only moves forward, and only on tick while running
        assert a.wave >= wave_before
        if a.wave > wave_before and before is not RolloutState.PENDING:
            assert event[0] == "tick" and before is RolloutState.RUNNING
        # halted and paused leave only via resume, abort or rollback
        if before in (RolloutState.HALTED, RolloutState.PAUSED) and a.state is RolloutState.RUNNING:
            assert event[0] == "resume"
        if before in _TERMINAL_EXITS and a.state is not before:
            assert a.state in _TERMINAL_EXITS[before] and event[0] == "rollback"
        if a.state is RolloutState.ROLLED_BACK:
            assert set(back_assigns) == set(new_assigns)
        assert json.loads(json.dumps(a.to_dict())) == a.to_dict()
    if b is not None:
        assert b.to_dict() == a.to_dict()
