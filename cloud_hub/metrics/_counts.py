"""What the hub has counted of one served model version, read for the statistics API.

``ModelCounts`` is the plain record that ``GET /v2/models/.../stats`` maps to
Triton's JSON (``cloud_hub.http._statistics``); both planes fill it from
what they already count, under the same names as ``/metrics``:

- an in-process ``Hub``: ``HubMetrics.model_counts`` (``_prometheus``), from
  its registry and the batcher's ``BatcherStats``;
- a process plane: ``counts_from_books`` over every process's ``MetricsBook``
  (``read_books``): the ingresses' success, failure and request-duration
  counters, the executors' queue, compute and per-batch-size counters
  (``tandem_batch_executions`` and ``tandem_batch_compute_us``, labelled by
  the batch's rows, 1 … max_batch_size) and ``tandem_last_inference_ms``.

Durations are in microseconds, as the metrics keep them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ._book import MetricsBook, merge_books

__all__ = ["ModelCounts", "counts_from_books"]


@dataclass(frozen=True)
class ModelCounts:
    """The counts of ``model`` at ``version`` (zeros: nothing counted yet)."""

    model: str
    version: str
    success: int = 0  # requests answered with outputs, every transport
    success_us: float = 0.0  # their receipt-to-reply time, summed
    failure: int = 0  # requests answered with an error (no duration is kept for them)
    queue: int = 0  # computed requests
    queue_us: float = 0.0  # their time in the queue, summed
    compute: int = 0  # computed requests (each observes its whole batch's compute)
    compute_us: float = 0.0
    inference_count: int = 0  # rows computed
    execution_count: int = 0  # batches executed
    batches: Mapping[int, tuple[int, float]] = field(default_factory=dict)
    """Rows in a batch -> (batches of that size, their compute summed, µs)."""
    last_inference_ms: int = 0  # wall clock (ms since the epoch) of the last batch; 0: none


def counts_from_books(
    books: Iterable[tuple[MetricsBook, bool]], model: str, version: str
) -> ModelCounts:
    """``ModelCounts`` of ``model@version`` from ``read_books``' books (living and dead)."""
    books = list(books)
    merged = merge_books(books)
    mine = (model, version)

    def counter(name: str) -> float:
        return sum(v for (n, lb), v in merged.counters.items() if n == name and lb[:2] == mine)

    def histogram(name: str) -> tuple[int, float]:
        found = merged.histograms.get((name, mine))
        return (0, 0.0) if found is None else (found.count, found.total)

    def histograms(name: str) -> tuple[int, float]:  # summed over the transports
        found = [h for (n, lb), h in merged.histograms.items() if n == name and lb[:2] == mine]
        return sum(h.count for h in found), sum(h.total for h in found)

    executions: dict[int, int] = {}
    compute_by_size: dict[int, float] = {}
    for (name, labels), value in merged.counters.items():
        if labels[:2] != mine or len(labels) != 3:
            continue
        if name == "tandem_batch_executions":
            executions[int(labels[2])] = int(value)
        elif name == "tandem_batch_compute_us":
            compute_by_size[int(labels[2])] = value
    last = max(
        (
            v
            for book, _alive in books
            for (n, lb), v in book.gauges.items()
            if n == "tandem_last_inference_ms" and lb == mine
        ),
        default=0.0,
    )
    _, success_us = histograms("tandem_inference_request_duration_us")
    queue, queue_us = histogram("tandem_inference_queue_duration_us")
    compute, compute_us = histogram("tandem_inference_compute_infer_duration_us")
    return ModelCounts(
        model,
        version,
        success=int(counter("tandem_inference_request_success")),
        success_us=success_us,
        failure=int(counter("tandem_inference_request_failure")),
        queue=queue,
        queue_us=queue_us,
        compute=compute,
        compute_us=compute_us,
        inference_count=int(counter("tandem_inference_count")),
        execution_count=int(counter("tandem_inference_exec_count")),
        batches={
            size: (n, compute_by_size.get(size, 0.0)) for size, n in sorted(executions.items())
        },
        last_inference_ms=int(last),
    )
