"""The vLLM engine's parts that need no vLLM: mapping, deltas, histories, its loop.

``_vllm_mapping`` is pure: our sampling as ``SamplingParams`` arguments, vLLM's
finish reasons as ours, DELTA outputs accumulated into the sink's updates, and
the kept conversations' histories. ``VllmEngine``'s loop (admission by slots,
cancel, wall time, conversations, close) runs here on a scripted engine of the
surface it takes from vLLM (``Runtime``: ``generate`` yielding DELTA outputs,
``abort``); vLLM itself runs only in tests/test_vllm_engine.py, on a CUDA GPU.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cloud_hub import InvalidRequestError, OverloadedError, RepositoryError
from cloud_hub.language import (
    ConversationLimits,
    GenerationLimits,
    Sampling,
    TurnUpdate,
    VllmEngine,
    engine_missing,
)
from cloud_hub.language._vllm import Runtime, find_checkpoint
from cloud_hub.language._vllm_mapping import (
    ConversationHistories,
    DeltaStream,
    finish_of,
    sampling_kwargs,
)

EOS = 2
VOCAB = 64
BLOCK = 4  # the scripted engine's prefix cache counts whole blocks of this many tokens


# -- the pure mapping -------------------------------------------------------------------


def test_greedy_sampling_is_temperature_zero_and_nothing_else() -> None:
    assert sampling_kwargs(Sampling(), 7) == {"max_tokens": 7, "n": 1, "temperature": 0.0}
    greedy_with_seed = sampling_kwargs(Sampling(top_p=0.5, seed=3), 7)
    assert "seed" not in greedy_with_seed and "top_p" not in greedy_with_seed


def test_sampled_turns_carry_temperature_top_p_seed_and_stop_strings() -> None:
    kwargs = sampling_kwargs(Sampling(temperature=0.7, top_p=0.9, seed=11, stop=("\n\n",)), 5)
    assert kwargs == {"max_tokens": 5, "n": 1, "temperature": 0.7, "top_p": 0.9, "seed": 11,
                      "stop": ["\n\n"]}  # fmt: skip
    assert "seed" not in sampling_kwargs(Sampling(temperature=1.0), 5)


def test_vllm_finish_reasons_map_to_ours() -> None:
    assert [finish_of(r) for r in ("stop", "length", "abort", "error")] == [
        "stop", "length", "cancelled", "error",
    ]  # fmt: skip
    assert finish_of(SimpleNamespace(name="ABORT")) == "cancelled"  # v1's FinishReason enum
    assert finish_of(SimpleNamespace(name="LENGTH")) == "length"


def test_deltas_accumulate_into_updates_as_the_cpu_engine_sends_them() -> None:
    stream = DeltaStream(prompt_tokens=5)
    first = stream.add("He", [10, 11], cached=4)
    assert first == TurnUpdate("He", (10, 11), None, 5, 2, cached_prompt_tokens=4)
    assert stream.add("", [12]) is None  # a token whose text vLLM holds back: no update yet
    last = stream.add("llo", [13], finish_reason="length", cached=4)
    assert last == TurnUpdate("llo", (10, 11, 12, 13), "length", 5, 4, cached_prompt_tokens=4)
    assert stream.text == "Hello"
    assert stream.add("late", [14]) is None and stream.tokens == [10, 11, 12, 13]


def test_a_failed_stream_ends_with_an_error_update_and_no_text() -> None:
    stream = DeltaStream(prompt_tokens=3)
    stream.add("a", [9])
    update = stream.finish("error", error="boom")
    assert (update.finish, update.error, update.text, update.tokens) == ("error", "boom", "", (9,))
    assert stream.finished


def test_a_cancel_before_any_token_is_an_empty_cancelled_update() -> None:
    update = DeltaStream(prompt_tokens=3).finish("cancelled")
    assert (update.finish, update.text, update.tokens, update.prompt_tokens) == (
        "cancelled", "", (), 3,
    )  # fmt: skip


def histories(**limits: Any) -> ConversationHistories:
    return ConversationHistories(ConversationLimits(**limits), context=32, eos=frozenset({EOS}))


def test_a_conversation_is_kept_without_its_end_of_sequence_and_continued() -> None:
    books = histories()
    prompt = np.arange(10, 16, dtype=np.int32)
    kept = books.begin("c", prompt, Sampling(), 4)
    assert kept.history == [] and books.store.counters["misses"] == 1
    books.end(kept, prompt, [20, 21, EOS])
    assert len(books) == 1 and kept.history == [*range(10, 16), 20, 21]  # no EOS kept
    follow = np.asarray([*range(10, 16), 20, 21, 30, 31], dtype=np.int32)
    again = books.begin("c", follow, Sampling(), 4)
    assert again.history == [*range(10, 16), 20, 21] and books.store.counters["hits"] == 1
    assert len(books) == 0  # the turn holds it until it ends


def test_a_history_the_prompt_does_not_repeat_or_other_sampling_is_a_miss() -> None:
    books = histories()
    prompt = np.arange(10, 16, dtype=np.int32)
    books.end(books.begin("c", prompt, Sampling(), 4), prompt, [20])
    assert books.begin("c", prompt + 1, Sampling(), 4).history == []
    books.end(books.begin("d", prompt, Sampling(), 4), prompt, [20])
    assert books.begin("d", prompt, Sampling(temperature=0.5), 4).history == []
    assert books.store.counters["misses"] == 4


def test_histories_are_bounded_like_the_cpu_engine_s_kept_caches() -> None:
    books = histories(max_conversations=2, max_tokens=12)
    prompt = np.arange(10, 16, dtype=np.int32)
    for key in ("a", "b", "c"):
        books.end(books.begin(key, prompt, Sampling(), 4), prompt, [20])
    assert len(books) == 2 and books.store.counters["evictions"] == 1
    full = books.begin("full", prompt, Sampling(), 4)  # capacity max(12, 6 + 4) = 12
    assert full.capacity == 12
    books.end(full, prompt, list(range(20, 25)))  # 11 tokens: no room for another turn's token
    assert books.forget("full") is False and books.forget("b") is True and len(books) == 1


def test_a_turn_longer_than_the_budget_gets_a_history_of_its_own_size_within_the_context() -> None:
    books = histories(max_tokens=8)
    kept = books.begin("c", np.arange(10, 30, dtype=np.int32), Sampling(), 30)
    assert kept.capacity == 32  # min(context, max(budget, prompt + max_tokens))


# -- the model files vLLM loads ---------------------------------------------------------


def write_checkpoint(path: Path, **config: Any) -> None:
    path.mkdir(parents=True, exist_ok=True)
    base = {"vocab_size": VOCAB, "max_position_embeddings": 1024, "eos_token_id": EOS}
    (path / "config.json").write_text(json.dumps({**base, **config}))


def test_the_hf_folder_beside_the_onnx_files_is_loaded_with_the_onnx_context(
    tmp_path: Path,
) -> None:
    write_checkpoint(tmp_path / "hf")
    genai = {"model": {"context_length": 128, "eos_token_id": [EOS, 3]}}
    (tmp_path / "genai_config.json").write_text(json.dumps(genai))
    checkpoint = find_checkpoint(tmp_path)
    assert checkpoint.path == tmp_path / "hf" and checkpoint.context == 128
    assert checkpoint.vocab_size == VOCAB and checkpoint.eos == frozenset({EOS, 3})


def test_a_plain_checkpoint_folder_uses_its_own_sizes(tmp_path: Path) -> None:
    write_checkpoint(tmp_path)
    checkpoint = find_checkpoint(tmp_path)
    assert (checkpoint.path, checkpoint.context, checkpoint.eos) == (tmp_path, 1024, {EOS})


def test_a_folder_without_a_checkpoint_says_what_it_expected(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match=r"hf/config\.json"):
        find_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RepositoryError, match="cannot read"):
        find_checkpoint(tmp_path)


def test_engine_vllm_is_refused_in_one_line_naming_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no nvidia-smi
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    missing = engine_missing("vllm")
    assert missing is not None and "a CUDA GPU" in missing and "\n" not in missing
    (tmp_path / "site" / "vllm").mkdir(parents=True)  # a vllm package is found...
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"  # ...and a GPU's tool: nothing is missing
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    importlib.invalidate_caches()
    assert engine_missing("vllm") is None
    assert engine_missing("onnxruntime-genai") is None


# -- the loop, on a scripted engine of vLLM's surface -------------------------------------


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class Output:
    outputs: list[Completion]
    finished: bool
    num_cached_tokens: int


class ScriptedEngine:
    """``generate``/``abort`` as vLLM's AsyncLLMEngine offers them, with DELTA outputs.

    Token i of a request is ``(last prompt token + i + 1) % VOCAB``, its text
    ``<id>``; while ``hold`` is clear a request waits after its first token
    (until released or aborted). The prefix cache counts the longest prefix a
    request shares with an earlier one (its prompt and output), in whole blocks.
    """

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.aborted: set[str] = set()
        self.seen: list[list[int]] = []
        self.fail: str | None = None
        self.shut = False

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str
    ) -> AsyncIterator[Output]:
        ids = list(prompt["prompt_token_ids"])
        assert params.output_kind == "DELTA"
        cached = max((self._shared(ids, old) for old in self.seen), default=0)
        self.seen.append(list(ids))
        if self.fail is not None:
            raise RuntimeError(self.fail)
        for i in range(params.max_tokens):
            while i == 1 and not self.hold.is_set() and request_id not in self.aborted:
                await asyncio.sleep(0.001)  # the engine's own pace (the tests wait on conditions)
            if request_id in self.aborted:
                yield Output([Completion("", [], "abort")], True, cached)
                return
            token = (ids[-1] + i + 1) % VOCAB
            self.seen[-1].append(token)  # generated tokens' blocks are cached too
            done = token == EOS or i == params.max_tokens - 1
            reason = ("stop" if token == EOS else "length") if done else None
            yield Output([Completion(f"<{token}>", [token], reason)], done, cached)
            if done:
                return

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def shutdown(self) -> None:
        self.shut = True

    @staticmethod
    def _shared(ids: list[int], old: list[int]) -> int:
        n = 0
        while n < min(len(ids) - 1, len(old)) and ids[n] == old[n]:
            n += 1
        return n // BLOCK * BLOCK


class Tokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]


class Updates:
    """A turn's sink: every update, and which thread delivered it."""

    def __init__(self) -> None:
        self.items: list[TurnUpdate] = []
        self.threads: set[str] = set()
        self._cond = threading.Condition()

    def __call__(self, update: TurnUpdate) -> None:
        with self._cond:
            self.items.append(update)
            self.threads.add(threading.current_thread().name)
            self._cond.notify_all()

    def wait(self, check: Callable[[list[TurnUpdate]], bool], timeout_s: float = 10.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: check(self.items), timeout_s), self.items

    def final(self) -> TurnUpdate:
        self.wait(lambda items: bool(items) and items[-1].finish is not None)
        return self.items[-1]


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[Callable[..., tuple[VllmEngine, ScriptedEngine]]]:
    write_checkpoint(tmp_path / "hf", max_position_embeddings=64)
    made: list[VllmEngine] = []

    def make(**limits: Any) -> tuple[VllmEngine, ScriptedEngine]:
        fake = ScriptedEngine()
        runtime = Runtime(build=lambda: fake, sampling_params=SimpleNamespace, tokens_prompt=dict,
                          output_kind="DELTA", tokenizer=Tokenizer())  # fmt: skip
        engine = VllmEngine(tmp_path, limits=GenerationLimits(**limits), runtime=runtime)
        made.append(engine)
        return engine, fake

    yield make
    for engine in made:
        engine.close()


def wait_stats(engine: VllmEngine, check: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    done = threading.Event()
    for _ in range(10_000):  # each try waits on the engine's loop having run what came before
        stats = engine.stats()
        if check(stats):
            return stats
        done.wait(0.001)
    raise AssertionError(engine.stats())


def test_a_turn_streams_its_deltas_and_ends_with_its_finish_on_the_loop_thread(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, _ = scripted()
    updates = Updates()
    engine.submit(engine.encode("abc"), max_tokens=3, sink=updates)
    final = updates.final()
    assert [u.text for u in updates.items] == ["<36>", "<37>", "<38>"]
    assert (final.finish, final.tokens, final.prompt_tokens, final.completion_tokens) == (
        "length", (36, 37, 38), 3, 3,
    )  # fmt: skip
    assert updates.threads == {"vllm-engine"}
    stats = wait_stats(engine, lambda s: s["active"] == 0)
    assert (stats["completed"], stats["tokens"], stats["submitted"]) == (1, 3, 1)


def test_end_of_sequence_finishes_stop(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, _ = scripted()
    updates = Updates()
    engine.submit([EOS - 2], max_tokens=8, sink=updates)
    assert updates.final().finish == "stop" and updates.final().tokens == (EOS - 1, EOS)


def test_a_cancel_frees_the_slot_for_the_waiting_turn_and_aborts_in_vllm(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, fake = scripted(max_active=1)
    fake.hold.clear()
    first, second = Updates(), Updates()
    turn = engine.submit([5], max_tokens=4, sink=first)
    engine.submit([9], max_tokens=2, sink=second)
    first.wait(lambda items: len(items) == 1)
    assert wait_stats(engine, lambda s: s["waiting"] == 1)["active"] == 1
    turn.cancel()
    assert first.final().finish == "cancelled" and first.final().tokens == (6,)
    second.wait(lambda items: len(items) == 1)  # it began in the freed slot
    fake.hold.set()
    assert second.final().finish == "length"
    stats = wait_stats(engine, lambda s: s["active"] == 0 and s["waiting"] == 0)
    assert stats["cancelled"] == 1 and stats["completed"] == 1
    assert turn.request.request_id in fake.aborted
    assert len(first.items) == 2  # nothing after its final


def test_a_waiting_turn_cancelled_never_reaches_vllm(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, fake = scripted(max_active=1)
    fake.hold.clear()
    first, second = Updates(), Updates()
    engine.submit([5], max_tokens=4, sink=first)
    waiting = engine.submit([9], max_tokens=2, sink=second)
    wait_stats(engine, lambda s: s["waiting"] == 1)
    waiting.cancel()
    assert second.final().finish == "cancelled" and second.final().tokens == ()
    fake.hold.set()
    assert first.final().finish == "length" and len(fake.seen) == 1


def test_a_turn_past_its_wall_time_finishes_length_and_is_aborted(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, fake = scripted(max_wall_s=0.05)
    fake.hold.clear()
    updates = Updates()
    turn = engine.submit([5], max_tokens=4, sink=updates)
    assert updates.final().finish == "length"
    assert wait_stats(engine, lambda s: s["timed_out"] == 1)["active"] == 0
    wait_stats(engine, lambda s: turn.request.request_id in fake.aborted)


def test_a_conversation_s_next_turn_reports_vllm_s_cached_tokens_and_a_hit(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, _ = scripted()
    prompt = list(range(10, 19))
    first = Updates()
    engine.submit(prompt, max_tokens=3, sink=first, conversation="c")
    reply = list(first.final().tokens)
    assert first.final().cached_prompt_tokens == 0
    second = Updates()
    engine.submit([*prompt, *reply, 40, 41], max_tokens=2, sink=second, conversation="c")
    assert second.final().cached_prompt_tokens == 12  # 12 of 14 shared tokens: whole blocks
    stats = wait_stats(engine, lambda s: s["conversations"] == 1 and s["active"] == 0)
    assert (stats["conversation_hits"], stats["conversation_misses"]) == (1, 1)
    assert stats["cached_prompt_tokens"] == 12


def test_limits_are_the_cpu_engine_s(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, fake = scripted(max_active=1, max_queue=1, max_output_tokens=8)
    with pytest.raises(InvalidRequestError, match="at most 63"):
        engine.submit(list(range(64)), max_tokens=1, sink=Updates())
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        engine.submit([VOCAB], max_tokens=1, sink=Updates())
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        engine.submit([1], max_tokens=9, sink=Updates())
    fake.hold.clear()
    running = Updates()
    engine.submit([5], max_tokens=4, sink=running)
    running.wait(lambda items: len(items) == 1)
    engine.submit([5], max_tokens=4, sink=Updates())
    with pytest.raises(OverloadedError):
        engine.submit([5], max_tokens=4, sink=Updates())
    assert engine.stats()["refused"] == 1 and engine.default_max_tokens(60) == 4


def test_a_failure_in_vllm_is_the_turn_s_error_update(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, fake = scripted()
    fake.fail = "CUDA out of memory"
    updates = Updates()
    engine.submit([5], max_tokens=4, sink=updates, conversation="c")
    final = updates.final()
    assert final.finish == "error" and "CUDA out of memory" in (final.error or "")
    assert wait_stats(engine, lambda s: s["error"] == 1)["conversations"] == 0


def test_close_cancels_every_turn_and_shuts_vllm_down(
    scripted: Callable[..., tuple[VllmEngine, ScriptedEngine]],
) -> None:
    engine, fake = scripted(max_active=1)
    fake.hold.clear()
    running, waiting = Updates(), Updates()
    engine.submit([5], max_tokens=4, sink=running)
    engine.submit([6], max_tokens=4, sink=waiting)
    running.wait(lambda items: len(items) == 1)
    engine.close()
    assert running.final().finish == "cancelled" and waiting.final().finish == "cancelled"
    assert fake.shut
    with pytest.raises(OverloadedError, match="stopping"):
        engine.submit([5], max_tokens=1, sink=Updates())
