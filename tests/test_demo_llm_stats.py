"""The ``tandem demo --llm`` figures and prompts, as pure functions: no model, no broker."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tandem.demo.language import (
    MIN_PROMPT_TOKENS,
    TurnFacts,
    heldout_prompts,
    percentile,
    prompt_lengths,
    summarize_preset,
    token_agreement,
    turn_side,
)


def _turn(side: str, edge: int, cloud: int, **kw: object) -> TurnFacts:
    fields: dict[str, object] = dict(
        prompt_tokens=10, output_tokens=edge + cloud, edge_tokens=edge, cloud_tokens=cloud,
        side=side, agreement=0.5, ttft_ms=1.0, tokens_per_s=100.0, total_ms=5.0,
        finish_reason="length", route_reason="prefer_edge",
    )  # fmt: skip
    fields.update(kw)
    return TurnFacts(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 9.0, 7.0]])
@pytest.mark.parametrize("q", [0, 1, 50, 99, 100])
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)


def test_token_agreement_counts_positions_and_misses_what_is_missing() -> None:
    assert token_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert token_agreement([1, 9, 3, 9], [1, 2, 3, 4]) == 0.5
    assert token_agreement([1, 2], [1, 2, 3, 4]) == 0.5  # stopped early: two misses
    assert token_agreement([2, 3, 4, 5], [1, 2, 3, 4]) == 0.0  # shifted by one: no credit
    assert token_agreement([1], []) == 0.0


def test_turn_side_by_tokens_then_by_route() -> None:
    assert turn_side(3, 0, routed_to_cloud=True) == "edge"  # the hub failed, the device served
    assert turn_side(0, 3, routed_to_cloud=False) == "cloud"
    assert turn_side(2, 3, routed_to_cloud=True) == "both"
    assert turn_side(0, 0, routed_to_cloud=True) == "cloud"
    assert turn_side(0, 0, routed_to_cloud=False) == "edge"


def test_summary_adds_up_by_side_and_takes_percentiles() -> None:
    turns = [
        _turn("edge", 4, 0, ttft_ms=1.0, tokens_per_s=100.0, agreement=1.0),
        _turn("cloud", 0, 6, ttft_ms=3.0, tokens_per_s=50.0, route_reason="heavy"),
        _turn(
            "both",
            2,
            3,
            ttft_ms=None,
            tokens_per_s=None,
            degraded=True,
            agreement=0.0,
            route_reason="heavy",
            finish_reason="deadline",
        ),
    ]
    s = summarize_preset("prefer_edge", turns)
    assert (s.turns, s.edge_turns, s.cloud_turns, s.both_turns) == (3, 1, 1, 1)
    assert (s.tokens, s.edge_tokens, s.cloud_tokens) == (15, 6, 9)
    assert (s.heavy_turns, s.deadline_turns, s.degraded_turns) == (2, 1, 1)
    assert s.agreement == pytest.approx(0.5)
    assert s.ttft_p50_ms == pytest.approx(2.0)  # the turn without a first token is left out
    assert s.tokens_per_s_p99 == pytest.approx(float(np.percentile([100.0, 50.0], 1)))
    assert s.to_dict()["preset"] == "prefer_edge"


def test_summary_of_turns_without_tokens_says_none_in_json() -> None:
    s = summarize_preset("cloud_only", [_turn("cloud", 0, 0, ttft_ms=None, tokens_per_s=None)])
    assert math.isnan(s.ttft_p50_ms)
    assert s.to_dict()["ttft_p50_ms"] is None and s.to_dict()["tokens_per_s_p50"] is None


def test_turn_side_is_checked() -> None:
    with pytest.raises(ValueError, match="side"):
        _turn("hub", 0, 1)


def test_prompt_lengths_spread_from_the_minimum_to_what_the_context_leaves() -> None:
    lengths = prompt_lengths(5, max_tokens=8, context=48)
    assert lengths[0] == MIN_PROMPT_TOKENS and lengths[-1] == 48 - 8 - 1
    assert lengths == sorted(lengths)
    with pytest.raises(ValueError, match="no room"):
        prompt_lengths(3, max_tokens=45, context=48)


def test_heldout_prompts_are_windows_with_their_next_tokens() -> None:
    docs = {"a": "abcdefghijklmnopqrstuvwxyz" * 4, "b": "0123456789" * 10}
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    decode = lambda ids: "".join(map(chr, ids))  # noqa: E731
    prompts = heldout_prompts(docs, count=4, max_tokens=5, context=40, encode=encode, decode=decode)
    assert len(prompts) == 4 and {p.document for p in prompts} == {"a", "b"}
    for p in prompts:
        whole = encode(docs[p.document])
        window = list(p.prompt_ids + p.reference_ids)
        start = next(i for i in range(len(whole)) if whole[i : i + len(window)] == window)
        assert decode(p.prompt_ids) == p.text and len(p.reference_ids) == 5
        assert whole[start + len(p.prompt_ids) : start + len(window)] == list(p.reference_ids)
    with pytest.raises(ValueError, match="room for"):
        heldout_prompts(docs, count=50, max_tokens=5, context=40, encode=encode, decode=decode)
