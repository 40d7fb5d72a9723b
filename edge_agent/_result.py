"""What every ``infer`` call returns: the answer, where it came from, and what it cost."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

__all__ = ["InferenceResult", "LatencyBreakdown", "Source"]


class Source(enum.StrEnum):
    EDGE = "edge"  # the local model answered, by choice
    CLOUD = "cloud"  # the hub answered
    EDGE_FALLBACK = "edge-fallback"  # the cloud was asked but failed; the local answer stands


@dataclass(frozen=True, slots=True)
class LatencyBreakdown:
    """Milliseconds spent, by part. ``network_ms`` is the round trip minus hub time."""

    total_ms: float
    local_ms: float = 0.0
    network_ms: float = 0.0
    queue_ms: float = 0.0  # waiting in the hub's batcher
    cloud_compute_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class InferenceResult:
    outputs: dict[str, np.ndarray]
    source: Source
    request_id: str
    reason: str  # why this route: "confident", "uncertain", "heavy:latency", "fallback:timeout", …
    latency: LatencyBreakdown
    model_versions: dict[str, str] = field(default_factory=dict)  # {"edge": "mnist@3", "cloud": …}
    score: float | None = None  # uncertainty of the local answer (higher = less sure)
    deadline_met: bool = True

    @property
    def degraded(self) -> bool:
        """True when the cloud was wanted but the local answer had to do."""
        return self.source is Source.EDGE_FALLBACK

    @property
    def output(self) -> np.ndarray:
        """The first output tensor (most models have one)."""
        return next(iter(self.outputs.values()))

    @property
    def confidence(self) -> float | None:
        """1 - the uncertainty score, when a score was computed."""
        return None if self.score is None else 1.0 - self.score
