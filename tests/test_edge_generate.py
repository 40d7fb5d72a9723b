"""Text generation on the device: EdgeAgent.generate / chat over a real ONNX Runtime GenAI model.

The tiny device model is built once per module by ``tandem.demo.language``
(a handful of training steps, seconds) into a temporary cache; every test
runs it through ``onnxruntime_genai`` for real. No sleeps, no timings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_agent import (
    AsyncEdgeAgent,
    Conversation,
    EdgeAgent,
    FinishReason,
    GenerationRecord,
    InvalidInputError,
    LanguageRuntime,
    ModelLoadError,
    Sampling,
    TextOffloadUnavailableError,
)
from edge_agent.language import render_turn
from tandem.demo.language import (
    build_language_models,
    greedy_generate,
)

from ._language import tiny_recipe

# A context of 128 leaves room for a three-turn conversation.
TINY = tiny_recipe(context=128)
PROMPT = 'The "assert" statement'


@pytest.fixture(scope="module")
def device_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_language_models(tmp_path_factory.mktemp("lm-cache"), recipe=TINY).device_model


@pytest.fixture
def agent(device_model: Path) -> Iterator[EdgeAgent]:
    with EdgeAgent(None, device_id="phone-1", language_model=device_model) as agent:
        yield agent


def _language(agent: EdgeAgent) -> LanguageRuntime:
    assert agent.language is not None
    return agent.language


def test_greedy_chunks_equal_the_decoded_ids_and_greedy_generate(agent: EdgeAgent) -> None:
    runtime = _language(agent)
    stream = agent.generate(PROMPT, max_tokens=24)
    chunks = list(stream)
    record = stream.result
    assert record is not None
    text = "".join(c.text for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert {c.source.value for c in chunks} == {"edge"}
    assert sum(c.tokens for c in chunks) <= len(record.output_ids)
    assert text == record.text == runtime.decode(record.output_ids)

    reference = greedy_generate((runtime.model, runtime.tokenizer), PROMPT, 24)
    assert list(record.output_ids) == reference.tokens
    assert text == reference.text
    assert record.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert record.edge_tokens == len(record.output_ids) and record.cloud_tokens == 0
    assert record.prompt_tokens == record.prompt_tokens_prefilled == len(runtime.encode(PROMPT))
    assert record.prompt_tokens_reused == 0
    assert record.time_to_first_token_ms is not None and record.tokens_per_s is not None
    assert record.accelerator == "CPUExecutionProvider" and record.fallbacks == ()
    assert runtime.live_generators == 0  # a finished stream frees its generator


def test_max_tokens_is_respected(agent: EdgeAgent) -> None:
    stream = agent.generate(PROMPT, max_tokens=3)
    record = stream.final()
    assert record.finish_reason is FinishReason.LENGTH
    assert len(record.output_ids) == 3


def test_a_passed_deadline_ends_the_turn(agent: EdgeAgent) -> None:
    stream = agent.generate(PROMPT, max_tokens=50, deadline_ms=1e-6)
    record = stream.final()
    assert record.finish_reason is FinishReason.DEADLINE
    assert len(record.output_ids) < 50
    assert _language(agent).live_generators == 0


def test_closing_the_stream_cancels_and_frees_the_generator(agent: EdgeAgent) -> None:
    runtime = _language(agent)
    stream = agent.generate(PROMPT, max_tokens=40)
    first = next(stream)
    assert first.text and runtime.live_generators == 1
    stream.close()
    assert runtime.live_generators == 0
    record = stream.result
    assert record is not None and record.finish_reason is FinishReason.CANCELLED
    assert 1 <= len(record.output_ids) < 40
    assert list(stream) == []  # nothing after cancellation

    with agent.generate(PROMPT, max_tokens=40) as scoped:
        next(scoped)
        assert runtime.live_generators == 1
    assert runtime.live_generators == 0
    assert scoped.result is not None and scoped.result.finish_reason is FinishReason.CANCELLED

    dropped = agent.generate(PROMPT, max_tokens=40)
    next(dropped)
    del dropped  # garbage collected mid-turn: freed too
    assert runtime.live_generators == 0


def test_the_async_iterator_equals_the_sync_output(device_model: Path, agent: EdgeAgent) -> None:
    expected = agent.generate(PROMPT, max_tokens=20).final()

    async def main() -> tuple[list[str], GenerationRecord | None, int]:
        async with AsyncEdgeAgent(None, device_id="phone-2", language_model=device_model) as a:
            stream = a.generate(PROMPT, max_tokens=20)
            texts = [chunk.text async for chunk in stream]
            cancelled = a.generate(PROMPT, max_tokens=20)
            await cancelled.__anext__()
            await cancelled.aclose()
            assert cancelled.result is not None
            assert cancelled.result.finish_reason is FinishReason.CANCELLED
            assert a.language is not None
            return texts, stream.result, a.language.live_generators

    texts, record, live = asyncio.run(main())
    assert "".join(texts) == expected.text
    assert record is not None and record.output_ids == expected.output_ids
    assert live == 0


def test_sampled_text_is_repeatable_with_a_seed_and_decodes_whole(agent: EdgeAgent) -> None:
    runtime = _language(agent)
    sampling = Sampling(temperature=3.0, top_k=200, top_p=0.99, seed=7)
    streams = [agent.generate("héllo 世界 🙂", max_tokens=40, sampling=sampling) for _ in "ab"]
    chunks = [list(stream) for stream in streams]
    records = [stream.result for stream in streams]
    assert records[0] is not None and records[1] is not None
    assert records[0].output_ids == records[1].output_ids  # the seed reaches the generator
    assert "".join(c.text for c in chunks[0]) == records[0].text
    assert sum(c.tokens for c in chunks[0]) <= len(records[0].output_ids)
    # Random byte-level tokens need not form valid UTF-8: og's tokenizer.decode stops at
    # the first invalid byte, its stream goes on; the chunks are the stream's text.
    fresh = runtime.token_stream()
    eos = runtime.eos_token_ids
    assert "".join(fresh.decode(t) for t in records[0].output_ids if t not in eos) == (
        records[0].text
    )
    assert runtime.live_generators == 0
    greedy = agent.generate("héllo 世界 🙂", max_tokens=40).final()
    assert greedy.output_ids != records[0].output_ids  # sampling reaches it too


def test_multibyte_text_round_trips_through_the_chunk_decoder(agent: EdgeAgent) -> None:
    """The stream's detokenizer (og's tokenizer stream) yields whole characters only."""
    runtime = _language(agent)
    text = "héllo 世界 🙂 naïve — ok"
    ids = runtime.encode(text)
    assert len(ids) > len(text)  # characters split over several byte-level tokens
    decoder = runtime.token_stream()
    parts = [decoder.decode(token) for token in ids]
    assert "".join(parts) == text
    assert all("\ufffd" not in part for part in parts)
    assert "" in parts  # a token that completes no character yields no text

    # End to end: a conversation's history holds the multibyte prompt exactly.
    stream = agent.chat([{"role": "user", "content": text}], max_tokens=2)
    stream.final()
    conversation = stream.conversation
    assert conversation is not None
    prompt = render_turn([{"role": "user", "content": text}], first=True)
    assert runtime.decode(conversation.history).startswith(prompt)
    conversation.close()


def test_a_chat_reuses_its_kv_cache_and_matches_a_reprefilled_history(agent: EdgeAgent) -> None:
    runtime = _language(agent)
    pair = (runtime.model, runtime.tokenizer)
    turns = ["What does assert do?", "And raise?", "Thanks."]
    conversation: Conversation | None = None
    records = []
    for i, content in enumerate(turns):
        before = [] if conversation is None else list(conversation.history)
        stream = agent.chat(
            [{"role": "user", "content": content}], conversation=conversation, max_tokens=6
        )
        record = stream.final()
        conversation = stream.conversation
        assert conversation is not None
        new_ids = runtime.encode(render_turn([{"role": "user", "content": content}], first=i == 0))
        assert record.prompt_tokens == len(before) + len(new_ids)
        if i == 0:
            assert (record.prompt_tokens_reused, record.prompt_tokens_prefilled) == (
                0,
                len(new_ids),
            )
        else:  # only the new turn is prefilled; the history's KV cache is reused (but its
            # last token, which the generator produced and never fed itself: see _begin_turn)
            assert record.prompt_tokens_reused == len(before) - 1
            assert record.prompt_tokens_prefilled == len(new_ids) + 1
        assert conversation.history == before + new_ids + list(record.output_ids)
        reference = greedy_generate(pair, before + new_ids, 6)
        assert list(record.output_ids) == reference.tokens  # same as the history re-prefilled
        records.append(record)
    assert conversation is not None
    assert conversation.reprefills == 0 and conversation.turns == 3
    assert [m["role"] for m in conversation.messages] == ["user", "assistant"] * 3
    assert conversation.messages[-1]["content"] == records[-1].text
    assert runtime.live_generators == 1  # the conversation keeps its state
    conversation.close()
    assert runtime.live_generators == 0

    # A closed conversation re-prefills its whole history, with the same greedy answer.
    history = list(conversation.history)
    again = agent.chat(
        [{"role": "user", "content": "More?"}], conversation=conversation, max_tokens=6
    ).final()
    new_ids = runtime.encode(render_turn([{"role": "user", "content": "More?"}], first=False))
    assert again.prompt_tokens_reused == 0
    assert again.prompt_tokens_prefilled == len(history) + len(new_ids)
    assert list(again.output_ids) == greedy_generate(pair, history + new_ids, 6).tokens
    assert conversation.reprefills == 1
    conversation.close()


def test_a_conversation_takes_one_turn_at_a_time(agent: EdgeAgent) -> None:
    stream = agent.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
    conversation = stream.conversation
    with pytest.raises(InvalidInputError, match="turn in progress"):
        agent.chat([{"role": "user", "content": "Hi"}], conversation=conversation, max_tokens=4)
    stream.final()
    hi = [{"role": "user", "content": "Hi"}]
    second = agent.chat(hi, conversation=conversation, max_tokens=4)
    assert second.final().prompt_tokens_reused > 0
    assert conversation is not None
    conversation.close()


def test_a_refused_chat_turn_keeps_the_conversation_s_state(agent: EdgeAgent) -> None:
    stream = agent.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
    stream.final()
    conversation = stream.conversation
    assert conversation is not None and conversation.has_state
    messages, history = list(conversation.messages), list(conversation.history)
    with pytest.raises(TextOffloadUnavailableError):
        agent.chat(
            [{"role": "user", "content": "x"}], conversation=conversation, max_tokens=4,
            preset="cloud_only",
        )  # fmt: skip
    with pytest.raises(InvalidInputError, match="context"):
        agent.chat([{"role": "user", "content": "word " * 400}], conversation=conversation,
                   max_tokens=4)  # fmt: skip
    assert conversation.messages == messages and conversation.history == history
    assert conversation.has_state  # the kept KV cache survives a refused turn
    nxt = agent.chat([{"role": "user", "content": "Hi"}], conversation=conversation, max_tokens=2)
    assert nxt.final().prompt_tokens_reused == len(history) - 1  # its last token fed again
    conversation.close()


def test_a_cancelled_chat_turn_before_any_token_leaves_no_trace(agent: EdgeAgent) -> None:
    conversation = Conversation()
    hi = [{"role": "user", "content": "Hi"}]
    stream = agent.chat(hi, conversation=conversation, max_tokens=4)
    stream.close()
    assert conversation.messages == [] and conversation.history == []
    assert _language(agent).live_generators == 0


def test_presets(agent: EdgeAgent) -> None:
    record = agent.generate(PROMPT, max_tokens=2, preset="prefer_edge").final()
    assert record.preset == "prefer_edge" and record.edge_tokens == 2
    assert record.reason == "prefer_edge"
    assert any("not available" in note for note in record.fallbacks)
    # The rates are measured now: a turn that cannot finish in 1 ns is heavy, and stays here.
    assert _language(agent).rates is not None
    heavy = agent.generate(PROMPT, max_tokens=2, preset="prefer_edge", deadline_ms=1e-6).final()
    assert heavy.reason == "heavy" and heavy.cloud_tokens == 0
    assert any(note.startswith("heavy turn kept on the device") for note in heavy.fallbacks)
    assert agent.generate(PROMPT, max_tokens=2, deadline_ms=1e-6).final().reason == "edge_only"
    for preset in ("prefer_cloud", "cloud_only"):
        with pytest.raises(TextOffloadUnavailableError, match="cloud_language_model="):
            agent.generate(PROMPT, max_tokens=2, preset=preset)
    with pytest.raises(InvalidInputError, match="unknown preset"):
        agent.generate(PROMPT, max_tokens=2, preset="edge")
    assert _language(agent).live_generators == 0


def test_bad_requests_get_one_line_typed_errors(agent: EdgeAgent, device_model: Path) -> None:
    with pytest.raises(InvalidInputError, match="max_tokens"):
        agent.generate(PROMPT, max_tokens=0)
    with pytest.raises(InvalidInputError, match="prompt"):
        agent.generate("", max_tokens=2)
    with pytest.raises(InvalidInputError, match="context"):
        agent.generate("word " * 400, max_tokens=2)
    with pytest.raises(InvalidInputError, match="deadline_ms"):
        agent.generate(PROMPT, max_tokens=2, deadline_ms=-1)
    with pytest.raises(InvalidInputError, match="temperature"):
        Sampling(temperature=0)
    with pytest.raises(InvalidInputError, match="role"):
        agent.chat([{"role": "robot", "content": "x"}], max_tokens=2)
    with pytest.raises(ModelLoadError, match=r"genai_config\.json"):
        LanguageRuntime(device_model.parent / "missing")
    tensors_only = EdgeAgent(None, device_id="d", broker="mqtt://127.0.0.1:1", cloud_model="m")
    with pytest.raises(ModelLoadError, match="no language model"):
        tensors_only.generate(PROMPT, max_tokens=2)  # never started: no connection made


def test_the_runtime_reports_its_provider_and_measured_rates(agent: EdgeAgent) -> None:
    runtime = _language(agent)
    agent.generate(PROMPT, max_tokens=4).final()
    rates = runtime.rates
    assert rates is not None
    assert rates.prefill_tokens_per_s > 0 and rates.decode_tokens_per_s > 0
    assert runtime.accelerator == "CPUExecutionProvider"
    assert repr(runtime).endswith("on CPUExecutionProvider>")
    assert np.isfinite(rates.decode_tokens_per_s)


def test_the_end_of_sequence_token_stops_the_turn(agent: EdgeAgent) -> None:
    """Sampled hot, some seed reaches ``</s>``: finish ``stop``, the token is not decoded,
    and a conversation whose generator is done re-prefills its next turn."""
    runtime = _language(agent)
    (eos,) = runtime.eos_token_ids
    hello = [{"role": "user", "content": "Hi"}]
    for seed in range(200):
        sampling = Sampling(temperature=8.0, seed=seed)
        stream = agent.chat(hello, max_tokens=100, sampling=sampling)
        record = stream.final()
        if record.finish_reason is FinishReason.STOP:
            break
        assert stream.conversation is not None
        stream.conversation.close()
    else:
        pytest.fail("no seed reached the end-of-sequence token")
    assert record.output_ids[-1] == eos and eos not in record.output_ids[:-1]
    assert "</s>" not in record.text
    conversation = stream.conversation
    assert conversation is not None and conversation.has_state
    history = list(conversation.history)
    nxt = agent.chat(hello, conversation=conversation, max_tokens=3, sampling=sampling).final()
    assert nxt.prompt_tokens_reused == 0  # the done generator takes no more tokens
    assert nxt.prompt_tokens_prefilled == len(history) + len(
        runtime.encode(render_turn(hello, first=False))
    )
    assert conversation.reprefills == 1
    conversation.close()
    assert runtime.live_generators == 0


def test_an_async_chat_keeps_its_kv_cache_like_the_sync_one(
    device_model: Path, agent: EdgeAgent
) -> None:
    turns = [
        [{"role": "user", "content": "What does assert do?"}],
        [{"role": "user", "content": "Why?"}],
    ]
    sync_records = []
    conversation: Conversation | None = None
    for messages in turns:
        stream = agent.chat(messages, conversation=conversation, max_tokens=5)
        sync_records.append(stream.final())
        conversation = stream.conversation
    assert conversation is not None
    conversation.close()

    async def main() -> list[GenerationRecord]:
        records = []
        async with AsyncEdgeAgent(None, device_id="phone-3", language_model=device_model) as a:
            kept: Conversation | None = None
            for messages in turns:
                stream = a.chat(messages, conversation=kept, max_tokens=5)
                records.append(await stream.final())
                kept = stream.conversation
            assert kept is not None
            kept.close()
        return records

    async_records = asyncio.run(main())
    assert [r.output_ids for r in async_records] == [r.output_ids for r in sync_records]
    reused = async_records[1].prompt_tokens_reused
    assert reused == sync_records[1].prompt_tokens_reused > 0
