r"""What a turn takes and gives: ``Sampling`` in, ``TextChunk``\ s and a ``GenerationRecord`` out.

Plain values, no I/O: ``TextStream`` (``_stream``) and ``SpecStream``
(``_speculative``) produce them; ``edge_agent.language`` exports them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import InvalidInputError
from .._result import Source

if TYPE_CHECKING:
    from ._spec_stats import SpecStats

__all__ = ["FinishReason", "GenerationRecord", "Sampling", "TextChunk"]


class FinishReason(enum.StrEnum):
    STOP = "stop"  # the model ended its text (end-of-sequence token)
    LENGTH = "length"  # max_tokens, or the model's context length
    DEADLINE = "deadline"  # deadline_ms passed
    CANCELLED = "cancelled"  # the caller closed the stream
    ERROR = "error"  # cloud_only: the hub failed the turn (``record.error`` says how)


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the next token is chosen: greedy (the default) or sampled.

    ``Sampling()`` is greedy. Any of ``temperature``, ``top_k``, ``top_p``
    makes it sample (ONNX Runtime GenAI's ``do_sample``); ``seed`` makes a
    sampled turn repeatable.
    """

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if t is not None and not (isinstance(t, int | float) and 0 < t < math.inf):
            raise InvalidInputError(f"temperature must be a positive number, got {t!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise InvalidInputError(f"top_k must be an integer >= 1, got {k!r}")
        if p is not None and not (isinstance(p, int | float) and 0 < p <= 1):
            raise InvalidInputError(f"top_p must be in (0, 1], got {p!r}")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int)):
            raise InvalidInputError(f"seed must be an integer, got {s!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature is None and self.top_k is None and self.top_p is None

    def search_options(self) -> dict[str, Any]:
        """``GeneratorParams.set_search_options`` keywords (``max_length`` comes on top)."""
        if self.greedy:
            return {"do_sample": False}
        options: dict[str, Any] = {"do_sample": True}
        if self.temperature is not None:
            options["temperature"] = float(self.temperature)
        if self.top_k is not None:
            options["top_k"] = self.top_k
        if self.top_p is not None:
            options["top_p"] = float(self.top_p)
        if self.seed is not None:
            options["random_seed"] = self.seed
        return options


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Text produced by one side; ``index`` counts the chunks of the turn from 0."""

    text: str
    source: Source
    index: int
    tokens: int  # tokens this chunk decodes (a character may span several)


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """How a turn ended and what it cost. Times in ms; rates in tokens per second."""

    finish_reason: FinishReason
    text: str
    output_ids: tuple[int, ...]
    preset: str
    reason: str  # the route's reason: "edge_only", "prefer_edge", "heavy"
    edge_tokens: int  # output tokens the device produced
    cloud_tokens: int  # output tokens the hub produced
    prompt_tokens: int  # the whole prompt the model saw (a conversation's history included)
    prompt_tokens_prefilled: int  # computed in this turn's prefill
    prompt_tokens_reused: int  # already in the kept KV cache
    time_to_first_token_ms: float | None  # from the call to the first token; None without one
    tokens_per_s: float | None  # output tokens / decode time
    prefill_ms: float
    decode_ms: float
    total_ms: float
    fallbacks: tuple[str, ...]  # why the turn ran elsewhere than its preset asked
    model: str  # "name@version"
    accelerator: str
    degraded: bool = False  # the hub was asked and failed: the device finished the turn
    error: str | None = None  # why a turn ended "error" (cloud_only and the hub failed)
    hub: str | None = None  # the hub replica that answered (None: none, or an older hub)
    sticky: bool = False  # sent to the replica holding the conversation's KV cache
    rerouted: str | None = None  # why a sticky turn then went to any replica (re-prefilled)
    handoff_at: int | None = None  # device tokens streamed before the hub took the turn over
    handoff_score: float | None = None  # the turn's peak window uncertainty (with a watch)
    prompt_score: float | None = None  # the prompt's mean NLL on the device (when scored)
    speculation: SpecStats | None = None  # what a speculative turn did (_speculative)
