"""Counters a batcher keeps, readable from any thread as an immutable snapshot.

Kept deliberately plain (ints, floats and one histogram) so that an exporter
(Prometheus, a log line, a test) reads ``snapshot()`` without knowing how
the batcher works. Every update takes one short lock; the batcher calls them
outside its own queue lock.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["BatcherMetrics", "BatcherStats"]


_COUNTERS = frozenset(
    {
        "submitted",
        "rejected_invalid",
        "rejected_overloaded",
        "expired",
        "cancelled",
        "completed",
        "failed",
        "batches",
        "rows",
    }
)


@dataclass(frozen=True)
class BatcherStats:
    """A point-in-time copy of a batcher's counters. Times are in milliseconds."""

    submitted: int = 0  # accepted into the queue
    rejected_invalid: int = 0  # refused by the argument checks
    rejected_overloaded: int = 0  # refused because the queue was full (or stopping)
    expired: int = 0  # deadline passed before compute
    cancelled: int = 0  # the caller cancelled, or the batcher stopped, before compute
    completed: int = 0  # answered with outputs
    failed: int = 0  # the executor raised for their batch
    batches: int = 0
    rows: int = 0  # rows computed, over all batches
    batch_rows: dict[int, int] = field(default_factory=dict)  # rows in a batch -> batches
    batch_requests: dict[int, int] = field(default_factory=dict)  # requests in a batch -> batches
    batch_compute_ms: dict[int, float] = field(default_factory=dict)  # rows -> summed compute
    last_batch_at: float = 0.0  # wall clock (time.time()) at the end of the last batch; 0: none
    queue_ms_total: float = 0.0  # summed over computed requests
    compute_ms_total: float = 0.0  # summed over batches

    @property
    def mean_batch_rows(self) -> float:
        return self.rows / self.batches if self.batches else 0.0

    @property
    def mean_queue_ms(self) -> float:
        done = self.completed + self.failed
        return self.queue_ms_total / done if done else 0.0

    @property
    def mean_compute_ms(self) -> float:
        return self.compute_ms_total / self.batches if self.batches else 0.0


class BatcherMetrics:
    """Thread-safe counters behind ``BatcherStats``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._batch_rows: Counter[int] = Counter()
        self._batch_requests: Counter[int] = Counter()
        self._batch_compute_ms: dict[int, float] = {}
        self._last_batch_at = 0.0
        self._queue_ms = 0.0
        self._compute_ms = 0.0

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to a counter named like a ``BatcherStats`` field."""
        if what not in _COUNTERS:
            raise ValueError(f"unknown counter {what!r}; known: {sorted(_COUNTERS)}")
        with self._lock:
            self._counts[what] += n

    def record_batch(
        self, *, rows: int, queue_ms: Iterable[float], compute_ms: float, ok: bool
    ) -> None:
        waits = list(queue_ms)
        now = time.time()
        with self._lock:
            self._counts["batches"] += 1
            self._counts["rows"] += rows
            self._counts["completed" if ok else "failed"] += len(waits)
            self._batch_rows[rows] += 1
            self._batch_requests[len(waits)] += 1
            self._batch_compute_ms[rows] = self._batch_compute_ms.get(rows, 0.0) + compute_ms
            self._last_batch_at = now
            self._queue_ms += sum(waits)
            self._compute_ms += compute_ms

    def snapshot(self) -> BatcherStats:
        with self._lock:
            return BatcherStats(
                **{k: v for k, v in self._counts.items() if k in _COUNTERS},
                batch_rows=dict(sorted(self._batch_rows.items())),
                batch_requests=dict(sorted(self._batch_requests.items())),
                batch_compute_ms=dict(sorted(self._batch_compute_ms.items())),
                last_batch_at=self._last_batch_at,
                queue_ms_total=self._queue_ms,
                compute_ms_total=self._compute_ms,
            )
