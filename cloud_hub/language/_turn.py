"""A turn in the language engine, and the updates its sink receives."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shared import ErrorCode

from ._options import Sampling

__all__ = ["Sink", "Turn", "TurnEngine", "TurnUpdate"]


class _Canceller(Protocol):
    def _cancel(self, turn: Turn) -> None: ...


@dataclass(frozen=True)
class TurnUpdate:
    """New text of a turn; ``finish`` is set on its last update (and only there)."""

    text: str
    tokens: tuple[int, ...]
    finish: str | None = None  # "stop" | "length" | "cancelled" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached_prompt_tokens: int = 0  # prompt tokens a kept conversation did not prefill again
    code: ErrorCode | None = None  # an error's wire code (None: internal)


Sink = Callable[[TurnUpdate], None]


@dataclass(eq=False)
class Turn:
    """One request in the engine. ``cancel()`` from any thread frees its slot."""

    id: int
    prompt: np.ndarray
    max_tokens: int
    sampling: Sampling
    sink: Sink
    deadline: float
    engine: _Canceller
    tokens: list[int] = field(default_factory=list)
    sent: str = ""
    finished: bool = False
    request: Any = None
    turn_id: int = 0
    conversation: str | None = None
    kept: Any = None  # a conversation turn's Kept state while it runs (engine thread)
    cached: int = 0  # prompt tokens reused from the kept conversation
    beside: bool = False  # run on a generator beside the Engine's batch (see _admit)
    queued_at: float = field(default_factory=time.monotonic)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    def cancel(self) -> None:
        self.engine._cancel(self)


class TurnEngine(Protocol):
    """What serves turns of one language model: ``LanguageEngine`` in process, or the
    process plane's client of a language executor (same contract: ``submit`` raises
    ``InvalidRequestError``/``OverloadedError`` or returns a ``Turn`` whose ``sink``
    gets every update, the last one with ``finish``; ``Turn.cancel()`` frees the slot)."""

    def encode(self, text: str) -> np.ndarray: ...

    def default_max_tokens(self, prompt_tokens: int) -> int: ...

    def submit(
        self,
        prompt: Sequence[int] | np.ndarray,
        *,
        max_tokens: int,
        sink: Sink,
        sampling: Sampling | None = None,
        conversation: str | None = None,
    ) -> Turn: ...

    def stats(self) -> dict[str, int]: ...

    def close(self, timeout_s: float = 10.0) -> None: ...
