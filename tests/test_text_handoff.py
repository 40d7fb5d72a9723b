"""A turn handed to the hub mid-turn, on real Mosquitto and a real hub (tiny models).

The device's part is compared with the device model's own greedy decoding, the
hub's part with the hub model's greedy continuation of the prompt plus the
device's accepted ids, computed here by calling the hub model directly: no
token is repeated or missing at the splice.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from edge_agent import (
    AsyncEdgeAgent,
    EdgeAgent,
    FinishReason,
    HandoffPolicy,
    InvalidInputError,
    LanguageRuntime,
    Source,
)
from shared import GenerateRequest
from tandem.demo.language import greedy_generate, load_model

from ._text_mqtt import PROMPT, P, Peer, Served

# The tiny models repeat one token; after this prompt the hub, given the device's tokens,
# turns to another: the splice shows in the ids (a hub-first order would be caught).
SPLICE = "class import"
ALWAYS = -1.0  # minus a mean log-probability is never negative: every full window fires


def test_a_forced_handoff_splices_device_then_hub_text_with_no_token_lost(
    served: Served, reference: Any, peer: Callable[[str], Peer]
) -> None:
    spy = peer("spy-h1")
    spy.subscribe(f"{P}/dev/phone-h1/generate/+")
    policy = HandoffPolicy(window=2, threshold=ALWAYS)
    with served.agent("phone-h1") as agent:
        stream = agent.generate(SPLICE, max_tokens=30, preset="handoff", handoff=policy)
        chunks = list(stream)
        assert agent.language is not None and agent.language.live_generators == 0
    record = stream.result
    assert record is not None and not record.degraded, record
    at = record.handoff_at
    assert at is not None and at >= 2 and record.edge_tokens == at and record.cloud_tokens > 0
    assert record.reason == "handoff" and record.handoff_score is not None
    sources = [c.source for c in chunks]
    assert Source.EDGE in sources and sources == sorted(sources, key=lambda s: s is Source.CLOUD)
    device = load_model(served.device_model)
    prompt_ids = [int(t) for t in device[1].encode(SPLICE)]
    mine = greedy_generate(device, SPLICE, at)
    assert list(record.output_ids[:at]) == mine.tokens
    sent = spy.take()[1]  # what the hub was asked: the prompt plus every accepted token
    assert isinstance(sent, GenerateRequest) and sent.prompt is None
    assert sent.prompt_ids == (*prompt_ids, *record.output_ids[:at])
    assert sent.max_tokens == 30 - at
    edge_text = "".join(c.text for c in chunks if c.source is Source.EDGE)
    assert edge_text == mine.text
    hubs = greedy_generate(reference, prompt_ids + mine.tokens, 30 - at)
    assert hubs.tokens[0] not in mine.tokens  # the two sides are told apart by their ids
    assert list(record.output_ids[at:]) == hubs.tokens
    assert record.edge_tokens + record.cloud_tokens == len(record.output_ids) <= 30
    assert "".join(c.text for c in chunks) == record.text
    assert record.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert policy.realized_share == 1.0


def test_a_threshold_that_never_fires_leaves_the_turn_to_the_device(served: Served) -> None:
    policy = HandoffPolicy(window=2, threshold=math.inf)
    with served.agent("phone-h2") as agent:
        record = agent.generate(PROMPT, max_tokens=20, preset="handoff", handoff=policy).final()
    assert record.handoff_at is None and record.cloud_tokens == 0
    assert record.handoff_score is not None and math.isfinite(record.handoff_score)
    expected = greedy_generate(load_model(served.device_model), PROMPT, 20)
    assert list(record.output_ids) == expected.tokens and record.text == expected.text
    assert policy.realized_share == 0.0


def test_another_preset_only_scores_the_turn_for_calibration(served: Served) -> None:
    policy = HandoffPolicy(window=2, threshold=ALWAYS)
    with served.agent("phone-h3") as agent:
        record = agent.generate(PROMPT, max_tokens=12, preset="edge_only", handoff=policy).final()
    assert record.handoff_at is None and record.cloud_tokens == 0
    assert record.handoff_score is not None and policy.realized_share is None  # not counted
    with served.agent("phone-h3b") as agent, pytest.raises(InvalidInputError, match="handoff="):
        agent.generate(PROMPT, max_tokens=4, preset="handoff")


def test_a_hub_that_fails_after_the_handoff_leaves_the_device_to_finish(served: Served) -> None:
    policy = HandoffPolicy(window=2, threshold=ALWAYS)
    with served.agent("phone-h4", cloud="no-such-model") as agent:
        stream = agent.generate(PROMPT, max_tokens=24, preset="handoff", handoff=policy)
        chunks = list(stream)
    record = stream.result
    assert record is not None and record.degraded and record.cloud_tokens == 0
    at = record.handoff_at
    assert at is not None and any("hub failed" in f for f in record.fallbacks)
    assert {c.source for c in chunks} == {Source.EDGE}
    mine = greedy_generate(load_model(served.device_model), PROMPT, at)
    assert record.text.startswith(mine.text) and len(record.text) > len(mine.text)
    assert record.edge_tokens == len(record.output_ids) <= 24


def test_a_runtime_without_logits_refuses_the_handoff(served: Served) -> None:
    runtime = LanguageRuntime(served.device_model)
    runtime.logits = False  # as LiteRT-LM's runtime says of itself
    with EdgeAgent(None, device_id="phone-h6", language_model=runtime) as agent:
        policy = HandoffPolicy(threshold=1.0)
        with pytest.raises(InvalidInputError, match="logits"):
            agent.generate(PROMPT, max_tokens=4, preset="handoff", handoff=policy)
        with pytest.raises(InvalidInputError, match="logits"):
            agent.generate(PROMPT, max_tokens=4, handoff=policy)
    assert runtime.live_generators == 0


def test_the_async_twin_hands_off_the_same_way(served: Served) -> None:
    async def main() -> tuple[list[Source], Any]:
        agent = AsyncEdgeAgent(
            None, device_id="phone-h5", broker=served.url, language_model=served.device_model,
            cloud_language_model="tiny",
        )  # fmt: skip
        policy = HandoffPolicy(window=2, threshold=ALWAYS)
        async with agent:
            stream = agent.generate(SPLICE, max_tokens=12, preset="handoff", handoff=policy)
            sources = [c.source async for c in stream]
            return sources, stream.result

    sources, record = asyncio.run(main())
    assert record is not None and record.handoff_at is not None and not record.degraded
    assert sources[0] is Source.EDGE and sources[-1] is Source.CLOUD
    assert record.edge_tokens == record.handoff_at and record.cloud_tokens > 0
