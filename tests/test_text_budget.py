"""A budget for text, in turns or tokens, shared by prompt routing and the handoff: pure.

Synthetic turns (a prompt score, a window-uncertainty stream, a length) are
drawn here; the budget is checked by playing them through the policy one at a
time (``replay``, what a live turn does), on held-out turns from the
calibration's distribution and on shifted ones (longer turns, more uncertain
prompts and windows). Expected hub units are computed from the definitions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.language import (
    HandoffPolicy,
    TurnTrace,
    calibrate_thresholds,
    handoff_position,
    hub_share,
    hub_units,
    replay,
)


def turns(n: int, seed: int, *, shift: float = 0.0, longer: int = 0) -> list[TurnTrace]:
    """Turns whose prompt score and window stream share a per-turn difficulty."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        hard = rng.normal(shift, 1.0)
        length = int(rng.integers(8, 60)) + longer
        windows = rng.normal(hard * 0.5, 1.0, size=length - 3).cumsum() / 4 + hard
        out.append(TurnTrace(length, tuple(float(w) for w in windows), float(hard + rng.normal())))
    return out


def play(policy: HandoffPolicy, traces: list[TurnTrace], unit: str) -> float:
    hub = total = 0.0
    for trace in traces:
        at = replay(policy, trace)
        units = 1.0 if unit == "turns" else float(trace.tokens)
        total += units
        if at is not None:
            hub += 1.0 if unit == "turns" else float(trace.tokens - at)
    return hub / total


def test_a_turn_handed_off_at_j_of_n_gives_n_minus_j_hub_tokens_and_one_turn() -> None:
    trace = TurnTrace(10, (0.1, 0.5, 0.9, 0.2), prompt=2.0)  # windows after tokens 7..10
    assert handoff_position(trace, 0.4) == 8 and handoff_position(trace, 0.95) is None
    assert hub_units(trace, math.inf, 0.4, "tokens") == (2.0, 10.0)
    assert hub_units(trace, math.inf, 0.4, "turns") == (1.0, 1.0)
    assert hub_units(trace, math.inf, 0.95, "tokens") == (0.0, 10.0)
    assert hub_units(trace, 1.0, 0.95, "tokens") == (10.0, 10.0)  # routed on its prompt
    assert hub_units(trace, 3.0, 0.95, "turns") == (0.0, 1.0)
    policy = HandoffPolicy(threshold=0.4, prompt_threshold=math.inf)
    assert replay(policy, trace) == 8 and policy.realized_share == 1.0
    tokens = HandoffPolicy(threshold=0.4, unit="tokens")
    assert replay(tokens, trace) == 8 and tokens.realized_share == pytest.approx(0.2)
    routed = HandoffPolicy(threshold=math.inf, prompt_threshold=1.0, unit="tokens")
    assert replay(routed, trace) == 0 and routed.realized_share == 1.0
    with pytest.raises(ValueError):
        TurnTrace(2, (0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="unit"):
        HandoffPolicy(budget=0.2, unit="chars")


@pytest.mark.parametrize("unit", ["turns", "tokens"])
@pytest.mark.parametrize("prompt_share", [0.0, 0.5])
def test_calibration_splits_the_budget_between_the_prompt_and_the_handoff(
    unit: str, prompt_share: float
) -> None:
    traces = turns(400, seed=1)
    found = calibrate_thresholds(traces, 0.3, prompt_share=prompt_share, unit=unit)
    assert found.share == pytest.approx(0.3, abs=0.01)
    assert hub_share(traces, found.prompt, found.window, unit) == found.share
    on_prompt = hub_share(traces, found.prompt, math.inf, unit)
    assert on_prompt == pytest.approx(0.3 * prompt_share, abs=0.01)
    assert (found.prompt == math.inf) == (prompt_share == 0)
    nothing = calibrate_thresholds(traces, 0.0, prompt_share=prompt_share, unit=unit)
    assert nothing.share == 0.0 and nothing.window == nothing.prompt == math.inf


@pytest.mark.parametrize("unit", ["turns", "tokens"])
@pytest.mark.parametrize("prompt_share", [0.0, 0.4])
def test_the_budget_holds_within_two_points_on_held_out_and_shifted_turns(
    unit: str, prompt_share: float
) -> None:
    budget = 0.3
    held_out = turns(3000, seed=2)
    shifted = turns(3000, seed=3, shift=0.8, longer=30)
    for stream in (held_out, shifted):
        policy = HandoffPolicy(budget=budget, unit=unit, prompt_share=prompt_share, window=4)
        policy.calibrate_traces(turns(300, seed=1))
        share = play(policy, stream, unit)
        assert share == pytest.approx(budget, abs=0.02)
        assert policy.realized_share == pytest.approx(share, abs=1e-12)  # what it counted
    frozen = HandoffPolicy(budget=budget, unit=unit, prompt_share=prompt_share, adapt=False)
    frozen.calibrate_traces(turns(300, seed=1))
    assert abs(play(frozen, shifted, unit) - budget) > 0.05  # the shift is real


def test_the_prompt_part_of_the_budget_is_held_too() -> None:
    policy = HandoffPolicy(budget=0.3, unit="tokens", prompt_share=0.5)
    policy.calibrate_traces(turns(300, seed=1))
    stream = turns(3000, seed=4, shift=0.8, longer=30)
    routed = sum(t.tokens for t in stream if replay(policy, t) == 0)
    assert routed / sum(t.tokens for t in stream) == pytest.approx(0.15, abs=0.02)


def test_observe_only_turns_leave_their_traces_for_calibration() -> None:
    policy = HandoffPolicy(budget=0.25, window=2)
    watch = policy.watch(observe=False)
    assert watch.wants_prompt
    assert not watch.decide_prompt(5.0)
    for value in (0.1, 0.9, 0.3):
        assert not watch.push_value(value)
    watch.end(False, tokens=6, hub_tokens=0)
    assert list(policy.measured) == [TurnTrace(6, (0.1, 0.9, 0.3), 5.0)]
    policy.watch(observe=False).end(False, tokens=9, hub_tokens=9)  # the hub served it all
    assert len(policy.measured) == 1  # nothing the device saw: no trace
    assert policy.realized_share is None  # not counted
    with pytest.raises(ValueError, match="calibrate_traces"):
        HandoffPolicy(budget=0.2, unit="tokens").calibrate([0.1])


def test_a_budget_all_on_the_prompt_never_hands_off_mid_turn() -> None:
    policy = HandoffPolicy(budget=0.3, unit="tokens", prompt_share=1.0)
    policy.calibrate_traces(turns(300, seed=1))
    positions = [replay(policy, t) for t in turns(2000, seed=5, shift=0.8)]
    assert set(positions) == {0, None}  # whole turns, or none
    share = policy.realized_share
    assert share is not None and share == pytest.approx(0.3, abs=0.02)


def test_a_policy_refuses_settings_that_cannot_hold_a_budget() -> None:
    with pytest.raises(ValueError, match="prompt_share"):
        HandoffPolicy(budget=0.2, prompt_share=1.5)
    with pytest.raises(ValueError, match="prompt_threshold"):
        HandoffPolicy(budget=0.2, prompt_threshold=1.0)
    with pytest.raises(ValueError, match="prompt_router"):
        HandoffPolicy(budget=0.2, prompt_router=3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs budget"):
        HandoffPolicy(threshold=1.0).calibrate_traces(turns(5, seed=0))
    with pytest.raises(ValueError, match="at least one"):
        calibrate_thresholds([], 0.2)
    with pytest.raises(ValueError, match="unit"):
        calibrate_thresholds(turns(5, seed=0), 0.2, unit="chars")
