"""A chat turn handed to the hub mid-turn, on real Mosquitto and a real hub (tiny models).

The conversation must stay consistent for the next turn: its history is the
turn's prompt, the device's ids, then the hub's text encoded; and the next
local turn, which reuses the kept KV cache, answers exactly as the device
model does when fed that whole history afresh (computed here by calling the
device model directly).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from edge_agent import AsyncEdgeAgent, Conversation, HandoffPolicy, Source
from edge_agent.language import render_turn
from shared import GenerateRequest
from tandem.demo.language import greedy_generate, load_model

from ._text_mqtt import P, Peer, Served

ALWAYS = -1.0  # every full window fires
FIRST = [{"role": "user", "content": "class import"}]
SECOND = [{"role": "user", "content": "The with statement"}]


def encode(device: Any, text: str) -> list[int]:
    return [int(t) for t in device[1].encode(text)]


def next_turn_matches_a_fresh_model(agent: Any, conversation: Conversation, device: Any) -> None:
    before = list(conversation.history)
    record = agent.chat(SECOND, conversation=conversation, max_tokens=8).final()
    assert record.prompt_tokens_reused > 0  # the kept generator served it
    fresh = greedy_generate(device, before + encode(device, render_turn(SECOND, first=False)), 8)
    assert list(record.output_ids) == fresh.tokens


def test_a_chat_turn_handed_off_mid_turn_joins_the_conversation_whole(
    served: Served, peer: Callable[[str], Peer]
) -> None:
    spy = peer("spy-c1")
    spy.subscribe(f"{P}/dev/phone-c1/generate/+")
    policy = HandoffPolicy(window=2, threshold=ALWAYS)
    device = load_model(served.device_model)
    with served.agent("phone-c1") as agent:
        stream = agent.chat(FIRST, max_tokens=16, preset="handoff", handoff=policy)
        chunks = list(stream)
        record = stream.result
        conversation = stream.conversation
        assert record is not None and conversation is not None and not record.degraded
        at = record.handoff_at
        assert at is not None and at >= 2 and record.cloud_tokens > 0
        sources = [c.source for c in chunks]
        assert sources == sorted(sources, key=lambda s: s is Source.CLOUD)
        assert sources[0] is Source.EDGE and sources[-1] is Source.CLOUD
        prompt = encode(device, render_turn(FIRST, first=True))
        sent = spy.take()[1]
        assert isinstance(sent, GenerateRequest)
        assert sent.prompt_ids == (*prompt, *record.output_ids[:at])
        edge_text = "".join(c.text for c in chunks if c.source is Source.EDGE)
        hub_text = record.text[len(edge_text) :]
        assert hub_text and record.text == "".join(c.text for c in chunks)
        assert conversation.history == [
            *prompt, *record.output_ids[:at], *encode(device, hub_text)
        ]  # fmt: skip
        assert conversation.messages[-1] == {"role": "assistant", "content": record.text}
        assert conversation.has_state and conversation.turns == 1
        next_turn_matches_a_fresh_model(agent, conversation, device)
        assert conversation.turns == 2
        assert agent.language is not None
        conversation.close()
        assert agent.language.live_generators == 0


def test_a_hub_that_fails_a_handed_off_chat_turn_leaves_it_to_the_device(served: Served) -> None:
    policy = HandoffPolicy(window=2, threshold=ALWAYS)
    device = load_model(served.device_model)
    with served.agent("phone-c2", cloud="no-such-model") as agent:
        stream = agent.chat(FIRST, max_tokens=16, preset="handoff", handoff=policy)
        record = stream.final()
        conversation = stream.conversation
        assert conversation is not None and record.degraded and record.handoff_at is not None
        assert conversation.messages[-1] == {"role": "assistant", "content": record.text}
        prompt = encode(device, render_turn(FIRST, first=True))
        assert conversation.history[: len(prompt)] == prompt
        assert device[1].decode(conversation.history[len(prompt) :]) == record.text
        next_turn_matches_a_fresh_model(agent, conversation, device)
        conversation.close()


def test_the_async_chat_hands_off_the_same_way(served: Served) -> None:
    async def main() -> tuple[list[Source], Any, Any]:
        agent = AsyncEdgeAgent(
            None, device_id="phone-c3", broker=served.url, language_model=served.device_model,
            cloud_language_model="tiny",
        )  # fmt: skip
        policy = HandoffPolicy(window=2, threshold=ALWAYS)
        async with agent:
            stream = agent.chat(FIRST, max_tokens=12, preset="handoff", handoff=policy)
            sources = [c.source async for c in stream]
            return sources, stream.result, stream.conversation

    sources, record, conversation = asyncio.run(main())
    assert record is not None and record.handoff_at is not None and not record.degraded
    assert sources[0] is Source.EDGE and sources[-1] is Source.CLOUD
    assert conversation.messages[-1]["content"] == record.text and conversation.turns == 1
