"""The prompt score from logits, and the learned prompt router: pure parts.

Expected values are computed here from the definitions (softmax, log,
entropy) on given logits; the router is fitted on synthetic turns whose
outcome follows one feature, and must rank by it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.language import HandoffPolicy, PromptRouter, PromptScore, prompt_score

LOGITS = np.array(
    [
        [2.0, 1.0, 0.5, -1.0],
        [0.1, 0.2, 0.3, 0.4],
        [5.0, -3.0, 0.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
)
IDS = [3, 1, 2, 0]


def log_p(row: np.ndarray) -> np.ndarray:
    return np.log(np.exp(row) / np.exp(row).sum())


def test_the_score_is_the_mean_nll_of_each_token_given_the_ones_before() -> None:
    got = prompt_score(LOGITS, IDS)
    surprisal = [-log_p(LOGITS[i])[IDS[i + 1]] for i in range(3)]
    assert got.tokens == 3
    assert got.mean_nll == pytest.approx(np.mean(surprisal), abs=1e-12)
    assert got.max_surprisal == pytest.approx(max(surprisal), abs=1e-12)
    assert got.last_entropy == pytest.approx(math.log(4), abs=1e-12)  # uniform last row
    assert got.perplexity == pytest.approx(math.exp(got.mean_nll))
    assert prompt_score(LOGITS[None], IDS) == got  # get_output's [1, positions, vocab]
    one = prompt_score(LOGITS[:1], IDS[:1])
    assert one.tokens == 0 and one.mean_nll == 0.0
    with pytest.raises(ValueError):
        prompt_score(LOGITS, IDS[:3])
    with pytest.raises(ValueError):
        prompt_score(LOGITS, [0, 1, 2, 9])


def synthetic(n: int, seed: int) -> tuple[list[PromptScore], list[float]]:
    rng = np.random.default_rng(seed)
    scores, gains = [], []
    for _ in range(n):
        nll, surprise = rng.normal(4, 1), rng.normal(8, 2)
        scores.append(PromptScore(int(rng.integers(5, 90)), nll, surprise, rng.normal(3, 1)))
        gains.append(surprise - 8 + rng.normal(0, 0.5))  # the hub helps after a surprise
    return scores, gains


def test_a_learned_router_ranks_turns_by_what_predicts_the_hub_s_gain() -> None:
    scores, gains = synthetic(400, 1)
    router = PromptRouter.fit(scores, gains)
    assert router.l2 is not None and router.weights.shape == (4,)
    test, truth = synthetic(400, 2)
    values = np.array([router(s) for s in test])
    helped = np.array(truth) > 0
    pairs = values[helped][:, None] > values[~helped][None, :]
    assert pairs.mean() > 0.9  # AUC
    assert abs(router.weights[2]) == max(abs(router.weights))  # the surprisal column
    with pytest.raises(ValueError, match="same outcome"):
        PromptRouter.fit(scores, [1.0] * len(scores))
    with pytest.raises(ValueError):
        PromptRouter.fit(scores, gains[:-1])
    with pytest.raises(ValueError):
        PromptRouter([1.0, 2.0], 0.0, [0.0, 0.0], [1.0, 1.0])


def test_a_policy_with_a_router_routes_on_the_router_s_value() -> None:
    scores, gains = synthetic(200, 3)
    router = PromptRouter.fit(scores, gains)
    policy = HandoffPolicy(threshold=math.inf, prompt_threshold=0.0, prompt_router=router)
    for score in scores[:50]:
        watch = policy.watch()
        assert watch.prompt(score) == (router(score) > 0.0)
        assert watch.prompt_value == router(score) and watch.prompt_nll == score.mean_nll
