"""The rollout state machine's invariants, property-tested with Hypothesis: random
sequences of commands, joins, reports, heartbeats and ticks (timestamps out of
order included) never break ``check_invariants``, never assign a device twice,
move waves and states only the way they may, and a rollout restored from a
snapshot taken at any point goes on exactly like the original.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_cdn.rollout import Assign, Rollout, RolloutSpec, RolloutState, RolloutStateError
from shared import UpdateState

from ._rollout_machine import _fleet, _roundtrip, _spec

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
_command = st.sampled_from(["start", "pause", "resume", "abort", "rollback", "skip"]).map(
    lambda c: (c,)
)
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


def _versions() -> dict[str, int]:
    """Devices run different versions: most the baseline (1), every fourth 3, one unknown."""
    fleet = _fleet(_N, others=1)
    return {d: 3 if i % 4 == 3 else 1 for i, d in enumerate(sorted(fleet)) if i != 5}


def _back_to(device: str) -> int:
    return _versions().get(device, 1)  # unknown or joined later: the baseline


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
            return r.start(_fleet(_N, others=1), now, _versions())
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
        if kind == "skip":
            return r.skip_gate(now, by="ops", reason="property test")
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
                    # each device goes back to what it ran, never to the new version
                    assert not act.rollback or act.version == _back_to(act.device), act
        a.check_invariants()
        assert set(new_assigns.values()) <= {1} and set(back_assigns.values()) <= {1}
        # the wave only moves forward, and only on tick while running
        assert a.wave >= wave_before
        if a.wave > wave_before and before is not RolloutState.PENDING:
            assert event[0] == "tick" and before is RolloutState.RUNNING
        # halted and paused leave only via resume, abort or rollback
        if before in (RolloutState.HALTED, RolloutState.PAUSED) and a.state is RolloutState.RUNNING:
            assert event[0] in ("resume", "skip")
        if before in _TERMINAL_EXITS and a.state is not before:
            assert a.state in _TERMINAL_EXITS[before] and event[0] == "rollback"
        if a.state is RolloutState.ROLLED_BACK:
            assert set(back_assigns) == set(new_assigns)
        assert json.loads(json.dumps(a.to_dict())) == a.to_dict()
    if b is not None:
        assert b.to_dict() == a.to_dict()
