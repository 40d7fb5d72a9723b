"""The vLLM engine's entry: the hub model served with ``"engine": "vllm"``, on a CUDA GPU.

Skipped ("skipped: needs a CUDA GPU and the vllm package") where either is
missing, as in CI and on the machine this was written on: it has NOT run in
this repository yet (no GPU was lent). On a CUDA machine with
``pip install 'tandem[vllm]'`` it builds the hub model of
``tandem.demo.language`` (its Hugging Face checkpoint, ``hf/hub`` in the
cache; trained on the CPU for minutes on a cold cache), serves it through the
embedded Hub with ``"engine": "vllm"`` (FP16), and checks:

* greedy output equals ONNX Runtime GenAI's (``LanguageEngine``, FP32 on the
  CPU) token for token, asserted exactly (FP16 against FP32 could flip a
  near-tie; the failure message then names the first token that differs);
* a conversation's second turn reports cached prompt tokens (vLLM's prefix
  cache: whole 16-token blocks);
* a cancel frees the slot (``max_active`` 1) for the turn waiting behind it.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud_hub import Hub
from cloud_hub.language import (
    LanguageEngine,
    TurnEngine,
    TurnUpdate,
    engine_missing,
)
from tandem.demo.language import LanguageRecipe, build_language_models

pytestmark = pytest.mark.skipif(
    engine_missing("vllm") is not None, reason="skipped: needs a CUDA GPU and the vllm package"
)

PROMPTS = ('The "assert" statement', "A class definition defines", "The for statement is used")
WAIT_S = 120.0


class Updates:
    def __init__(self) -> None:
        self.items: list[TurnUpdate] = []
        self._cond = threading.Condition()

    def __call__(self, update: TurnUpdate) -> None:
        with self._cond:
            self.items.append(update)
            self._cond.notify_all()

    def wait(self, count: int = 0) -> TurnUpdate:
        """The final update (or, with ``count``, once that many updates came)."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: (
                    len(self.items) >= count
                    if count
                    else bool(self.items) and self.items[-1].finish is not None
                ),
                WAIT_S,
            )
            assert done, self.items
            return self.items[-1]


def run_turn(engine: TurnEngine, prompt: list[int], max_tokens: int, **kw: object) -> TurnUpdate:
    updates = Updates()
    engine.submit(prompt, max_tokens=max_tokens, sink=updates, **kw)  # type: ignore[arg-type]
    return updates.wait()


@pytest.fixture(scope="module")
def models() -> Iterator[tuple[Path, Path]]:
    built = build_language_models(recipe=LanguageRecipe(hub_provider="cpu"))
    yield built.hub_model, built.hub_hf


def serve(tmp_path: Path, onnx: Path, hf: Path, generation: dict[str, object]) -> Hub:
    version = tmp_path / "repo" / "big" / "1"
    shutil.copytree(onnx, version)
    shutil.copytree(hf, version / "hf")
    config = {"platform": "onnxruntime_genai", "engine": "vllm", "generation": generation}
    (version.parent / "config.json").write_text(json.dumps(config))
    return Hub(tmp_path / "repo")


@pytest.mark.timeout(1800)
def test_vllm_serves_the_hub_model_as_onnx_runtime_genai_does(
    models: tuple[Path, Path], tmp_path: Path
) -> None:
    onnx, hf = models
    reference = LanguageEngine(onnx)
    try:
        wanted = {p: run_turn(reference, reference.encode(p).tolist(), 32) for p in PROMPTS}
    finally:
        reference.close()
    with serve(tmp_path, onnx, hf, {"max_output_tokens": 64}) as hub:
        engine = hub.language.get("big").engine
        assert getattr(engine, "platform", None) == "vllm"
        for prompt, want in wanted.items():
            got = run_turn(engine, engine.encode(prompt).tolist(), 32)
            pairs = zip(got.tokens, want.tokens, strict=False)
            first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
            assert got.tokens == want.tokens, f"{prompt!r}: first difference at token {first}"
            assert got.finish == want.finish, prompt

        ids = engine.encode(" ".join(PROMPTS) * 2).tolist()[:40]
        first_turn = run_turn(engine, ids, 24, conversation="c")
        follow = [*ids, *first_turn.tokens, *engine.encode(" and then").tolist()]
        second = run_turn(engine, follow, 8, conversation="c")
        assert second.finish in ("stop", "length")
        assert second.cached_prompt_tokens > 0
        assert engine.stats()["conversation_hits"] == 1


@pytest.mark.timeout(1800)
def test_a_cancel_frees_the_vllm_slot_for_the_waiting_turn(
    models: tuple[Path, Path], tmp_path: Path
) -> None:
    onnx, hf = models
    generation = {"max_output_tokens": 100, "max_active": 1}
    with serve(tmp_path, onnx, hf, generation) as hub:
        engine = hub.language.get("big").engine
        ids = engine.encode(PROMPTS[0]).tolist()
        long, short = Updates(), Updates()
        turn = engine.submit(ids, max_tokens=100, sink=long)
        long.wait(count=1)
        engine.submit(ids, max_tokens=4, sink=short)
        assert engine.stats()["waiting"] == 1
        turn.cancel()
        assert long.wait().finish == "cancelled"
        assert short.wait().finish in ("stop", "length")
        assert engine.stats()["active"] == 0 and engine.stats()["cancelled"] == 1
