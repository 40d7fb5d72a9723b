"""Text generation on the device, the second runtime (issue 22, item 3): LiteRT-LM vs ORT GenAI.

Standalone, where ``pip install 'tandem[litert-lm-build]'`` is installed (not in
``make bench``'s parts: that extra is not in dev): ``python -m
bench.edge_generate_litert [--rounds N]``. It takes the device checkpoint of
the pair bench (h2) uses (the default device shape, context 1024, from the cache
or built), exports it four ways from the same weights: ORT GenAI INT4 (the
shipped device model) and FP32 (``export_genai``), LiteRT-LM INT8
(``dynamic_wi8_afp32``, litert-torch's default) and FP32 (``export_litert_lm``,
each conversion timed in a child interpreter), then runs ``EdgeAgent.generate``
on each, interleaved, greedily on one prompt. Figures per model: load time,
decode tokens/s and time to first token (medians of rounds), bytes on disk, and
whether its greedy ids equal the ORT GenAI model's of the same precision class.
Writes ``bench/results/edge-generate-litert.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run"]

PROMPT = 'The "assert" statement'
_COLUMNS = ["model", "runs on", "bytes on disk", "export s", "load ms", "decode tokens/s",
            "vs ORT GenAI FP32", "time to first token ms"]  # fmt: skip


def _recipe() -> Any:
    from tandem.demo.language import LanguageRecipe

    # bench (h2)'s pair: the default device shape with a 1024-token context, 4 steps
    return LanguageRecipe(context=1024, steps=4, max_train_seconds=60.0, hub_provider="cpu")


def _export_all(work: Path) -> tuple[dict[str, Path], dict[str, float]]:
    from tandem.demo.language import build_language_models, export_genai, export_litert_lm

    models = build_language_models(recipe=_recipe())
    context = int(models.report["recipe"]["context"])
    folders = {"ORT GenAI INT4": models.device_model}
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    export_genai(models.device_hf, work / "ort-fp32", precision="fp32", provider="cpu")
    seconds["ORT GenAI FP32"] = time.perf_counter() - started
    folders["ORT GenAI FP32"] = work / "ort-fp32"
    for label, recipe in (("LiteRT-LM INT8", "dynamic_wi8_afp32"), ("LiteRT-LM FP32", "none")):
        started = time.perf_counter()
        export_litert_lm(models.device_hf, work / label, quantization=recipe, cache_length=context)
        seconds[label] = time.perf_counter() - started
        folders[label] = work / label
    return folders, seconds


def _size(folder: Path) -> int:
    names = ("model.onnx", "model.onnx.data", "model.litertlm")
    return sum(p.stat().st_size for p in folder.iterdir() if p.name in names)


def run(*, rounds: int = 50, max_tokens: int = 96) -> dict[str, Any]:
    from edge_agent import EdgeAgent

    with tempfile.TemporaryDirectory(prefix="bench-litert-") as tmp:
        folders, export_s = _export_all(Path(tmp))
        agents: dict[str, Any] = {}
        load_s: dict[str, float] = {}
        for label, folder in folders.items():
            started = time.perf_counter()
            agents[label] = EdgeAgent(None, device_id="bench-phone", language_model=folder)
            load_s[label] = time.perf_counter() - started
        rates: dict[str, list[float]] = {label: [] for label in agents}
        ttft: dict[str, list[float]] = {label: [] for label in agents}
        ids: dict[str, tuple[int, ...]] = {}
        for i in range(rounds + 3):  # 3 warm-up rounds
            for label, agent in agents.items():
                record = agent.generate(PROMPT, max_tokens=max_tokens).final()
                ids[label] = tuple(record.output_ids)
                if i >= 3 and record.tokens_per_s is not None:
                    rates[label].append(record.tokens_per_s)
                    assert record.time_to_first_token_ms is not None
                    ttft[label].append(record.time_to_first_token_ms)
        accelerators = {label: agent.language.accelerator for label, agent in agents.items()}
        for agent in agents.values():
            agent.close()
        sizes = {label: _size(folder) for label, folder in folders.items()}
    same_fp32 = ids["LiteRT-LM FP32"] == ids["ORT GenAI FP32"]
    same_quant = ids["LiteRT-LM INT8"] == ids["ORT GenAI INT4"]
    ort_fp32 = statistics.median(rates["ORT GenAI FP32"])
    rows = [
        [
            label, accelerators[label], sizes[label],
            f"{export_s[label]:.1f}" if label in export_s else "(the cached build)",
            f"{load_s[label] * 1e3:.0f}", round(statistics.median(rates[label])),
            f"{statistics.median(rates[label]) / ort_fp32:.2f}",
            f"{statistics.median(ttft[label]):.2f}",
        ]
        for label in folders
    ]  # fmt: skip
    return {
        "part": "edge-generate-litert",
        "title": "(h) Text generation on the device: LiteRT-LM beside ONNX Runtime GenAI",
        "summary": (
            f"The device checkpoint of bench (h2)'s pair (hidden 64, 2 layers, vocabulary "
            f"2048, context 1024) exported four ways; EdgeAgent.generate, prompt {PROMPT!r}, "
            f"{max_tokens} greedy tokens, {rounds} interleaved rounds per model."
        ),
        "targets": [
            {
                "name": "LiteRT-LM FP32 greedy ids = ORT GenAI FP32's (same weights)",
                "target": "equal",
                "measured": "equal" if same_fp32 else "differ",
                "met": same_fp32,
                "limited_by": None if same_fp32 else "the two runtimes' FP32 kernels",
            }
        ],
        "tables": [
            {
                "title": "Per model (medians of rounds)",
                "columns": _COLUMNS,
                "rows": rows,
            }
        ],
        "plots": [],
        "notes": [
            f"LiteRT-LM INT8 and ORT GenAI INT4 greedy ids: {'equal' if same_quant else 'differ'}"
            " (different quantizations of the same weights).",
            "LiteRT-LM's Python session streams text from its own decode thread; the agent "
            "re-tokenizes each piece (edge_agent/language/_litert_runtime.py). On this ~0.2M-"
            "parameter model both runtimes are bound by per-token overhead, not arithmetic.",
            "Export s: a child interpreter for litert-torch (its imports included), in-process "
            "for ORT GenAI's builder (torch and transformers already imported).",
        ],
        "data": {"rates": rates, "ttft_ms": ttft, "export_s": export_s, "load_s": load_s},
    }


def main(argv: list[str] | None = None) -> int:
    from ._report import publish

    parser = argparse.ArgumentParser(
        prog="python -m bench.edge_generate_litert", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=50, help="measured rounds (default 50)")
    args = parser.parse_args(argv)
    return publish(lambda: run(rounds=args.rounds))


if __name__ == "__main__":
    sys.exit(main())
