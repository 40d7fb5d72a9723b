"""One request's state as it moves through the agent (shared by both agents' cores)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ._telemetry import ServingStats
from ._tracing import CallTrace
from .runtimes import ModelRuntime

__all__ = ["Call"]

_now = time.perf_counter


@dataclass(slots=True)
class Call:
    """State of one request as it moves through the agent."""

    request_id: str
    inputs: dict[str, np.ndarray]
    deadline_ms: float
    started: float
    runtime: ModelRuntime | None  # read once: a model swap mid-call does not affect it
    serving: ServingStats  # the counters of that runtime
    local_outputs: dict[str, np.ndarray] | None = None
    local_ms: float = 0.0
    score: float | None = None
    wake_at: float = 0.0  # perf_counter time at which the wait for the cloud must end
    trace: CallTrace | None = None  # its spans, when the agent traces

    def elapsed_ms(self) -> float:
        return (_now() - self.started) * 1000.0

    @property
    def payload_bytes(self) -> int:
        # Computed when asked: the local path of an always-local policy never asks.
        total = 0
        for array in self.inputs.values():
            total += array.nbytes
        return total
