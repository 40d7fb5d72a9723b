"""One build of the language-model pair into a directory; returns its report (see the package)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._agreement import greedy_agreement
from ._corpus import EOS, corpus_digest, load_text_splits, save_tokenizer, train_tokenizer
from ._export import export_genai
from ._runtime import greedy_generate, heldout_figures, load_model
from ._train import train_pair

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ._recipe import LanguageRecipe

__all__ = ["build_into"]

_PROBE_TOKENS = 48  # the speed probe: greedy from the first half-context of a held-out document
_VERSIONED = ("torch", "transformers", "tokenizers", "onnxruntime", "onnxruntime-genai", "onnx-ir")


def build_into(
    out: Path,
    recipe: LanguageRecipe,
    hub_target: tuple[str, str],
    paths: Mapping[str, Path],
    progress: Callable[[str, float], None],
    threads: int,
) -> dict[str, Any]:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    targets = {"device": (recipe.device_precision, "cpu"), "hub": hub_target}
    with _stage("split text", "split", timings, progress):
        splits = load_text_splits(heldout_fraction=recipe.heldout_fraction, seed=recipe.split_seed)
    with _stage("train tokenizer", "tokenizer", timings, progress):
        tokenizer = train_tokenizer(list(splits.train.values()), recipe.vocab_size)
        train_tokens = _tokens(tokenizer, splits.train)
    with _stage("train device and hub models", "train", timings, progress) as step:
        trained, stopped_by = _train(recipe, train_tokens, threads, step)
    with _stage("save checkpoints", "save", timings, progress):
        for which, result in trained.items():
            hf_dir = paths[f"{which}_hf"]
            result.model.save_pretrained(str(hf_dir), safe_serialization=True)
            save_tokenizer(tokenizer, hf_dir, context=recipe.context)
    for which in ("device", "hub"):
        precision, provider = targets[which]
        with _stage(
            f"export {which} model ({precision.upper()})", f"export_{which}", timings, progress
        ):
            export_genai(
                paths[f"{which}_hf"],
                paths[f"{which}_model"],
                precision=precision,
                provider=provider,
            )
    eos = _eos_id(tokenizer)
    with _stage("evaluate held-out text", "evaluate", timings, progress) as step:
        heldout, speed = _evaluate(recipe, targets, paths, splits.heldout, eos, step)
    agreement: dict[str, Any] = {}
    if recipe.distill and all(targets[w][1] == "cpu" for w in ("device", "hub")):
        with _stage("measure device/hub agreement", "agreement", timings, progress):
            agreement = greedy_agreement(
                paths["device_model"], paths["hub_model"], splits.heldout.values(),
                context=recipe.context, eos_id=eos,
            )  # fmt: skip
    timings["total"] = round(time.perf_counter() - started, 3)
    return {
        "recipe": dataclasses.asdict(recipe),
        "data": {
            "source": "pydoc_data.topics (the language reference's topics, in CPython)",
            "corpus_sha256": corpus_digest(),
            "split": "by document",
            **splits.sizes,
            "train_tokens": len(train_tokens),
            "heldout_names": sorted(splits.heldout),
        },
        "targets": {w: {"precision": p, "provider": e} for w, (p, e) in targets.items()},
        "params": {w: r.params for w, r in trained.items()},
        "training": _training_report(recipe, trained, stopped_by, threads),
        "bytes": {w: _size(paths[f"{w}_model"]) for w in ("device", "hub")},
        "heldout": heldout,
        "greedy": speed,
        **({"agreement": agreement} if agreement else {}),
        "timings_s": timings,
        "versions": {m: _version(m) for m in _VERSIONED},
    }


def _train(
    recipe: LanguageRecipe, train_tokens: np.ndarray, threads: int, step: Callable[[float], None]
) -> tuple[dict[str, Any], str]:
    """Both models trained on ``threads`` torch threads; the caller's RNG state and thread
    count are left as they were."""
    import torch

    threads_before = torch.get_num_threads()
    with torch.random.fork_rng():  # leave the caller's RNG state alone
        torch.set_num_threads(threads)
        try:
            return train_pair(
                {"device": recipe.device, "hub": recipe.hub},
                train_tokens,
                vocab_size=recipe.vocab_size,
                context=recipe.context,
                steps=recipe.steps,
                max_seconds=recipe.max_train_seconds,
                seed=recipe.seed,
                progress=step,
                distill=recipe.distill_weight if recipe.distill else None,
                device_steps=recipe.device_steps,
            )
        finally:
            torch.set_num_threads(threads_before)


def _evaluate(
    recipe: LanguageRecipe,
    targets: Mapping[str, tuple[str, str]],
    paths: Mapping[str, Path],
    heldout_docs: Mapping[str, str],
    eos: int,
    step: Callable[[float], None],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Held-out figures and the greedy speed probe of each CPU export."""
    heldout: dict[str, Any] = {}
    speed: dict[str, Any] = {}
    for n, which in enumerate(("device", "hub")):
        if targets[which][1] != "cpu":
            continue  # a CUDA export is measured where it runs, not on this CPU
        model_dir = paths[f"{which}_model"]
        heldout[which] = heldout_figures(
            model_dir, heldout_docs.values(), context=recipe.context, eos_id=eos
        )
        speed[which] = _speed(model_dir, next(iter(heldout_docs.values())), recipe.context)
        step((n + 1) / 2)
    return heldout, speed


def _training_report(
    recipe: LanguageRecipe, trained: Mapping[str, Any], stopped_by: str, threads: int
) -> dict[str, Any]:
    return {
        "steps_planned": recipe.steps,
        "stopped_by": stopped_by,
        "torch_threads": threads,
        **({"distilled": {"weight": recipe.distill_weight}} if recipe.distill else {}),
        **{
            w: {
                "steps_run": r.steps_run,
                "seconds": round(r.seconds, 2),
                "final_train_loss": round(r.final_loss, 4),
            }
            for w, r in trained.items()
        },
    }


def _speed(model_dir: Path, document: str, context: int) -> dict[str, Any]:
    """Greedy generation from the start of a held-out document: tokens/s and the text."""
    pair = load_model(model_dir)
    prompt = [int(t) for t in pair[1].encode(document)[: context // 2]]
    budget = min(_PROBE_TOKENS, context - len(prompt))
    greedy_generate(pair, prompt, 4)  # warm-up: first-run allocations
    result = greedy_generate(pair, prompt, budget)
    return {
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": len(result.tokens),
        "decode_tokens_per_s": round(result.tokens_per_s, 1),
        "prefill_ms": round(result.prefill_s * 1e3, 3),
        "sample": result.text[:160],
    }


@contextlib.contextmanager
def _stage(
    name: str, key: str, timings: dict[str, float], progress: Callable[[str, float], None]
) -> Iterator[Callable[[float], None]]:
    """Time one stage and report it from 0 to 1; yields a reporter for fractions between."""
    started = time.perf_counter()
    progress(name, 0.0)
    yield lambda fraction: progress(name, fraction)
    progress(name, 1.0)
    timings[key] = round(time.perf_counter() - started, 3)


def _tokens(tokenizer: Tokenizer, documents: Mapping[str, str]) -> np.ndarray:
    """The training stream: each document's tokens followed by ``</s>``."""
    eos = _eos_id(tokenizer)
    ids: list[int] = []
    for text in documents.values():
        ids += tokenizer.encode(text).ids
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def _eos_id(tokenizer: Tokenizer) -> int:
    eos = tokenizer.token_to_id(EOS)
    if eos is None:
        raise ValueError(f"the tokenizer has no {EOS}")
    return int(eos)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("model.onnx*"))


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
