"""The handoff's pure parts: window scores from logits, and the budgeted threshold.

Expected values are computed here from the definitions (softmax, log, entropy)
on given logits, never stored; the budget is checked on streams of synthetic
turn peaks, before and after the distribution shifts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent import InvalidInputError
from edge_agent.language import (
    DeviceRates,
    HandoffPolicy,
    ScoreWindow,
    StepScore,
    route_text,
    step_score,
    turn_peak,
    uncertainty,
    window_stats,
)

LOGITS = np.array(
    [
        [2.0, 1.0, 0.5, -1.0, 0.0],
        [0.1, 0.2, 0.3, 0.4, 0.5],
        [10.0, -3.0, 0.0, 1.0, 2.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [-2.0, 4.0, 1.0, 1.0, 3.0],
    ]
)
TOKENS = [1, 4, 0, 2, 4]


def by_hand(row: np.ndarray, token: int) -> tuple[float, float, float]:
    p = np.exp(row) / np.exp(row).sum()
    return math.log(p[token]), float(p[token]), float(-(p * np.log(p)).sum())


def test_a_step_s_scores_are_the_softmax_definitions() -> None:
    for row, token in zip(LOGITS, TOKENS, strict=True):
        got = step_score(row, token)
        logprob, prob, entropy = by_hand(row, token)
        assert got.token == token
        assert got.logprob == pytest.approx(logprob, abs=1e-12)
        assert got.prob == pytest.approx(prob, abs=1e-12)
        assert got.entropy == pytest.approx(entropy, abs=1e-12)


def test_get_logits_shapes_read_the_last_position_and_huge_logits_stay_finite() -> None:
    batched = LOGITS[None, :, :]  # [batch, positions, vocab]
    assert step_score(batched, 4) == step_score(LOGITS[-1], 4)
    big = step_score(np.array([1000.0, 0.0, -1000.0]), 0)
    assert big.prob == pytest.approx(1.0) and big.logprob == pytest.approx(0.0)
    assert math.isfinite(big.entropy)
    with pytest.raises(ValueError):
        step_score(LOGITS[0], 5)


def test_window_statistics_are_mean_log_prob_min_prob_and_mean_entropy() -> None:
    steps = [step_score(r, t) for r, t in zip(LOGITS, TOKENS, strict=True)]
    hand = [by_hand(r, t) for r, t in zip(LOGITS, TOKENS, strict=True)]
    window = ScoreWindow(3)
    for step in steps:
        window.push(step)
    last = hand[-3:]
    stats = window.stats()
    assert stats.tokens == 3 and window.full
    assert stats.mean_logprob == pytest.approx(np.mean([h[0] for h in last]))
    assert stats.min_prob == pytest.approx(min(h[1] for h in last))
    assert stats.mean_entropy == pytest.approx(np.mean([h[2] for h in last]))
    assert uncertainty(stats, "mean_logprob") == pytest.approx(-stats.mean_logprob)
    assert uncertainty(stats, "min_prob") == pytest.approx(1.0 - stats.min_prob)
    assert uncertainty(stats, "mean_entropy") == pytest.approx(stats.mean_entropy)
    whole = window_stats(steps)
    assert whole.min_prob == pytest.approx(min(h[1] for h in hand))


def steps_of(logprobs: list[float]) -> list[StepScore]:
    return [StepScore(0, lp, math.exp(lp), 0.0) for lp in logprobs]


def test_a_turn_s_peak_is_its_worst_full_window_and_the_watch_fires_above_the_threshold() -> None:
    lps = [-0.1, -0.2, -3.0, -0.1, -0.1, -0.1]
    expected = max(-np.mean(lps[i : i + 2]) for i in range(len(lps) - 1))
    assert turn_peak(steps_of(lps), "mean_logprob", 2) == pytest.approx(expected)
    assert turn_peak(steps_of(lps[:1]), "mean_logprob", 2) is None
    policy = HandoffPolicy(window=2, threshold=1.0)
    watch = policy.watch()
    fired = [watch.push(s) for s in steps_of(lps)]
    assert fired == [False, False, True, True, False, False]  # -mean of (-0.2,-3.0) = 1.6
    watch.end(True)
    watch.end(True)
    assert policy.realized_share == 1.0  # counted once
    quiet = policy.watch(observe=False)
    assert not any(quiet.push(s) for s in steps_of(lps))
    assert quiet.peak == pytest.approx(expected)


def run_stream(policy: HandoffPolicy, peaks: np.ndarray) -> float:
    handed = 0
    for peak in peaks:
        off = bool(peak > policy.threshold)
        # a handed-off turn's peak is known only up to the handoff: at least the threshold
        policy.record(float(min(peak, max(policy.threshold, peak - 0.5))), off)
        handed += off
    return handed / len(peaks)


@pytest.mark.parametrize("budget", [0.1, 0.2, 0.3])
def test_the_realized_share_holds_the_budget_and_follows_a_shift(budget: float) -> None:
    rng = np.random.default_rng(7)
    policy = HandoffPolicy(budget=budget, window=4)
    policy.calibrate(rng.gamma(2.0, 0.5, 500))
    held_out = rng.gamma(2.0, 0.5, 4000)
    assert abs(run_stream(policy, held_out) - budget) <= 0.02
    shifted = rng.gamma(2.0, 0.5, 4000) + 1.5  # harder prompts: every turn less sure
    before = policy.threshold
    share = run_stream(policy, shifted)
    assert policy.threshold > before
    assert abs(share - budget) <= 0.02
    easier = rng.gamma(4.0, 0.2, 4000)
    assert abs(run_stream(policy, easier) - budget) <= 0.02


def test_without_adapt_a_shift_breaks_the_budget_and_calibration_sets_the_quantile() -> None:
    rng = np.random.default_rng(3)
    calibration = rng.normal(0.0, 1.0, 1000)
    fixed = HandoffPolicy(budget=0.2, adapt=False)
    threshold = fixed.calibrate(calibration)
    assert np.mean(calibration > threshold) == pytest.approx(0.2, abs=0.002)
    assert run_stream(fixed, rng.normal(1.0, 1.0, 2000)) > 0.3  # what adapting prevents
    short = HandoffPolicy(budget=0.5)
    short.calibrate([None, None, None, 1.0])  # three too short to score: threshold below 1
    assert short.threshold < 1.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        HandoffPolicy(budget=0.1, threshold=1.0)
    with pytest.raises(ValueError):
        HandoffPolicy(score="perplexity", budget=0.1)
    with pytest.raises(ValueError):
        HandoffPolicy(budget=1.5)
    with pytest.raises(ValueError):
        HandoffPolicy(threshold=1.0).calibrate([1.0])


def test_the_handoff_preset_routes_like_prefer_edge() -> None:
    slow = DeviceRates(10.0, 1.0)
    kw: dict[str, object] = {"prompt_tokens": 10, "max_tokens": 50, "rates": slow}
    assert route_text("handoff", deadline_ms=None, offload_available=True, **kw).side == "edge"
    heavy = route_text("handoff", deadline_ms=100.0, offload_available=True, **kw)
    assert (heavy.side, heavy.reason) == ("cloud", "heavy")
    alone = route_text("handoff", deadline_ms=None, offload_available=False, **kw)
    assert (alone.side, alone.reason) == ("edge", "handoff") and alone.notes
    with pytest.raises(InvalidInputError, match="handoff"):
        route_text("hand-off", deadline_ms=None, offload_available=True, **kw)
