"""Prompt-level routing and the budget on real Mosquitto and a real hub (tiny models).

The prompt score the stream reads from its own prefill is compared with one
computed here from the device model's logits fed a token at a time
(``get_logits`` after each append): two ways to the same numbers. A turn
routed on its prompt is the hub model's greedy answer to the prompt, with no
device token.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnxruntime_genai as og
import pytest

from edge_agent import HandoffPolicy, Source
from edge_agent.language import prompt_score
from tandem.demo.language import greedy_generate, load_model

from ._text_mqtt import PROMPT, Served


def stepwise_logits(model_dir: Any, ids: list[int]) -> np.ndarray:
    model, _ = load_model(model_dir)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1)
    generator = og.Generator(model, params)
    rows = []
    for token in ids:
        generator.append_tokens(np.asarray([token], dtype=np.int32))
        rows.append(np.asarray(generator.get_logits(), dtype=np.float64).reshape(-1))
    return np.stack(rows)


def test_a_prompt_over_the_prompt_threshold_goes_to_the_hub_whole(
    served: Served, reference: Any
) -> None:
    policy = HandoffPolicy(threshold=math.inf, prompt_threshold=-1.0)  # every prompt routes
    with served.agent("phone-b1") as agent:
        stream = agent.generate(PROMPT, max_tokens=16, preset="handoff", handoff=policy)
        chunks = list(stream)
        assert agent.language is not None and agent.language.live_generators == 0
    record = stream.result
    assert record is not None and not record.degraded, record
    assert record.handoff_at == 0 and record.edge_tokens == 0 and record.cloud_tokens > 0
    assert {c.source for c in chunks} == {Source.CLOUD}
    device = load_model(served.device_model)
    ids = [int(t) for t in device[1].encode(PROMPT)]
    assert list(record.output_ids) == greedy_generate(reference, ids, 16).tokens
    by_hand = prompt_score(stepwise_logits(served.device_model, ids), ids)
    assert record.prompt_score == pytest.approx(by_hand.mean_nll, abs=1e-4)
    assert by_hand.tokens == len(ids) - 1 and record.prompt_score > 0
    assert policy.realized_share == 1.0


def test_observe_only_turns_calibrate_a_token_budget_that_then_routes_and_hands_off(
    served: Served,
) -> None:
    policy = HandoffPolicy(budget=0.5, unit="tokens", prompt_share=0.5, window=2)
    prompts = [PROMPT, "class import", "The with statement", "def lambda", "if x:"]
    with served.agent("phone-b2") as agent:
        for prompt in prompts:  # another preset only measures: the calibration turns
            record = agent.generate(prompt, max_tokens=12, preset="edge_only", handoff=policy)
            done = record.final()
            assert done.cloud_tokens == 0 and done.prompt_score is not None
        traces = list(policy.measured)
        assert len(traces) == len(prompts) and policy.realized_share is None
        assert all(t.prompt is not None and t.windows for t in traces)
        found = policy.calibrate_traces()
        assert found.share > 0 and math.isfinite(found.prompt)
        sides = []
        for prompt in prompts:
            done = agent.generate(prompt, max_tokens=12, preset="handoff", handoff=policy).final()
            assert not done.degraded, done
            sides.append(done.handoff_at)
    assert 0 in sides  # a prompt routed whole, as calibrated
    share = policy.realized_share
    assert share is not None and 0.0 < share <= 1.0
