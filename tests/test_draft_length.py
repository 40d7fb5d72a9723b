"""The speculative draft length (edge_agent.language: DraftLength, best_k, expected_tokens)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edge_agent import InvalidInputError
from edge_agent.language import DraftLength, best_k, crossover, expected_tokens, round_seconds


def test_expected_tokens_is_the_truncated_geometric_sum() -> None:
    for alpha in (0.0, 0.3, 0.8, 0.99):
        for k in (0, 1, 4, 16):
            assert expected_tokens(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 5) == 1.0
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(InvalidInputError, match="acceptance"):
            expected_tokens(bad, 3)


def test_expected_tokens_matches_simulated_rounds() -> None:
    rng = np.random.default_rng(0)
    alpha, k = 0.7, 5
    accepted = rng.random((20000, k)) < alpha
    tokens = np.where(accepted.all(axis=1), k, np.argmin(accepted, axis=1)) + 1
    assert tokens.mean() == pytest.approx(expected_tokens(alpha, k), rel=0.02)


def brute_best(alpha: float, rtt: float, verify: float, draft: float, k_max: int) -> int:
    rates = [expected_tokens(alpha, k) / (rtt + verify + k * draft) for k in range(1, k_max + 1)]
    return 1 + int(np.argmax(rates))


def test_best_k_maximizes_tokens_per_second_of_the_round_model() -> None:
    for alpha in (0.2, 0.5, 0.8, 0.95):
        for rtt in (0.005, 0.02, 0.1):
            for draft in (0.002, 0.01):
                want = brute_best(alpha, rtt, 0.01, draft, 16)
                assert best_k(alpha, rtt, 0.01, draft, 16) == want


def test_best_k_grows_with_the_round_trip_at_high_acceptance() -> None:
    ks = [best_k(0.9, rtt, 0.005, 0.005, 16) for rtt in (0.001, 0.005, 0.02, 0.05, 0.1)]
    assert ks == sorted(ks) and ks[-1] > ks[0]
    assert best_k(0.9, 0.1, 0.005, 0.005, 16) >= 10


def test_best_k_shrinks_with_low_acceptance() -> None:
    ks = [best_k(alpha, 0.05, 0.005, 0.005, 16) for alpha in (0.95, 0.8, 0.5, 0.2)]
    assert ks == sorted(ks, reverse=True) and ks[-1] < ks[0]
    assert best_k(0.05, 0.05, 0.005, 0.005, 16) <= 2
    assert best_k(0.0, 0.05, 0.005, 0.005, 16, k_min=3) == 3  # nothing helps: the least


def test_drafting_ahead_shortens_the_round_by_the_overlap_and_lengthens_k() -> None:
    plain = round_seconds(0.8, 4, 0.05, 0.01, 0.005)
    assert plain == pytest.approx(0.05 + 0.01 + 4 * 0.005)
    ahead = round_seconds(0.8, 4, 0.05, 0.01, 0.005, ahead=True)
    assert ahead == pytest.approx(plain - 0.8**5 * 4 * 0.005)  # drafting fits in flight
    longer = round_seconds(0.8, 4, 0.001, 0.001, 0.005, ahead=True)
    assert longer == pytest.approx(0.002 + 0.02 - 0.8**5 * 0.002)  # the flight bounds it
    for k in range(1, 17):  # never slower; most saved where all drafts are likely kept
        saved = round_seconds(0.9, k, 0.02, 0.005, 0.005) - round_seconds(
            0.9, k, 0.02, 0.005, 0.005, ahead=True
        )
        assert saved == pytest.approx(0.9 ** (k + 1) * min(k * 0.005, 0.025))


def test_best_k_checks_its_bounds() -> None:
    assert best_k(1.0, 0.0, 0.0, 0.0, 8, k_min=2) == 2  # every rate infinite: the first
    assert best_k(1.0, 0.05, 0.0, 0.001, 8) == 8
    with pytest.raises(InvalidInputError, match="above k_max"):
        best_k(0.5, 0.01, 0.0, 0.001, 2, k_min=3)
    with pytest.raises(InvalidInputError, match="rtt_s"):
        best_k(0.5, -0.01, 0.0, 0.001, 4)


def feed(
    length: DraftLength, rng: np.random.Generator, alpha: float, rtt: float, n: int
) -> list[int]:
    ks = []
    for _ in range(n):
        k = length.k
        kept = rng.random(k) < alpha
        accepted = k if kept.all() else int(np.argmin(kept))
        length.observe(rtt, k, accepted, 0.004)
        ks.append(length.k)
    return ks


def test_draft_length_moves_toward_best_k_by_at_most_two() -> None:
    length = DraftLength(k_min=1, k_max=16, start=4)
    rng = np.random.default_rng(1)
    ks = [4]
    for _ in range(8):
        length.observe(0.08, length.k, length.k, 0.004)
        ks.append(length.k)
    assert ks == [4, 6, 8, 10, 12, 14, 16, 16, 16]  # every draft kept: full steps to k_max
    ks = feed(length, rng, 0.95, 0.08, 60)
    assert all(abs(b - a) <= 2 for a, b in itertools.pairwise(ks))
    assert min(ks[-20:]) >= 10
    assert length.alpha is not None and length.rtt_s == pytest.approx(0.08)
    low = feed(length, rng, 0.1, 0.08, 60)
    assert all(abs(b - a) <= 2 for a, b in itertools.pairwise(low))
    assert low[-1] <= 2


def test_draft_length_stays_in_its_bounds() -> None:
    length = DraftLength(k_min=2, k_max=6, start=3)
    rng = np.random.default_rng(2)
    ks = feed(length, rng, 0.99, 0.2, 30) + feed(length, rng, 0.0, 0.2, 30)
    assert min(ks) == 2 and max(ks) == 6
    assert all(2 <= k <= 6 for k in ks)


def test_the_averages_converge_to_the_true_acceptance_and_round_trip() -> None:
    for alpha in (0.3, 0.6, 0.9):
        length = DraftLength(k_min=3, k_max=3, start=3, smoothing=0.05)
        rng = np.random.default_rng(3)
        estimates = []
        for _ in range(2000):
            kept = rng.random(3) < alpha
            accepted = 3 if kept.all() else int(np.argmin(kept))
            length.observe(0.03 + rng.normal(0, 0.002), 3, accepted, 0.004)
            estimates.append(length.alpha)
        assert float(np.mean(estimates[-1000:])) == pytest.approx(alpha, abs=0.03)
        assert length.rtt_s == pytest.approx(0.03, abs=0.003)


def test_observe_refuses_rounds_that_cannot_be() -> None:
    length = DraftLength()
    with pytest.raises(InvalidInputError, match=r"outside 0\.\.drafted"):
        length.observe(0.01, 2, 3, 0.001)
    with pytest.raises(InvalidInputError, match="rtt_s"):
        length.observe(math.inf, 2, 1, 0.001)
    with pytest.raises(InvalidInputError, match="drafted"):
        length.observe(0.01, -1, 0, 0.001)
    length.observe(0.01, 0, 0, 0.001)
    assert length.k == 4  # nothing drafted: nothing learned
    assert length.alpha is None
    with pytest.raises(InvalidInputError, match="start"):
        DraftLength(k_min=2, k_max=4, start=5)
    with pytest.raises(InvalidInputError, match="smoothing"):
        DraftLength(smoothing=0)


def spec_s_per_token(alpha: float, k: int, rtt: float, h: float, draft: float, v: float,
                     ahead: bool) -> float:  # fmt: skip
    return round_seconds(alpha, k, rtt, v * h, draft, ahead=ahead) / expected_tokens(alpha, k)


@pytest.mark.parametrize("ahead", [False, True])
def test_crossover_is_where_a_round_per_token_equals_the_hubs_time_per_token(ahead: bool) -> None:
    cases = [  # alpha, k, rtt, draft, verify passes: drafting shorter and longer than the flight
        (0.8, 4, 0.05, 0.002, 1.0),
        (0.9, 8, 0.005, 0.01, 1.0),
        (0.6, 3, 0.02, 0.0, 1.5),
        (0.95, 16, 0.1, 0.02, 2.0),
        (0.7, 6, 0.001, 0.03, 0.5),
    ]
    for alpha, k, rtt, draft, v in cases:
        h = crossover(alpha, k, rtt, draft, verify_passes=v, ahead=ahead)
        assert 0 < h < math.inf
        at = spec_s_per_token(alpha, k, rtt, h, draft, v, ahead)
        assert at == pytest.approx(h, rel=1e-9)  # break-even
        assert spec_s_per_token(alpha, k, rtt, h * 1.01, draft, v, ahead) < h * 1.01
        assert spec_s_per_token(alpha, k, rtt, h * 0.99, draft, v, ahead) > h * 0.99


def test_crossover_is_the_round_trip_over_the_tokens_accepted_per_round() -> None:
    for alpha, k in ((0.5, 2), (0.8, 4), (0.9, 8)):
        accepted = expected_tokens(alpha, k) - 1
        assert crossover(alpha, k, 0.05) == pytest.approx(0.05 / accepted)
        assert crossover(alpha, k, 0.05, 0.004) == pytest.approx((0.05 + k * 0.004) / accepted)
    assert crossover(0.0, 4, 0.05) == math.inf  # nothing accepted: never wins
    assert crossover(0.5, 1, 0.05, verify_passes=2.0) == math.inf  # E = 1.5 <= 2 passes
    assert crossover(0.9, 4, 0.1) > crossover(0.9, 4, 0.02)  # a longer link needs a slower hub
    assert crossover(0.5, 4, 0.05) > crossover(0.9, 4, 0.05)  # more acceptance wins sooner
    assert crossover(0.9, 4, 0.05, 0.005, ahead=True) < crossover(0.9, 4, 0.05, 0.005)


def test_crossover_for_a_latency_target_below_break_even() -> None:
    for ahead in (False, True):
        h = crossover(0.9, 6, 0.05, 0.003, ratio=0.65, ahead=ahead)
        assert spec_s_per_token(0.9, 6, 0.05, h, 0.003, 1.0, ahead) == pytest.approx(0.65 * h)
        assert h > crossover(0.9, 6, 0.05, 0.003, ahead=ahead)
    with pytest.raises(InvalidInputError, match="ratio"):
        crossover(0.9, 6, 0.05, ratio=0)
