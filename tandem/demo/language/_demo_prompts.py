"""The ``tandem demo --llm`` prompts: windows of the held-out documents, without I/O.

Each prompt is the start of a window of a held-out document (never seen in
training) and its reference is the next ``max_tokens`` tokens of the same
document. Prompt lengths spread evenly from ``MIN_PROMPT_TOKENS`` to what the
context leaves, so the heavy rule has light and heavy prompts to tell apart.
Windows come round-robin from the documents (one per document before any
second), and a window is kept only if its prompt text encodes back to the
same tokens, so the model continues exactly the tokens the reference follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MIN_PROMPT_TOKENS", "HeldoutPrompt", "heldout_prompts", "prompt_lengths"]

MIN_PROMPT_TOKENS = 8


@dataclass(frozen=True)
class HeldoutPrompt:
    document: str  # the held-out topic it comes from
    text: str  # what the agent is asked to continue
    prompt_ids: tuple[int, ...]
    reference_ids: tuple[int, ...]  # the document's next tokens: what a perfect model writes


def prompt_lengths(count: int, *, max_tokens: int, context: int) -> list[int]:
    """``count`` prompt lengths from ``MIN_PROMPT_TOKENS`` up to ``context - max_tokens - 1``."""
    longest = context - max_tokens - 1
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if longest < MIN_PROMPT_TOKENS:
        raise ValueError(
            f"max_tokens {max_tokens} leaves no room for a {MIN_PROMPT_TOKENS}-token prompt "
            f"in the model's {context}-token context (use at most "
            f"{context - MIN_PROMPT_TOKENS - 1})"
        )
    if count == 1:
        return [longest]
    step = (longest - MIN_PROMPT_TOKENS) / (count - 1)
    return [round(MIN_PROMPT_TOKENS + i * step) for i in range(count)]


def heldout_prompts(
    documents: Mapping[str, str],
    *,
    count: int,
    max_tokens: int,
    context: int,
    encode: Callable[[str], Sequence[int]],
    decode: Callable[[list[int]], str],
) -> list[HeldoutPrompt]:
    """``count`` prompts with their references; ``ValueError`` when the text has too few."""
    lengths = prompt_lengths(count, max_tokens=max_tokens, context=context)
    tokens = {name: list(encode(text)) for name, text in documents.items()}
    cursor = dict.fromkeys(tokens, 0)  # where each document's next window starts
    prompts: list[HeldoutPrompt] = []
    for length in lengths:
        prompt = _next_window(tokens, cursor, length, max_tokens, encode, decode)
        if prompt is None:
            raise ValueError(
                f"the held-out text has room for {len(prompts)} of {count} prompts of up to "
                f"{lengths[-1]} + {max_tokens} tokens: ask for fewer prompts or tokens"
            )
        prompts.append(prompt)
    return prompts


def _next_window(
    tokens: Mapping[str, list[int]],
    cursor: dict[str, int],
    length: int,
    max_tokens: int,
    encode: Callable[[str], Sequence[int]],
    decode: Callable[[list[int]], str],
) -> HeldoutPrompt | None:
    """The next usable window of ``length + max_tokens`` tokens, from the least used document."""
    need = length + max_tokens
    for name in sorted(tokens, key=lambda n: (cursor[n], n)):
        ids = tokens[name]
        while cursor[name] + need <= len(ids):
            start = cursor[name]
            cursor[name] = start + need
            prompt_ids = ids[start : start + length]
            text = decode(prompt_ids)
            if text.strip() and list(encode(text)) == prompt_ids:
                reference = ids[start + length : start + need]
                return HeldoutPrompt(name, text, tuple(prompt_ids), tuple(reference))
    return None
