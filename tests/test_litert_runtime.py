"""The second device runtime, LiteRT-LM: EdgeAgent.generate / chat on a real ``.litertlm``.

The tiny pair is built with an FP32 device model (``tests/_language.py``, seconds), and
its checkpoint is converted by litert-torch into ``model.litertlm`` (FP32 weights) once
per module, beside it in the cache entry. Both runtimes then run the same weights: the
greedy tokens must be equal. The conversion needs ``pip install 'tandem[litert-lm-build]'``,
which ``make test`` does not install (its install and conversion exceed the suite's
budget: docs/language-models.md), so those tests skip where it is absent. The tests at
the end need no LiteRT-LM. No sleeps, no timings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent import (
    Conversation,
    EdgeAgent,
    FinishReason,
    LiteRTLanguageRuntime,
    ModelLoadError,
    RuntimeUnavailableError,
    Sampling,
    load_language_runtime,
)
from edge_agent.language import render_turn
from edge_agent.language._litert_runtime import TextPieces
from tandem.demo.language import (
    LanguageModels,
    build_language_models,
    build_litert_model,
    litert_build_available,
)

from ._language import tiny_recipe

TINY = dataclasses.replace(tiny_recipe(context=128), device_precision="fp32")
PROMPTS = ['The "assert" statement', "Class definitions", "x = 1\nif x", "for item in"]

needs_litert = pytest.mark.skipif(
    not litert_build_available(),
    reason="needs pip install 'tandem[litert-lm-build]' (not in dev: see docs/language-models.md)",
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> LanguageModels:
    return build_language_models(tmp_path_factory.mktemp("lm-cache"), recipe=TINY)


@pytest.fixture(scope="module")
def agents(pair: LanguageModels) -> Iterator[tuple[EdgeAgent, EdgeAgent]]:
    """``(LiteRT-LM agent, ONNX Runtime GenAI agent)`` on the same FP32 weights."""
    folder = build_litert_model(pair, quantization="none")
    with (
        EdgeAgent(None, device_id="litert", language_model=folder) as litert,
        EdgeAgent(None, device_id="ort", language_model=pair.device_model) as ort,
    ):
        yield litert, ort


@needs_litert
def test_the_folder_picks_the_runtime_and_greedy_tokens_equal_ort_genai(
    agents: tuple[EdgeAgent, EdgeAgent],
) -> None:
    litert, ort = agents
    runtime = litert.language
    assert isinstance(runtime, LiteRTLanguageRuntime) and runtime.kind == "litert-lm"
    assert ort.language is not None and ort.language.kind == "onnxruntime-genai"
    assert runtime.context_length == TINY.context  # the KV cache the conversion gave it
    assert runtime.eos_token_ids == ort.language.eos_token_ids
    for prompt in PROMPTS:
        assert runtime.encode(prompt) == ort.language.encode(prompt)
        stream = litert.generate(prompt, max_tokens=20)
        chunks = list(stream)
        record = stream.result
        assert record is not None
        reference = ort.generate(prompt, max_tokens=20).final()
        assert list(record.output_ids) == list(reference.output_ids), prompt
        assert record.text == reference.text == "".join(c.text for c in chunks)
        assert record.finish_reason == reference.finish_reason
        assert record.prompt_tokens == reference.prompt_tokens
        assert record.accelerator == "LiteRT-LM cpu"
    # LiteRT-LM streams text: byte-level tokens that form no character reach the agent as
    # U+FFFD, re-encoded, so there the ids part (this 4-step model emits such bytes here).
    multibyte = "héllo 世界"
    assert runtime.encode(multibyte) == ort.language.encode(multibyte)
    record = litert.generate(multibyte, max_tokens=8).final()
    assert record.text == runtime.decode(record.output_ids)
    assert runtime.decode(runtime.encode(multibyte)) == multibyte
    lone = [runtime.decode([t]) for t in runtime.encode("世界")]  # engine.detokenize raises
    assert "\ufffd" in "".join(lone)
    assert runtime.rates is not None  # measured, for the presets' heavy rule
    assert runtime.live_generators == 0


@needs_litert
def test_a_chat_reprefills_each_turn_and_answers_as_ort_genai(
    agents: tuple[EdgeAgent, EdgeAgent],
) -> None:
    """A LiteRT-LM session cannot rewind: each turn prefills the whole history again
    (ORT GenAI reuses its KV cache), with the same greedy replies."""
    litert, ort = agents
    assert litert.language is not None
    conversations: list[Conversation | None] = [None, None]
    for i, content in enumerate(["What does assert do?", "And raise?", "Thanks."]):
        records = []
        for side, agent in enumerate((litert, ort)):
            stream = agent.chat(
                [{"role": "user", "content": content}],
                conversation=conversations[side],
                max_tokens=6,
            )
            records.append(stream.final())
            conversations[side] = stream.conversation
        mine, theirs = records
        assert list(mine.output_ids) == list(theirs.output_ids)
        assert mine.prompt_tokens == theirs.prompt_tokens
        assert mine.prompt_tokens_reused == 0
        assert mine.prompt_tokens_prefilled == mine.prompt_tokens
        if i:
            assert theirs.prompt_tokens_reused > 0
    kept, reference = conversations
    assert kept is not None and reference is not None
    assert kept.history == reference.history and kept.turns == 3
    assert kept.reprefills == 2 and not kept.has_state
    assert litert.language.live_generators == 0  # freed at each turn's end
    first = render_turn([{"role": "user", "content": "What does assert do?"}], first=True)
    assert litert.language.decode(kept.history).startswith(first)
    reference.close()


@needs_litert
def test_closing_a_stream_cancels_the_session_and_a_seed_repeats_a_sample(
    agents: tuple[EdgeAgent, EdgeAgent],
) -> None:
    litert, _ = agents
    runtime = litert.language
    assert runtime is not None
    stream = litert.generate(PROMPTS[0], max_tokens=60)
    next(stream)
    assert runtime.live_generators == 1
    stream.close()
    assert stream.result is not None and stream.result.finish_reason == FinishReason.CANCELLED
    assert runtime.live_generators == 0

    sampling = Sampling(temperature=3.0, top_k=200, seed=7)
    first, second = (litert.generate(PROMPTS[1], max_tokens=24, sampling=sampling).final()
                     for _ in "ab")  # fmt: skip
    assert first.output_ids == second.output_ids
    reseeded = dataclasses.replace(sampling, seed=8)
    other = litert.generate(PROMPTS[1], max_tokens=24, sampling=reseeded).final()
    assert other.output_ids != first.output_ids  # the seed reaches the session's sampler
    greedy = litert.generate(PROMPTS[1], max_tokens=24).final()
    assert greedy.output_ids != first.output_ids  # the sampler reaches the session


@needs_litert
def test_turns_back_to_back_give_the_same_greedy_text(agents: tuple[EdgeAgent, EdgeAgent]) -> None:
    """Tokenizing with litert_lm's Engine while its session decoded aborted the process
    within 60 such turns (heap corruption): the runtime tokenizes with tokenizers."""
    litert, _ = agents
    records = [litert.generate(PROMPTS[i % 2], max_tokens=96).final() for i in range(60)]
    assert {r.text for r in records[0::2]} == {records[0].text}
    assert {r.text for r in records[1::2]} == {records[1].text}
    assert all(len(r.output_ids) == 96 for r in records)


def test_a_litertlm_folder_loads_on_litert_lm_or_says_why_not(tmp_path: Path) -> None:
    """The folder's contents choose the runtime: a ``.litertlm`` never goes to ORT GenAI."""
    (tmp_path / "model.litertlm").write_bytes(b"not a model")
    expected: type[Exception] = (
        ModelLoadError if litert_build_available() else (RuntimeUnavailableError)
    )
    with pytest.raises(expected) as raised:
        load_language_runtime(tmp_path)
    assert "genai_config" not in str(raised.value)
    if expected is RuntimeUnavailableError:
        assert "tandem[litert-lm]" in str(raised.value)
    (tmp_path / "other.litertlm").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"one \.litertlm file, found 2"):
        LiteRTLanguageRuntime(tmp_path)


def test_text_pieces_hold_ids_back_until_a_character_is_whole() -> None:
    """The LiteRT-LM stream's detokenizer, on a byte-per-id decoder."""
    text = "héllo 世界 🙂"
    data = text.encode()

    def decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    pieces = TextPieces(decode)
    parts = [pieces.decode(b) for b in data]
    assert "".join(parts) == text
    assert all("\ufffd" not in part for part in parts)
    assert "" in parts  # a byte that completes no character yields no text
