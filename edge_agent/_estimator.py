"""Online estimates of local latency and of the offload path (RTT, uplink bandwidth).

The heavy check compares ``predict_local_ms`` with ``predict_offload_ms(nbytes)``
against a deadline. Both are exponentially weighted moving averages (EWMA)
fed by real calls; before the first sample each returns its configured prior,
so a fresh device makes sensible choices.

What a deadline must hold back is a different figure: not the typical local
run but a slow one, or a fallback ends late whenever the run after a wait
takes longer than average (it often does: caches went cold while the thread
waited). ``RecentHigh`` is a high quantile of the last few samples (by
default the 97th percentile: of 64 samples, the third largest): it follows
the slow runs, but one or two freak spikes (a page fault, a first run) do
not hold back every deadline after them; ``LatencyEstimator.predict_high_ms``
is the local run's. ``DecayingMax`` is the largest recent sample, fading
with a half-life in time rather than in samples: for figures sampled only
now and then (how late a timed-out wait woke up), where a window of samples
would keep one old spike for hours. Pure arithmetic; thread-safe enough for
CPython (float stores and deque appends are atomic, and an occasional lost
update only delays convergence).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DecayingMax", "Ewma", "LatencyEstimator", "NetworkEstimator", "RecentHigh"]


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


class RecentHigh:
    """The ``quantile`` of the last ``window`` samples; ``prior`` until the first one."""

    def __init__(self, *, window: int = 64, quantile: float = 0.97, prior: float = 0.0) -> None:
        if window < 1 or not 0.0 <= quantile <= 1.0:
            raise ValueError("need window >= 1 and 0 <= quantile <= 1")
        self.prior = prior
        self.quantile = quantile
        self._samples: deque[float] = deque(maxlen=window)

    def observe(self, sample: float) -> None:
        self._samples.append(sample)

    def get(self) -> float:
        samples = sorted(self._samples)  # a few dozen floats: microseconds, offloads only
        if not samples:
            return self.prior
        return samples[round(self.quantile * (len(samples) - 1))]


class DecayingMax:
    """The largest sample, halved every ``half_life_s`` since it was seen; 0 before any."""

    def __init__(
        self, *, half_life_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not half_life_s > 0:
            raise ValueError("half_life_s must be positive")
        self.half_life_s = half_life_s
        self._clock = clock
        self._value = 0.0
        self._at = clock()

    def observe(self, sample: float) -> None:
        now = self._clock()
        self._value = max(sample, self._decayed(now))
        self._at = now

    def get(self) -> float:
        return self._decayed(self._clock())

    def _decayed(self, now: float) -> float:
        return self._value * 0.5 ** (max(0.0, now - self._at) / self.half_life_s)


class LatencyEstimator:
    """Local compute time per call, scaled by how many calls are queued ahead.

    ``predict_ms``: the typical run (EWMA), for routing. ``predict_high_ms``:
    a slow one (the 97th percentile of the last ``window`` runs), for what a
    deadline must reserve.
    """

    def __init__(self, *, prior_ms: float = 5.0, alpha: float = 0.2, window: int = 64) -> None:
        self.compute_ms = Ewma(alpha, prior_ms)
        self.high_ms = RecentHigh(window=window, prior=prior_ms)

    def observe(self, compute_ms: float) -> None:
        self.compute_ms.update(compute_ms)
        self.high_ms.observe(compute_ms)

    def predict_ms(self, queue_depth: int = 0) -> float:
        return self.compute_ms.get() * (1 + max(0, queue_depth))

    def predict_high_ms(self, queue_depth: int = 0) -> float:
        return self.high_ms.get() * (1 + max(0, queue_depth))


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
