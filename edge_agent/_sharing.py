"""Sharing the device's answers with the hub, so that it can keep hard examples (opt-in).

An agent given ``share_answers=ExampleSharing(...)`` puts a
``shared.EdgeAnswer`` into the header of every request it offloads: its edge
model (``name@version``), the top class of each row of its local output (none
when the local model did not run: a heavy request), its uncertainty score,
and whether this request was drawn into the random sample
(``sample_rate``), which the hub keeps even when edge and cloud agree. The
hub keeps examples only from requests that carry an answer, and only for
models whose configuration collects: without ``share_answers`` nothing
about the local answer leaves the device and its inputs are never kept.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared import EdgeAnswer, FrameError

__all__ = ["ExampleSharing"]


@dataclass(kw_only=True)
class ExampleSharing:
    """What an agent says about its own answer when it offloads; see the module docstring."""

    sample_rate: float = 0.0  # share of offloaded requests marked sampled
    seed: int | None = None  # for a reproducible sample
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"sample_rate must be within [0, 1], got {rate!r}")
        self._rng = random.Random(self.seed)

    def header(
        self,
        model: str,
        local_outputs: Mapping[str, np.ndarray] | None,
        score: float | None,
    ) -> dict[str, Any]:
        """The request header fields for one offload (``{}`` if they cannot be written)."""
        first = None if not local_outputs else next(iter(local_outputs.values()))
        sampled = self.sample_rate > 0 and self._rng.random() < self.sample_rate
        try:
            answer = EdgeAnswer.of(model or None, first, score, sampled=sampled)
        except FrameError:  # a model name the header cannot carry: share nothing, still offload
            return {}
        return answer.header()
