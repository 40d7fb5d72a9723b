"""How often the device's greedy next token is the hub's: the acceptance a speculative round sees.

Measured on the exported models through ONNX Runtime GenAI (the files a device
and the hub run), teacher-forced: both models read the same held-out windows
(as :func:`heldout_figures` cuts them: ``</s>`` then the document, windows of
``context`` tokens overlapping by one) and, at every position, their argmax
next tokens are compared. The share of positions where they are equal is the
probability that one drafted token is accepted by a greedy verifier, given
the text so far; a round of ``k`` drafts accepts ``p (1 - p^k) / (1 - p)``
tokens on average when positions agree independently with probability ``p``.

Agreement is only as telling as the hub is varied: a hub that answers the
same token everywhere is agreed with trivially. So the figures also say how
concentrated the hub's argmax is (``hub_distinct``: distinct argmax tokens;
``hub_top_share``: the share of positions taken by the most common one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._runtime import load_model

__all__ = ["greedy_agreement"]


def greedy_agreement(
    device_dir: Path,
    hub_dir: Path,
    documents: Iterable[str],
    *,
    context: int,
    eos_id: int,
    max_positions: int = 8192,
) -> dict[str, Any]:
    """``agreement``, ``positions``, ``device_accuracy``, ``hub_accuracy``, ``hub_distinct``
    and ``hub_top_share`` (see the module) on ``documents``.

    Stops after ``max_positions`` compared positions (a heavy hub's prefill is
    the cost); ``positions`` says how many were compared. The two models must
    share their tokenizer (a pair built together does).
    """
    device, hub = load_model(device_dir), load_model(hub_dir)
    agree = device_right = hub_right = positions = 0
    hub_choices: Counter[int] = Counter()
    for window in _windows(hub[1], documents, context, eos_id):
        window = window[: max_positions - positions + 1]
        if len(window) < 2:
            break
        truth = window[1:]
        d = _argmax(device[0], window, context)
        h = _argmax(hub[0], window, context)
        agree += int(np.sum(d == h))
        device_right += int(np.sum(d == truth))
        hub_right += int(np.sum(h == truth))
        hub_choices.update(int(t) for t in h)
        positions += len(truth)
        if positions >= max_positions:
            break
    if positions == 0:
        raise ValueError("no held-out positions to compare")
    return {
        "agreement": round(agree / positions, 4),
        "positions": positions,
        "device_accuracy": round(device_right / positions, 4),
        "hub_accuracy": round(hub_right / positions, 4),
        "hub_distinct": len(hub_choices),
        "hub_top_share": round(hub_choices.most_common(1)[0][1] / positions, 4),
    }


def _windows(
    tokenizer: Any, documents: Iterable[str], context: int, eos_id: int
) -> Iterator[np.ndarray]:
    for text in documents:
        ids = np.concatenate([[eos_id], np.asarray(tokenizer.encode(text), dtype=np.int32)])
        for start in range(0, len(ids) - 1, context - 1):
            window = ids[start : start + context].astype(np.int32)
            if len(window) >= 2:
                yield window


def _argmax(model: Any, window: np.ndarray, context: int) -> np.ndarray:
    """The model's argmax next token after each of ``window``'s positions but the last."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=context)
    generator = og.Generator(model, params)
    generator.append_tokens(window)
    logits = np.asarray(generator.get_output("logits"))[0]
    return np.asarray(logits[: len(window) - 1].argmax(axis=1))
