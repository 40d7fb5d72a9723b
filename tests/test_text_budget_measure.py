"""``measure_text_collaboration`` on the tiny pair: its structure and invariants, not figures.

The quality arithmetic (``bench._text_collab_quality``) is checked on hand-made
turns: accuracy with a handoff point, the oracle's constraint (one handoff per
turn, within the share), random routing's share.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from bench._text_collab_measure import measure_text_collaboration
from bench._text_collab_quality import (
    accuracy_at,
    gap_recovered,
    gap_se,
    oracle_positions,
    random_positions,
    token_share,
)


def test_a_position_is_the_device_s_before_the_handoff_and_the_hub_s_after() -> None:
    dev = [np.array([1, 0, 0, 1], bool), np.array([0, 0, 1, 1], bool)]
    hub = [np.array([0, 1, 1, 1], bool), np.array([1, 1, 0, 0], bool)]
    assert accuracy_at(dev, hub, [None, None]) == 4 / 8
    assert accuracy_at(dev, hub, [0, 0]) == 5 / 8
    assert accuracy_at(dev, hub, [1, None]) == (1 + 3 + 2) / 8
    assert token_share([4, 4], [1, None]) == 3 / 8
    assert gap_recovered(0.55, 0.5, 0.6) == pytest.approx(0.5)
    assert math.isnan(gap_recovered(0.5, 0.5, 0.5))


def test_the_gap_s_standard_error_comes_from_resampling_turns() -> None:
    rng = np.random.default_rng(0)
    edge, hub = rng.normal(0, 1, 200), rng.normal(1, 1, 200)
    assert gap_se(hub, edge, hub) == pytest.approx(0.0, abs=1e-12)  # always all of it
    half = gap_se(np.where(rng.random(200) < 0.5, hub, edge), edge, hub)
    assert 0.0 < half < 0.2
    assert math.isnan(gap_se(hub[:1], edge[:1], hub[:1]))


def test_the_oracle_hands_off_once_per_turn_within_the_share() -> None:
    gains = {0: np.array([1.0, 2.0, 0.0]), 1: np.array([3.0, 0.5, 0.5])}
    at = oracle_positions([3, 3], lambda i: gains[i], 2 / 6)
    assert at == [1, None]  # 2 gain for 2 tokens beats 3 gain for 3, which no longer fits
    assert token_share([3, 3], at) <= 2 / 6
    shares = [token_share([5] * 10, random_positions([5] * 10, 0.3, np.random.default_rng(s)))
              for s in range(5)]  # fmt: skip
    assert all(s == 0.3 for s in shares)


def test_measure_text_collaboration_on_the_tiny_pair(tiny_language_models: Any) -> None:
    out = measure_text_collaboration(
        tiny_language_models, budget=0.3, budgets=(0.3,), max_tokens=6, stride=200,
        lengths=(8, 12, 16), limit=24, other_limit=12, fit_limit=24,
    )  # fmt: skip
    assert out["turns"]["test"] > 0 and out["turns"]["calibration"] > 0
    for part in ("accuracy", "hub_loglik"):
        figures = out[part]
        assert set(figures["routers"]) >= {"prompt", "random", "handoff/mean_entropy"}
        for rows in figures["routers"].values():
            (row,) = rows
            assert row["budget"] == 0.3 and 0.0 <= row["hub_token_share"] <= 1.0
            assert "gap_recovered" in row
    assert 0.0 <= out["accuracy"]["edge"] <= 1.0 and 0.0 <= out["accuracy"]["hub"] <= 1.0
    assert out["hub_loglik"]["edge"] <= 0.0 and out["hub_loglik"]["hub"] <= 0.0
    oracle = out["accuracy"]["routers"]["oracle"][0]
    assert oracle["hub_token_share"] <= 0.3 + 1e-9
    keys = out["budget_adherence"]
    assert {
        "heldout/tokens/adapt",
        "heldout/turns/adapt-slow",
        "longer_prompts/turns/frozen",
    } <= set(keys)
    assert all(0.0 <= v["share"] <= 1.0 for v in keys.values())
    methods = out["prompt_score_methods"]
    assert methods["plain onnxruntime"]["max_abs_diff_nats"] < 1e-3
    assert methods["token by token get_logits"]["max_abs_diff_nats"] < 1e-3
    assert out["target"]["accuracy"]["met"] in (True, False)
