"""Run the exported models with ONNX Runtime GenAI: held-out figures and greedy generation.

Everything here goes through ``onnxruntime_genai`` (its tokenizer, its
``Generator`` and KV cache), not torch, so the figures describe the files a
device or the hub actually runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Generation", "greedy_generate", "heldout_figures", "load_model"]


@dataclass(frozen=True)
class Generation:
    """What :func:`greedy_generate` produced and how fast."""

    prompt_tokens: int
    tokens: list[int]
    text: str
    prefill_s: float  # append_tokens of the prompt
    decode_s: float  # the generate_next_token loop

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else math.inf


def load_model(directory: Path) -> tuple[Any, Any]:
    """``(og.Model, og.Tokenizer)`` for an exported model directory."""
    import onnxruntime_genai as og

    model = og.Model(str(directory))
    return model, og.Tokenizer(model)


def heldout_figures(
    directory: Path, documents: Iterable[str], *, context: int, eos_id: int
) -> dict[str, float]:
    """Per-token cross-entropy (nats), perplexity, next-token accuracy and bits per character.

    Each document is encoded by the model's own ONNX Runtime GenAI tokenizer,
    prefixed with ``</s>`` (what precedes a document in training) and cut into
    windows of ``context`` tokens overlapping by one, so every token after the
    first is predicted exactly once, from the tokens before it in its window.
    One prefill per window; the model returns logits for every position.
    """
    import onnxruntime_genai as og

    model, tokenizer = load_model(directory)
    nats = 0.0
    correct = 0
    targets = 0
    chars = 0
    for text in documents:
        chars += len(text)
        ids = np.concatenate([[eos_id], np.asarray(tokenizer.encode(text), dtype=np.int32)])
        for start in range(0, len(ids) - 1, context - 1):
            window = ids[start : start + context].astype(np.int32)
            if len(window) < 2:
                break
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=context)
            generator = og.Generator(model, params)
            generator.append_tokens(window)
            logits = np.asarray(generator.get_output("logits"), dtype=np.float64)[0]
            logits = logits[: len(window) - 1]
            shifted = logits - logits.max(axis=1, keepdims=True)
            log_z = np.log(np.exp(shifted).sum(axis=1))
            truth = window[1:]
            nats += float(np.sum(log_z - shifted[np.arange(len(truth)), truth]))
            correct += int(np.sum(logits.argmax(axis=1) == truth))
            targets += len(truth)
    if targets == 0:
        raise ValueError("no held-out tokens to evaluate")
    loss = nats / targets
    return {
        "loss_nats_per_token": round(loss, 4),
        "perplexity": round(math.exp(loss), 3),
        "next_token_accuracy": round(correct / targets, 4),
        "bits_per_char": round(nats / math.log(2) / chars, 4),
        "tokens": targets,
    }


def greedy_generate(
    directory: Path | tuple[Any, Any], prompt: str | Sequence[int], max_new: int
) -> Generation:
    """Greedy decoding with ``og.Generator``: append the prompt, then one token per step.

    ``prompt`` is text or token ids. Stops at ``max_new`` tokens or at ``</s>``;
    prompt plus ``max_new`` must fit the model's context length (ONNX Runtime
    GenAI refuses otherwise). ``directory`` may be a ``(model, tokenizer)`` pair
    from :func:`load_model`.
    """
    import onnxruntime_genai as og

    model, tokenizer = load_model(directory) if isinstance(directory, Path) else directory
    ids = np.asarray(tokenizer.encode(prompt) if isinstance(prompt, str) else prompt, np.int32)
    if len(ids) == 0:
        raise ValueError("the prompt encodes to no tokens")
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + max_new)
    generator = og.Generator(model, params)
    started = time.perf_counter()
    generator.append_tokens(ids)
    prefilled = time.perf_counter()
    out: list[int] = []
    while len(out) < max_new and not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    finished = time.perf_counter()
    return Generation(
        prompt_tokens=len(ids),
        tokens=out,
        text=tokenizer.decode(np.asarray(out, dtype=np.int32)) if out else "",
        prefill_s=prefilled - started,
        decode_s=finished - prefilled,
    )
