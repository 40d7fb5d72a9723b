"""What the text-collaboration measure reads off the two models: the I/O half.

For each turn (a prompt cut from a document's token ids, and the document's
next ``max_tokens`` ids as its reference) one ``TurnData`` holds:

* the device model's prompt score (``PromptScore``) and, teacher-forced on
  the reference (one prefill of prompt + reference per model, every
  position's logits): each reference token's step score on the device, and
  whether the device's and the hub's argmax at that position is the
  reference token (part a);
* the device's own greedy continuation with each token's step score (what a
  live turn's watch reads) (part b).

``HubContinuations`` computes, on demand and cached, the hub's greedy
continuation after the device's first ``j`` tokens and the hub model's mean
log-likelihood of a whole continuation (part b).

Everything runs through ``onnxruntime_genai`` on the exported models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.language import PromptScore, StepScore, prompt_score, step_score

__all__ = ["HubContinuations", "TurnData", "collect_turns", "cut_turns", "mean_loglik"]


@dataclass(frozen=True)
class TurnData:
    document: str
    prompt: tuple[int, ...]
    reference: tuple[int, ...]
    score: PromptScore
    forced_steps: tuple[StepScore, ...]  # device, on the reference tokens
    device_right: np.ndarray  # bool [len(reference)]: the device's argmax is the reference
    hub_right: np.ndarray
    generated: tuple[int, ...]  # the device's greedy continuation
    generated_steps: tuple[StepScore, ...]


def cut_turns(
    documents: Mapping[str, Sequence[int]],
    *,
    lengths: Sequence[int],
    max_tokens: int,
    stride: int,
    limit: int | None = None,
) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """``(document, prompt ids, reference ids)``: a window every ``stride`` tokens of each
    document, its prompt length cycling through ``lengths``. Pure."""
    out: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    cycle = 0
    for name in sorted(documents):
        ids = list(documents[name])
        start = 0
        while True:
            length = lengths[cycle % len(lengths)]
            if start + length + max_tokens > len(ids):
                break
            cycle += 1
            prompt = tuple(ids[start : start + length])
            out.append((name, prompt, tuple(ids[start + length : start + length + max_tokens])))
            start += stride
            if limit is not None and len(out) >= limit:
                return out
    return out


def _prefill(model: Any, ids: Sequence[int]) -> np.ndarray:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids))
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    return np.asarray(generator.get_output("logits"), dtype=np.float64)[0]


def _greedy(model: Any, prompt: Sequence[int], n: int) -> tuple[list[int], list[StepScore]]:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + n)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    tokens: list[int] = []
    steps: list[StepScore] = []
    while len(tokens) < n and not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        steps.append(step_score(generator.get_logits(), token))
        tokens.append(token)
    return tokens, steps


def mean_loglik(logits: np.ndarray, ids: Sequence[int], start: int) -> float:
    """Mean log-probability of ``ids[start:]`` under ``logits`` of every position of ``ids``."""
    rows = logits[start - 1 : len(ids) - 1]
    shifted = rows - rows.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    target = np.asarray(ids[start:])
    return float(log_p[np.arange(len(target)), target].mean()) if len(target) else 0.0


def collect_turns(
    device_model: Path,
    hub_model: Path,
    turns: Sequence[tuple[str, tuple[int, ...], tuple[int, ...]]],
) -> list[TurnData]:
    """Run both models on ``turns`` (see the module docstring)."""
    import onnxruntime_genai as og

    device, hub = og.Model(str(device_model)), og.Model(str(hub_model))
    out = []
    for name, prompt, reference in turns:
        ids = [*prompt, *reference]
        length = len(prompt)
        d_logits, h_logits = _prefill(device, ids), _prefill(hub, ids)
        rows = range(length - 1, len(ids) - 1)
        truth = np.asarray(reference)
        generated, steps = _greedy(device, prompt, len(reference))
        out.append(
            TurnData(
                document=name,
                prompt=prompt,
                reference=reference,
                score=prompt_score(d_logits[:length], prompt),
                forced_steps=tuple(
                    step_score(d_logits[r], t) for r, t in zip(rows, reference, strict=True)
                ),
                device_right=d_logits[length - 1 : -1].argmax(axis=1) == truth,
                hub_right=h_logits[length - 1 : -1].argmax(axis=1) == truth,
                generated=tuple(generated),
                generated_steps=tuple(steps),
            )
        )
    return out


class HubContinuations:
    """The hub's greedy continuation of a turn after ``j`` device tokens, and the hub
    model's mean log-likelihood of the whole continuation; computed once each."""

    def __init__(self, hub_model: Path, turns: Sequence[TurnData]) -> None:
        import onnxruntime_genai as og

        self._hub = og.Model(str(hub_model))
        self._turns = turns
        self._cache: dict[tuple[int, int], float] = {}

    def loglik(self, index: int, at: int | None) -> float:
        """The hub's mean log-likelihood of turn ``index``'s continuation when the hub takes
        it over after ``at`` device tokens (``None``: the device's whole continuation)."""
        turn = self._turns[index]
        n = len(turn.generated)
        j = n if at is None else min(at, n)
        key = (index, j)
        if key not in self._cache:
            head = list(turn.generated[:j])
            tail = _greedy(self._hub, [*turn.prompt, *head], n - j)[0] if j < n else []
            ids = [*turn.prompt, *head, *tail]
            self._cache[key] = mean_loglik(_prefill(self._hub, ids), ids, len(turn.prompt))
        return self._cache[key]
