"""The language-model pair: built with a tiny budget, run through ONNX Runtime GenAI, cached.

Whether the hub model beats the device model at the default budget is a
measurement (bench/language_models.py), not a test: a tiny budget trains for
a handful of steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import onnxruntime_genai as og  # make test installs it (the dev extra): never a skip
import pytest

from tandem.demo.language import (
    LanguageBuildError,
    LanguageModels,
    LanguageRecipe,
    ModelShape,
    build_language_models,
    greedy_generate,
    heldout_figures,
    load_model,
    resolve_hub_target,
    text_splits,
)

from ._language import tiny_recipe

TINY = tiny_recipe()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> LanguageModels:
    return build_language_models(tmp_path_factory.mktemp("lm-cache"), recipe=TINY)


def _files(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")}


def test_both_models_load_and_generate_greedily(built: LanguageModels) -> None:
    prompt = next(iter(text_splits(TINY).heldout.values()))[:60]
    for directory in (built.device_model, built.hub_model):
        model, tokenizer = load_model(directory)
        ids = np.asarray(tokenizer.encode(prompt), dtype=np.int32)
        # The first greedy token is the argmax of the prefill's last logits row.
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=TINY.context)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        expected_first = int(np.asarray(generator.get_output("logits"))[0, -1].argmax())

        out = greedy_generate((model, tokenizer), prompt, 8)
        assert out.prompt_tokens == len(ids)
        assert out.tokens[0] == expected_first
        assert 1 <= len(out.tokens) <= 8
        assert all(0 <= t < TINY.vocab_size for t in out.tokens)
        assert out.text == tokenizer.decode(np.asarray(out.tokens, dtype=np.int32))
        assert greedy_generate((model, tokenizer), prompt, 8).tokens == out.tokens  # greedy


def test_exports_have_the_requested_precisions(built: LanguageModels) -> None:
    assert built.report["targets"] == {
        "device": {"precision": "int4", "provider": "cpu"},
        "hub": {"precision": "fp32", "provider": "cpu"},
    }
    device_graph = (built.device_model / "model.onnx").read_bytes()
    hub_graph = (built.hub_model / "model.onnx").read_bytes()
    assert b"MatMulNBits" in device_graph  # INT4 weight-only matmuls
    assert b"MatMulNBits" not in hub_graph  # FP32 matmuls
    assert built.report["params"]["hub"] > 2 * built.report["params"]["device"]
    for directory in (built.device_model, built.hub_model):
        config = json.loads((directory / "genai_config.json").read_text())
        assert config["model"]["context_length"] == TINY.context
        assert config["model"]["vocab_size"] == TINY.vocab_size


def test_tokenizer_round_trips_heldout_text(built: LanguageModels) -> None:
    from tokenizers import Tokenizer

    splits = text_splits(TINY)
    assert splits.heldout and not set(splits.heldout) & set(splits.train)  # split by document
    reference = Tokenizer.from_file(str(built.device_hf / "tokenizer.json"))
    for directory in (built.device_model, built.hub_model):
        _, tokenizer = load_model(directory)
        for text in splits.heldout.values():
            ids = tokenizer.encode(text)
            assert tokenizer.decode(ids) == text
            assert list(ids) == reference.encode(text).ids  # GenAI and HF tokenize alike


def test_heldout_figures_come_from_the_exported_model(built: LanguageModels) -> None:
    """The FP32 hub export scores what its torch checkpoint scores, window by window."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    text = sorted(text_splits(TINY).heldout.values(), key=len)[0]
    figures = heldout_figures(built.hub_model, [text], context=TINY.context, eos_id=2)

    _, tokenizer = load_model(built.hub_model)
    ids = [2, *(int(t) for t in tokenizer.encode(text))]
    model = LlamaForCausalLM.from_pretrained(str(built.hub_hf), local_files_only=True).eval()
    nats, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, TINY.context - 1):
            window = torch.tensor([ids[start : start + TINY.context]])
            logits = model(input_ids=window).logits[0, :-1]
            truth = window[0, 1:]
            nats += float(F.cross_entropy(logits, truth, reduction="sum"))
            correct += int((logits.argmax(-1) == truth).sum())
            count += len(truth)
    assert figures["tokens"] == count == len(ids) - 1
    assert figures["loss_nats_per_token"] == pytest.approx(nats / count, abs=2e-3)
    assert figures["next_token_accuracy"] == pytest.approx(correct / count, abs=2 / count)
    assert figures["perplexity"] == pytest.approx(math.exp(nats / count), rel=5e-3)


def test_report_holds_figures_for_both_models(built: LanguageModels) -> None:
    for which in ("device", "hub"):
        figures = built.heldout[which]
        assert figures["tokens"] > 1000
        assert math.isfinite(figures["loss_nats_per_token"]) and figures["loss_nats_per_token"] > 0
        assert 0.0 <= figures["next_token_accuracy"] <= 1.0
        assert built.report["greedy"][which]["new_tokens"] >= 1
        assert built.report["training"][which]["steps_run"] == TINY.steps
    assert built.report["training"]["stopped_by"] == "steps"


def test_cache_hit_loads_without_building(built: LanguageModels) -> None:
    before = _files(built.directory)
    stages: list[str] = []
    again = build_language_models(
        built.directory.parent, recipe=TINY, progress=lambda stage, f: stages.append(stage)
    )
    assert again.directory == built.directory
    assert set(stages) == {"load cached language models"}
    assert _files(built.directory) == before  # nothing rewritten
    assert again.report == built.report


def test_a_changed_recipe_or_incomplete_entry_is_not_a_hit(
    built: LanguageModels, tmp_path: Path
) -> None:
    assert LanguageRecipe(seed=1).key() != LanguageRecipe().key()
    assert TINY.key() != LanguageRecipe(**{**TINY.__dict__, "hub_precision": "int8"}).key()
    # A copy without its report is an incomplete entry: loading it would rebuild.
    from tandem.demo.language import _load  # the cache check itself

    assert _load(built.directory, TINY.key()) is not None
    assert _load(built.directory, LanguageRecipe(seed=1).key()) is None
    (tmp_path / "x").mkdir()
    assert _load(tmp_path / "x", TINY.key()) is None


def test_builds_run_offline_and_restore_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tandem.demo.language import _offline  # the switch the build runs under

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    with _offline():
        assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in os.environ
    assert os.environ["TRANSFORMERS_OFFLINE"] == "0"


def test_int8_hub_export_scores_like_fp32(built: LanguageModels, tmp_path: Path) -> None:
    from tandem.demo.language import export_genai

    out = tmp_path / "hub-int8"
    export_genai(built.hub_hf, out, precision="int8", provider="cpu")
    assert b"MatMulNBits" in (out / "model.onnx").read_bytes()
    text = sorted(text_splits(TINY).heldout.values(), key=len)[:3]
    int8 = heldout_figures(out, text, context=TINY.context, eos_id=2)
    fp32 = heldout_figures(built.hub_model, text, context=TINY.context, eos_id=2)
    assert int8["tokens"] == fp32["tokens"]
    assert int8["loss_nats_per_token"] == pytest.approx(fp32["loss_nats_per_token"], abs=0.05)
    assert len(greedy_generate(out, text[0][:40], 4).tokens) >= 1


def test_bad_recipes_and_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="head size"):
        ModelShape(hidden=30, layers=1, heads=2, kv_heads=1, intermediate=8, batch_size=1, lr=1e-3)
    with pytest.raises(ValueError, match="hub_precision"):
        LanguageRecipe(hub_precision="int3")
    with pytest.raises(ValueError, match="no fp16 export for cpu"):
        resolve_hub_target(LanguageRecipe(hub_precision="fp16", hub_provider="cpu"))


def test_unwritable_cache_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(LanguageBuildError, match="cannot create the model cache"):
        build_language_models(blocker / "cache", recipe=TINY)


def test_fp16_cuda_hub_export_is_written_for_a_gpu(built: LanguageModels, tmp_path: Path) -> None:
    """What a CUDA hub gets (resolve_hub_target picks it where ONNX Runtime GenAI has CUDA);
    written on this CPU, run only where a GPU is."""
    import onnx

    from tandem.demo.language import export_genai

    out = tmp_path / "hub-fp16"
    export_genai(built.hub_hf, out, precision="fp16", provider="cuda")
    config = json.loads((out / "genai_config.json").read_text())
    providers = config["model"]["decoder"]["session_options"]["provider_options"]
    assert [next(iter(p)) for p in providers] == ["cuda"]
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    logits = next(o for o in graph.output if o.name == "logits")
    assert logits.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert resolve_hub_target(LanguageRecipe(hub_provider="cuda")) == ("fp16", "cuda")
    assert resolve_hub_target(LanguageRecipe(hub_provider="cpu")) == ("fp32", "cpu")


def test_a_second_build_in_the_same_process_builds(built: LanguageModels, tmp_path: Path) -> None:
    """The first build imports the package's ``_build`` module; a later cache miss must still
    build (a function of that name on the package was rebound to the module: TypeError)."""
    again = build_language_models(tmp_path, recipe=dataclasses.replace(TINY, seed=1))
    assert (
        again.device_model != built.device_model
        and (again.device_model / "genai_config.json").exists()
    )
