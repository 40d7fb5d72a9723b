"""Three ways to the device model's logits of every prompt position, measured.

``og.Generator.get_logits`` gives the last position only, so a prompt score
could (1) append the prompt a token at a time and read ``get_logits`` after
each, or (2) run the device's ``model.onnx`` in plain ONNX Runtime with an
empty KV cache, which returns every position's logits; or (3) read
``get_output("logits")`` after the turn's own prefill (one ``append_tokens``
of the prompt), which ONNX Runtime GenAI also fills for every appended
position. ``prompt_score_methods`` times each per prompt and reports how far
their scores are from (3)'s. The edge uses (3): it agrees with the others,
and it is the prefill the turn runs anyway, so the score costs only its
log-softmax.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.language import prompt_score

__all__ = ["prompt_score_methods"]


def _prefill(og: Any, model: Any, ids: Sequence[int]) -> np.ndarray:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    return np.asarray(generator.get_output("logits"))[0]


def _stepwise(og: Any, model: Any, ids: Sequence[int]) -> np.ndarray:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1)
    generator = og.Generator(model, params)
    rows = []
    for token in ids:
        generator.append_tokens(np.asarray([token], dtype=np.int32))
        rows.append(np.asarray(generator.get_logits()).reshape(-1))
    return np.stack(rows)


def _plain_feed(session: Any, ids: Sequence[int], head_size: int) -> dict[str, np.ndarray]:
    n = len(ids)
    feed: dict[str, np.ndarray] = {}
    for item in session.get_inputs():
        if item.name == "input_ids":
            feed[item.name] = np.asarray([ids], dtype=np.int64)
        elif item.name == "attention_mask":
            feed[item.name] = np.ones((1, n), dtype=np.int64)
        elif item.name == "position_ids":
            feed[item.name] = np.arange(n, dtype=np.int64)[None, :]
        else:  # past_key_values.*: empty, [batch, kv heads, 0, head size]
            dtype = np.float16 if "float16" in item.type else np.float32
            feed[item.name] = np.zeros((1, int(item.shape[1]), 0, head_size), dtype=dtype)
    return feed


def prompt_score_methods(device_model: Path, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Per method: mean ms per prompt, and the largest |score - prefill's score| (nats)."""
    import onnxruntime as ort
    import onnxruntime_genai as og

    model = og.Model(str(device_model))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        str(Path(device_model) / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )

    config = json.loads((Path(device_model) / "genai_config.json").read_text())
    head_size = int(config["model"]["decoder"]["head_size"])

    def plain(ids: Sequence[int]) -> np.ndarray:
        return np.asarray(session.run(["logits"], _plain_feed(session, ids, head_size))[0])[0]

    methods = {
        "prefill get_output": lambda ids: _prefill(og, model, ids),
        "token by token get_logits": lambda ids: _stepwise(og, model, ids),
        "plain onnxruntime": plain,
    }
    scores: dict[str, list[float]] = {name: [] for name in methods}
    seconds: dict[str, float] = dict.fromkeys(methods, 0.0)
    for ids in prompts:
        for name, run in methods.items():
            started = time.perf_counter()
            scores[name].append(prompt_score(run(ids), ids).mean_nll)
            seconds[name] += time.perf_counter() - started
    base = np.asarray(scores["prefill get_output"])
    return {
        name: {
            "ms_per_prompt": round(1000 * seconds[name] / max(len(prompts), 1), 3),
            "max_abs_diff_nats": float(np.abs(np.asarray(values) - base).max()),
        }
        for name, values in scores.items()
    } | {"prompts": len(prompts), "mean_tokens": float(np.mean([len(p) for p in prompts]))}
