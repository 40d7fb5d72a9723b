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
    HealthMetrics,
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


def test_health_gate_halts_when_agreement_drops_beyond_margin() -> None:
    r = Rollout(_spec("10%,all", max_agreement_drop=0.02, min_health_samples=100))
    wave0 = _assigned(r.start(_fleet(20), now=0))
    _install_all(r, wave0, 1)
    assert r.tick(100) == []  # enabled health gate: no data yet, no next wave
    r.health(1, {"samples": 5000, "agreement": 0.95})
    r.health(2, HealthMetrics(samples=50, agreement=0.80))
    assert r.state is RolloutState.RUNNING  # too few samples to judge
    acts = r.health(2, {"samples": 400, "agreement": 0.92})
    assert acts == [
        Notify(RolloutState.HALTED, 0, "health gate: agreement 0.95 → 0.92 (margin 0.02)")
    ]
    assert r.tick(200) == [] and r.wave == 0


def test_health_within_margin_lets_the_wave_advance() -> None:
    r = Rollout(_spec("10%,all", max_agreement_drop=0.02, max_p99_latency_ratio=1.5))
    wave0 = _assigned(r.start(_fleet(20), now=0))
    _install_all(r, wave0, 1)
    r.health(1, {"samples": 500, "agreement": 0.95, "p99_latency_ms": 20.0})
    r.health(2, {"samples": 500, "agreement": 0.94, "p99_latency_ms": 25.0})
    r.health(7, {"samples": 500, "agreement": 0.10})  # another version: not ours
    assert len(_assigned(r.tick(60))) == 18


@pytest.mark.parametrize(
    ("gate", "old", "new"),
    [
        ({"max_error_rate_increase": 0.01}, {"error_rate": 0.01}, {"error_rate": 0.03}),
        ({"max_p99_latency_ratio": 1.2}, {"p99_latency_ms": 10.0}, {"p99_latency_ms": 13.0}),
        ({"max_offload_rate_increase": 0.05}, {"offload_rate": 0.1}, {"offload_rate": 0.2}),
    ],
)
def test_each_health_gate_halts(
    gate: dict[str, Any], old: dict[str, float], new: dict[str, float]
) -> None:
    r = Rollout(_spec(**gate, min_health_samples=1))
    r.start(_fleet(20), now=0)
    r.health(1, {"samples": 10, **old})
    r.health(2, {"samples": 10, **new})
    assert r.state is RolloutState.HALTED and r.reason.startswith("health gate")


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
    a = Rollout(_spec(max_agreement_drop=0.05, min_health_samples=1))
    wave0 = _assigned(a.start(_fleet(20), now=0))
    a.report(wave0[0], "installed", 2, 1)
    a.health(1, {"samples": 3, "agreement": 0.9})
    b = _roundtrip(a)
    assert b.to_dict() == a.to_dict()
    for r in (a, b):
        r.report(wave0[1], "installed", 2, 2)
        r.health(2, {"samples": 3, "agreement": 0.88})
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
    assert json.loads(json.dumps(r.to_dict())) == _EARLIER_SNAPSHOT
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
    st.just("health"), st.sampled_from([1, 2]), st.floats(0.9, 1.0), st.integers(3, 30)
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
        if kind == "health":
            return r.health(event[1], {"samples": event[3], "agreement": event[2]})
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


def test_resume_waives_a_tripped_health_gate_but_not_missing_data() -> None:
    r = Rollout(_spec("10%,all", max_agreement_drop=0.02, min_health_samples=1))
    _install_all(r, _assigned(r.start(_fleet(20), now=0)), 1)
    r.pause()
    r.resume(2)
    assert r.tick(100) == []  # no health data yet: still waiting
    r.health(1, {"samples": 9, "agreement": 0.95})
    r.health(2, {"samples": 9, "agreement": 0.90})
    assert r.state is RolloutState.HALTED
    r.resume(101)  # the operator accepts the drop
    assert len(_assigned(r.tick(102))) == 18
    r.health(2, {"samples": 20, "agreement": 0.85})  # new data trips it again
    assert r.state is RolloutState.HALTED
