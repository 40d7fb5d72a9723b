"""The language-model pair, trained here on text that ships with Python, and cached.

``run_llm_demo`` (``tandem demo --llm``) runs the pair through a broker, a
hub and an edge agent on held-out prompts, in the modes of ``MODES``
(``presets``: three presets; ``collaborative``: handoff under a budget of hub
tokens; ``speculative``: the device drafts, the hub verifies; ``all``), and
``write_llm_outputs`` leaves its plots and JSON report (``_demo_*`` modules).

A tokenizer and two Llama-family models that share it: a small **device**
model (INT4 for ONNX Runtime GenAI on a CPU) and a **hub** model several times
larger (FP32 on a CPU hub, FP16 where ONNX Runtime GenAI has CUDA). Nothing is
downloaded: the text is ``pydoc_data.topics`` (the language reference's
topics, in every CPython), the configurations are built in code, and the build
runs with ``HF_HUB_OFFLINE=1``.

Pipeline (a few minutes on 2 CPU cores; see :class:`LanguageRecipe`): split
the topics by document (held-out documents never reach training) → train a
byte-level BPE tokenizer on the training documents → train the device and hub
models in lockstep (a number of steps, with a wall-time bound for the pair, so
the hub never gets fewer steps) → save each as a Hugging Face directory →
export each with ONNX Runtime GenAI's model builder → measure both on the
held-out documents by running the exported models through
``onnxruntime_genai`` (per-token cross-entropy, perplexity, next-token
accuracy, bits per character, greedy tokens/s).

Everything lands in ``<cache>/language-models-<key>/`` (the same cache as the
digit models, :func:`tandem.demo.models.default_cache_dir`), where ``key``
hashes :data:`RECIPE_VERSION`, the recipe, the resolved hub target and the
text itself, so a changed recipe or Python's changed topics rebuild and an
unchanged one loads without training. A build is written to a temporary
directory and renamed into place, so an interrupted build leaves no
half-written entry. Layout::

    device/   ONNX Runtime GenAI model (model.onnx, model.onnx.data,
              genai_config.json, tokenizer.json, tokenizer_config.json)
    hub/      the same for the hub model
    hf/device, hf/hub   the trained checkpoints as Hugging Face directories
    report.json         recipe, sizes, timings, held-out figures, versions
    litert-<quant>/     model.litertlm: the device checkpoint for LiteRT-LM, once
                        :func:`build_litert_model` converted it (litert-torch)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._cache import build_into_cache
from ..models import default_cache_dir
from ._agreement import greedy_agreement
from ._corpus import TextSplits, load_text_splits
from ._demo_modes import (
    MODE_ROWS,
    MODES,
    CollaborativeFacts,
    SpeculativeFacts,
    acceptance_from_tokens,
    gap_recovered,
    hub_ms_per_token,
    hub_token_share,
    modes_of,
    presets_to_run,
    split_calibration,
)
from ._demo_output import LlmDemoFiles, plot_presets, write_llm_outputs
from ._demo_prompts import MIN_PROMPT_TOKENS, HeldoutPrompt, heldout_prompts, prompt_lengths
from ._demo_run import HUB_MODEL, PRESETS, LlmDemoConfig, LlmDemoReport, serve_and_run
from ._demo_stats import (
    PresetSummary,
    TurnFacts,
    percentile,
    summarize_preset,
    token_agreement,
    turn_side,
)
from ._errors import LanguageBuildError, LanguageDemoError
from ._export import export_genai
from ._export_litert import (
    LITERT_FILE,
    build_litert_device_model,
    export_litert_lm,
    litert_build_available,
)
from ._recipe import (
    DEFAULT_DEVICE_SHAPE,
    DEFAULT_HUB_SHAPE,
    HEAVY_HUB_SHAPE,
    RECIPE_VERSION,
    SPECULATIVE_RECIPE,
    LanguageRecipe,
    resolve_hub_target,
)
from ._runtime import Generation, greedy_generate, heldout_figures, load_model
from ._train import ModelShape

__all__ = [
    "DEFAULT_DEVICE_SHAPE",
    "DEFAULT_HUB_SHAPE",
    "HEAVY_HUB_SHAPE",
    "HUB_MODEL",
    "LITERT_FILE",
    "MIN_PROMPT_TOKENS",
    "MODES",
    "MODE_ROWS",
    "PRESETS",
    "RECIPE_VERSION",
    "SPECULATIVE_RECIPE",
    "CollaborativeFacts",
    "Generation",
    "HeldoutPrompt",
    "LanguageBuildError",
    "LanguageDemoError",
    "LanguageModels",
    "LanguageRecipe",
    "LlmDemoConfig",
    "LlmDemoFiles",
    "LlmDemoReport",
    "ModelShape",
    "PresetSummary",
    "Progress",
    "SpeculativeFacts",
    "TextSplits",
    "TurnFacts",
    "acceptance_from_tokens",
    "build_language_models",
    "build_litert_model",
    "export_genai",
    "export_litert_lm",
    "gap_recovered",
    "greedy_agreement",
    "greedy_generate",
    "heldout_figures",
    "heldout_prompts",
    "hub_ms_per_token",
    "hub_token_share",
    "litert_build_available",
    "load_model",
    "modes_of",
    "percentile",
    "plot_presets",
    "presets_to_run",
    "prompt_lengths",
    "resolve_hub_target",
    "run_llm_demo",
    "speculative_pair",
    "split_calibration",
    "summarize_preset",
    "text_splits",
    "token_agreement",
    "turn_side",
    "write_llm_outputs",
]

Progress = Callable[[str, float], None]
_REPORT = "report.json"


@dataclass(frozen=True, eq=False)
class LanguageModels:
    """Paths to a built (or cached) pair and the report of how it was built and how it scores."""

    directory: Path
    device_model: Path  # ONNX Runtime GenAI directory (og.Model(str(path)))
    hub_model: Path
    device_hf: Path  # the trained checkpoint as a Hugging Face directory
    hub_hf: Path
    report: Mapping[str, Any] = field(default_factory=dict)

    @property
    def heldout(self) -> Mapping[str, Mapping[str, float]]:
        """``{"device": figures, "hub": figures}`` as :func:`heldout_figures` measured them."""
        return self.report["heldout"]


def text_splits(recipe: LanguageRecipe | None = None) -> TextSplits:
    """The training and held-out documents of ``recipe`` (the default recipe if None)."""
    recipe = recipe or LanguageRecipe()
    return load_text_splits(heldout_fraction=recipe.heldout_fraction, seed=recipe.split_seed)


def build_language_models(
    cache_dir: Path | None = None,
    *,
    recipe: LanguageRecipe | None = None,
    progress: Progress | None = None,
    rebuild: bool = False,
    threads: int | None = None,
) -> LanguageModels:
    """Return the language models, building them into the cache only if needed.

    ``progress(stage, fraction)`` is called with a fraction in ``[0, 1]`` within
    each named stage. ``rebuild=True`` ignores a cached entry and replaces it.
    ``threads`` is torch's thread count for training: by default 2 (or the
    usable CPUs if fewer), and 1 when the load average already exceeds the
    usable CPUs (torch's threads spin at each barrier, so on a busy machine a
    second thread makes training several times slower, not faster).
    Raises :class:`LanguageBuildError` when a stage fails.
    """
    recipe = recipe or LanguageRecipe()
    report_progress: Progress = progress or (lambda stage, fraction: None)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = recipe.key()
    final = root / f"language-models-{key}"
    if not rebuild:
        cached = _load(final, key)
        if cached is not None:
            report_progress("load cached language models", 1.0)
            return cached
    build_into_cache(
        final,
        f"lm-{key}",
        lambda tmp: _build_entry(tmp, recipe, key, report_progress, threads or _default_threads()),
        lambda entry: _load(entry, key) is not None,
        rebuild=rebuild,
        error=LanguageBuildError,
        stale=".tmp-lm-*",
    )
    return _load_or_fail(final, key)


def speculative_pair(
    cache_dir: Path | None = None,
    *,
    progress: Progress | None = None,
    rebuild: bool = False,
    threads: int | None = None,
) -> LanguageModels:
    """The pair for speculative decoding (:data:`SPECULATIVE_RECIPE`): a heavy hub (about 84M
    parameters, FP32 on the CPU) and a default-shape device distilled from it; built once
    (about 6 minutes on 2 cores) and cached like the demo pair. Its report's
    ``"agreement"`` holds the device/hub greedy next-token agreement on held-out text."""
    return build_language_models(
        cache_dir, recipe=SPECULATIVE_RECIPE, progress=progress, rebuild=rebuild, threads=threads
    )


def build_litert_model(models: LanguageModels, *, quantization: str = "dynamic_wi8_afp32") -> Path:
    """The pair's device checkpoint as a LiteRT-LM model folder (one ``model.litertlm``),
    converted once by litert-torch into ``<entry>/litert-<quantization>/`` with the
    recipe's context as its KV cache; ``quantization="none"`` keeps FP32 weights.
    Needs ``pip install 'tandem[litert-lm-build]'`` (:func:`litert_build_available`)."""
    context = int(models.report["recipe"]["context"])
    return build_litert_device_model(
        models.directory, models.device_hf, context=context, quantization=quantization
    )


# --------------------------------------------------------------------------- cache


def _paths(directory: Path) -> dict[str, Path]:
    return {
        "device_model": directory / "device",
        "hub_model": directory / "hub",
        "device_hf": directory / "hf" / "device",
        "hub_hf": directory / "hf" / "hub",
    }


def _load(directory: Path, key: str) -> LanguageModels | None:
    """The cached entry if complete and built from the recipe with ``key``, else None."""
    paths = _paths(directory)
    needed = [paths[m] / f for m in ("device_model", "hub_model") for f in _GENAI_FILES] + [
        paths[m] / "config.json" for m in ("device_hf", "hub_hf")
    ]
    if not all(p.exists() for p in needed):
        return None
    try:
        report = json.loads((directory / _REPORT).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("recipe_key") != key:
        return None
    return LanguageModels(directory=directory, report=report, **paths)


_GENAI_FILES = ("model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json")


def _load_or_fail(directory: Path, key: str) -> LanguageModels:
    models = _load(directory, key)
    if models is None:
        raise LanguageBuildError(f"language model cache entry {directory} is incomplete")
    return models


# --------------------------------------------------------------------------- build


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No model hub access while building: the builder and transformers read local files only."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _default_threads() -> int:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    usable = max(1, usable or 1)
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] > usable
    return 1 if busy else min(2, usable)


def _build_entry(
    out: Path, recipe: LanguageRecipe, key: str, progress: Progress, threads: int
) -> None:
    # Not named ``_build``: importing the ``_build`` submodule below rebinds that name on
    # this package to the module, and the next build would call a module.
    with _offline():
        from ._build import build_into

        try:
            report = build_into(
                out, recipe, resolve_hub_target(recipe), _paths(out), progress, threads
            )
        except LanguageBuildError:
            raise
        except (OSError, RuntimeError, ValueError) as e:
            raise LanguageBuildError(f"building the language models failed: {e}") from e
    report = {"recipe_key": key, "recipe_version": RECIPE_VERSION, **report}
    # Written last: _load() treats an entry without a matching report as absent.
    (out / _REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def run_llm_demo(config: LlmDemoConfig, progress: Progress | None = None) -> LlmDemoReport:
    """Run ``config.mode``'s presets on held-out prompts; raises ``DemoError`` (or its
    branches)."""
    started = time.perf_counter()
    report = progress or (lambda stage, fraction: None)
    models = build_language_models(config.cache_dir, recipe=config.recipe, progress=report)
    return serve_and_run(config, models, text_splits(config.recipe).heldout, report, started)
