"""Online estimates of local latency and of the offload path (RTT, uplink bandwidth).

The heavy check compares ``predict_local_ms`` with ``predict_offload_ms(nbytes)``
against a deadline. Both are exponentially weighted moving averages (EWMA)
fed by real calls; before the first sample each returns its configured prior,
so a fresh device makes sensible choices. Pure arithmetic; thread-safe enough
for CPython (float stores are atomic and an occasional lost update only
delays convergence).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ewma", "LatencyEstimator", "NetworkEstimator"]


@dataclass
class Ewma:
    """EWMA with a prior used until the first sample."""

    alpha: float = 0.2
    prior: float = 0.0
    value: float | None = None
    samples: int = 0

    def update(self, sample: float) -> None:
        self.samples += 1
        if self.value is None:
            self.value = sample
        else:
            self.value += self.alpha * (sample - self.value)

    def get(self) -> float:
        return self.prior if self.value is None else self.value


class LatencyEstimator:
    """Local compute time per call, scaled by how many calls are queued ahead."""

    def __init__(self, *, prior_ms: float = 5.0, alpha: float = 0.2) -> None:
        self.compute_ms = Ewma(alpha, prior_ms)

    def observe(self, compute_ms: float) -> None:
        self.compute_ms.update(compute_ms)

    def predict_ms(self, queue_depth: int = 0) -> float:
        return self.compute_ms.get() * (1 + max(0, queue_depth))


class NetworkEstimator:
    """Offload time = round trip + bytes / uplink bandwidth + hub time.

    A round trip's network share is its total minus what the hub reported
    spending. Small payloads (below ``small_payload_bytes``) teach the RTT;
    large ones teach the per-byte cost above that RTT.
    """

    def __init__(
        self,
        *,
        prior_rtt_ms: float = 50.0,
        prior_bandwidth_bytes_per_s: float = 1_000_000.0,
        prior_hub_ms: float = 10.0,
        small_payload_bytes: int = 16 * 1024,
        alpha: float = 0.2,
    ) -> None:
        self.rtt_ms = Ewma(alpha, prior_rtt_ms)
        self.ms_per_byte = Ewma(alpha, 1000.0 / prior_bandwidth_bytes_per_s)
        self.hub_ms = Ewma(alpha, prior_hub_ms)
        self.small_payload_bytes = small_payload_bytes

    def observe(self, *, total_ms: float, hub_ms: float, payload_bytes: int) -> None:
        network_ms = max(0.0, total_ms - hub_ms)
        self.hub_ms.update(hub_ms)
        if payload_bytes < self.small_payload_bytes:
            self.rtt_ms.update(network_ms)
        else:
            extra = max(0.0, network_ms - self.rtt_ms.get())
            self.ms_per_byte.update(extra / payload_bytes)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        per_byte = self.ms_per_byte.get()
        return float("inf") if per_byte <= 0 else 1000.0 / per_byte

    def predict_ms(self, payload_bytes: int) -> float:
        return self.rtt_ms.get() + payload_bytes * self.ms_per_byte.get() + self.hub_ms.get()
