"""What one request got from the hub: its outputs and how it was served.

A value type both planes and every transport share: the in-process batcher
and the executor loop make one, the MQTT front and the HTTP API answer with
it, metrics and collection read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["HubResult"]


@dataclass(frozen=True)
class HubResult:
    """The outputs of one request and how it was served. Times in milliseconds."""

    outputs: dict[str, np.ndarray]
    model: str
    model_version: str
    queue_ms: float  # from submit to the start of its batch's compute
    compute_ms: float  # the batch's compute
    batch_rows: int  # rows in the batch it ran in (its own included)
    batch_requests: int  # requests in that batch
