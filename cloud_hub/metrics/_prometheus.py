"""Prometheus metrics of one hub, named after Triton's so that its dashboards carry over.

Every ``Hub`` owns a ``HubMetrics`` with a ``CollectorRegistry`` of its own
(never prometheus_client's global one), so tests and several hubs in one
process never collide; ``render()`` is what ``GET /metrics`` serves.

The metrics, each with its Triton counterpart (Triton's names lack the
``_total`` suffix; durations are in microseconds in both)::

    tandem_inference_request_success_total{model,version,transport}
        requests answered with outputs, one per request whatever its rows.
        Triton: nv_inference_request_success.
    tandem_inference_request_failure_total{model,version,transport,reason}
        requests answered with an error; ``reason`` is the wire ErrorCode
        (invalid_input, unknown_model, overloaded, deadline_exceeded, …).
        Triton: nv_inference_request_failure (its reason label: REJECTED, …).
    tandem_inference_count_total{model,version}
        rows computed (a request of n rows counts n, a failed batch too).
        Triton: nv_inference_count.
    tandem_inference_exec_count_total{model,version}
        batches executed; inference_count / exec_count is the mean batch size.
        Triton: nv_inference_exec_count.
    tandem_inference_request_duration_us{model,version,transport}   histogram
        end to end in the hub, for answered requests: from the transport
        receiving the request to its reply being ready to send (decoding,
        queueing, compute and encoding). Triton: nv_inference_request_duration_us
        (a counter: our ``_sum``) and nv_inference_request_summary_us.
    tandem_inference_queue_duration_us{model,version}                histogram
        from ``Hub.submit`` to the start of the request's batch compute.
        Triton: nv_inference_queue_duration_us / nv_inference_queue_summary_us.
    tandem_inference_compute_infer_duration_us{model,version}        histogram
        the compute of the request's batch; as in Triton, every request of a
        batch observes the whole batch. Triton: nv_inference_compute_infer_duration_us.
    tandem_batch_size{model,version}                                 histogram
        rows per executed batch, buckets 1, 2, 4, … up to the model's
        max_batch_size. Triton: no metric; its statistics extension's batch_stats.
        Per batch size (rows -> batches, compute) the batchers' ``BatcherStats``
        keep it exactly; the process plane's executors count
        ``tandem_batch_executions`` / ``tandem_batch_compute_us`` labelled by
        the batch's rows in their books (read by the statistics API, not
        served on /metrics).
    tandem_queue_depth{model,version}                                gauge
        requests waiting in the model's queue at scrape time.
        Triton: nv_inference_pending_request_count.
    tandem_overload_rejections_total{model,version}
        requests refused at once because the queue was full (or the hub was
        stopping): the devices fell back to their local answer.
        Triton: nv_inference_request_failure{reason="REJECTED"}.
    tandem_executor_info{model,version,platform,device}              info (= 1)
        which runtime computes a model and on what: ``device`` is the
        executor's own word (CPUExecutionProvider, CUDAExecutionProvider,
        cuda:0, cpu). Triton: the ``nv_gpu_*`` labels, roughly.

Where the numbers come from: success, failure and request duration are
recorded by the transports (``record``: the HTTP and gRPC APIs and the MQTT worker,
labelled ``transport="http"`` / ``"grpc"`` / ``"mqtt"``), so requests submitted in process
through ``Hub.submit`` are not among them. Queue and compute durations are
observed on every computed request (``observe_computed``, a done-callback
``Hub.submit`` adds). The batch-level ones (counts, batch size, queue depth,
rejections, executor) are read from the batchers' own ``BatcherStats`` at
scrape time, so nothing is counted twice; they start over when a model is
replaced, under the new version's labels.

Label values are only ever names of served models and versions: a request
for a model or version that is not served is counted under the named
placeholder ``UNSERVED`` (``model="_unserved"`` / ``version="_unserved"``),
so a client cannot create series by inventing names, and no label is empty.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from shared import ErrorCode

from ._counts import ModelCounts
from ._recorder import count_of

if TYPE_CHECKING:
    from .._results import HubResult
    from ..batching._batcher import DynamicBatcher

__all__ = [
    "DURATION_BUCKETS_US",
    "HELP",
    "HubMetrics",
    "batch_size_buckets",
]

# From 0.1 ms to 10 s: edge offload deadlines are tens to hundreds of milliseconds.
DURATION_BUCKETS_US: tuple[float, ...] = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000,
    100_000, 250_000, 500_000, 1_000_000, 2_500_000, 10_000_000,
)  # fmt: skip
_MODEL = ("model", "version")
# One help text per metric, for the in-process registry and the multi-process one alike.
HELP = {
    "tandem_inference_request_success": "Requests answered with outputs "
    "(Triton: nv_inference_request_success).",
    "tandem_inference_request_failure": "Requests answered with an error; reason is the wire "
    "error code (Triton: nv_inference_request_failure).",
    "tandem_inference_request_duration_us": "From receipt to reply ready, answered requests, "
    "microseconds (Triton: nv_inference_request_duration_us).",
    "tandem_inference_queue_duration_us": "Time in the batcher's queue, microseconds "
    "(Triton: nv_inference_queue_duration_us).",
    "tandem_inference_compute_infer_duration_us": "Compute of the request's batch, "
    "microseconds (Triton: nv_inference_compute_infer_duration_us).",
    "tandem_inference_count": "Rows computed; a request of n rows counts n "
    "(Triton: nv_inference_count).",
    "tandem_inference_exec_count": "Batches executed; inference_count / exec_count is the mean "
    "batch size (Triton: nv_inference_exec_count).",
    "tandem_batch_size": "Rows per executed batch (Triton: statistics extension, batch_stats).",
    "tandem_queue_depth": "Requests waiting in the model's queue "
    "(Triton: nv_inference_pending_request_count).",
    "tandem_overload_rejections": "Requests refused because the queue was full or the hub "
    'stopping (Triton: nv_inference_request_failure{reason="REJECTED"}).',
    "tandem_executor": "The runtime and device computing a model (CPU or CUDA).",
    "tandem_hub_process_restarts": "Hub processes (ingress, executor, llm) restarted after they "
    "died, by role.",
    "tandem_hub_mqtt_ingress_subscribed": "MQTT ingress processes subscribed to the request "
    "topics now (fewer than --workers: some cannot reach the broker or were refused).",
    "tandem_hub_mqtt_ingress_language_connected": "MQTT ingress processes connected to the "
    "language model's executor now (fewer than --workers: /v2/health/ready answers 503).",
    "tandem_hub_mqtt_text_turns": "Text-generation turns the living MQTT ingress processes "
    "took (each process's count since it started).",
    "tandem_hub_version_swaps": "New model versions swapped in without a restart, by model.",
    "tandem_hub_version_load_failures": "New model versions that failed to load (the previous "
    "one kept serving), by model.",
}


def batch_size_buckets(max_batch_size: int) -> list[int]:
    """Upper bounds 1, 2, 4, … and ``max_batch_size`` itself (1 for a model without batching)."""
    top = max(1, max_batch_size)
    bounds = []
    bound = 1
    while bound < top:
        bounds.append(bound)
        bound *= 2
    bounds.append(top)
    return bounds


class HubMetrics:
    """A hub's Prometheus registry: live instruments plus a collector over its batchers.

    ``batchers`` returns the batchers serving now (``Hub.batchers``); it is
    called at scrape time and when resolving labels, from any thread.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, batchers: Callable[[], Iterable[DynamicBatcher]]) -> None:
        self._batchers = batchers
        self.registry = CollectorRegistry()
        transport = (*_MODEL, "transport")
        self._success = Counter(
            "tandem_inference_request_success",
            HELP["tandem_inference_request_success"],
            transport,
            registry=self.registry,
        )
        self._failure = Counter(
            "tandem_inference_request_failure",
            HELP["tandem_inference_request_failure"],
            (*transport, "reason"),
            registry=self.registry,
        )
        self._request_us = Histogram(
            "tandem_inference_request_duration_us",
            HELP["tandem_inference_request_duration_us"],
            transport,
            buckets=DURATION_BUCKETS_US,
            registry=self.registry,
        )
        self._queue_us = Histogram(
            "tandem_inference_queue_duration_us",
            HELP["tandem_inference_queue_duration_us"],
            _MODEL,
            buckets=DURATION_BUCKETS_US,
            registry=self.registry,
        )
        self._compute_us = Histogram(
            "tandem_inference_compute_infer_duration_us",
            HELP["tandem_inference_compute_infer_duration_us"],
            _MODEL,
            buckets=DURATION_BUCKETS_US,
            registry=self.registry,
        )
        self.registry.register(_BatcherCollector(batchers))
        # Labelled children, looked up once per label set: ``labels()`` validates and
        # locks on every call, which costs more than the ``inc``/``observe`` after it.
        # Bounded like the series themselves: labels are only ever served names.
        self._answered: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._computed: dict[tuple[str, str], tuple[Any, Any]] = {}

    # -- recording ------------------------------------------------------------------------

    def record(
        self,
        transport: str,
        model: str,
        version: str | None,
        *,
        received: float,
        error: ErrorCode = ErrorCode.OK,
        result: HubResult | None = None,
    ) -> None:
        """Count one answered request. ``received``: ``time.monotonic()`` at receipt.

        ``error`` is the code its reply carries (``OK``: answered with
        ``result``'s outputs). Thread-safe; called by the transports.
        """
        counted = count_of(
            transport, model, version, received=received, error=error, result=result,
            served=self._served,
        )  # fmt: skip
        if counted.duration_us is None:
            self._failure.labels(*counted.labels).inc()
            return
        children = self._answered.get(counted.labels)
        if children is None:
            labels = counted.labels
            children = self._answered.setdefault(
                labels, (self._success.labels(*labels), self._request_us.labels(*labels))
            )
        children[0].inc()
        children[1].observe(counted.duration_us)

    def observe_computed(self, future: concurrent.futures.Future[HubResult]) -> None:
        """Done-callback for a request's future: its queue and compute time, if computed."""
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        labels = (result.model, result.model_version)
        children = self._computed.get(labels)
        if children is None:
            children = self._computed.setdefault(
                labels, (self._queue_us.labels(*labels), self._compute_us.labels(*labels))
            )
        children[0].observe(1000.0 * result.queue_ms)
        children[1].observe(1000.0 * result.compute_ms)

    # -- reading --------------------------------------------------------------------------

    def model_counts(self, model: str, version: str) -> ModelCounts:
        """What is counted of ``model@version`` (``_counts``; the statistics API reads it)."""

        def total(metric: Any, suffix: str) -> float:
            return sum(
                s.value
                for family in metric.collect()
                for s in family.samples
                if s.name.endswith(suffix)
                and s.labels.get("model") == model
                and s.labels.get("version") == version
            )

        batcher = next(
            (b for b in self._batchers() if b.model == model and b.version == version), None
        )
        stats = batcher.metrics.snapshot() if batcher is not None else None
        return ModelCounts(
            model,
            version,
            success=int(total(self._success, "_total")),
            success_us=total(self._request_us, "_sum"),
            failure=int(total(self._failure, "_total")),
            queue=int(total(self._queue_us, "_count")),
            queue_us=total(self._queue_us, "_sum"),
            compute=int(total(self._compute_us, "_count")),
            compute_us=total(self._compute_us, "_sum"),
            inference_count=0 if stats is None else stats.rows,
            execution_count=0 if stats is None else stats.batches,
            batches={}
            if stats is None
            else {
                rows: (n, 1000.0 * stats.batch_compute_ms.get(rows, 0.0))
                for rows, n in stats.batch_rows.items()
            },
            last_inference_ms=0 if stats is None else int(1000 * stats.last_batch_at),
        )

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format (``content_type``)."""
        return _generate_latest(self.registry)

    def _served(self) -> dict[str, str]:
        return {b.model: b.version for b in self._batchers()}


class _BatcherCollector:
    """Reads each batcher's ``BatcherStats`` at scrape time (see the module docstring)."""

    def __init__(self, batchers: Callable[[], Iterable[DynamicBatcher]]) -> None:
        self._batchers = batchers

    def describe(self) -> list[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for batcher in list(self._batchers()):
            stats = batcher.metrics.snapshot()
            labels = [batcher.model, batcher.version]
            families["count"].add_metric(labels, stats.rows)
            families["exec"].add_metric(labels, stats.batches)
            families["rejected"].add_metric(labels, stats.rejected_overloaded)
            families["depth"].add_metric(labels, batcher.queue_depth)
            families["batch"].add_metric(
                labels,
                _cumulative(stats.batch_rows, batch_size_buckets(batcher.max_batch_size)),
                sum_value=stats.rows,
            )
            families["executor"].add_metric(
                labels,
                {"platform": batcher.executor.platform, "device": _device(batcher)},
            )
        yield from families.values()

    @staticmethod
    def _families() -> dict[str, Any]:
        kinds = {
            "count": (CounterMetricFamily, "tandem_inference_count"),
            "exec": (CounterMetricFamily, "tandem_inference_exec_count"),
            "batch": (HistogramMetricFamily, "tandem_batch_size"),
            "depth": (GaugeMetricFamily, "tandem_queue_depth"),
            "rejected": (CounterMetricFamily, "tandem_overload_rejections"),
            "executor": (InfoMetricFamily, "tandem_executor"),
        }
        return {
            key: kind(name, HELP[name], labels=list(_MODEL)) for key, (kind, name) in kinds.items()
        }


def _cumulative(batches_by_rows: Mapping[int, int], bounds: list[int]) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    for bound in bounds:
        batches = sum(n for rows, n in batches_by_rows.items() if rows <= bound)
        buckets.append((floatToGoString(bound), float(batches)))
    buckets.append(("+Inf", float(sum(batches_by_rows.values()))))
    return buckets


def _device(batcher: DynamicBatcher) -> str:
    try:
        return str(batcher.executor.device)
    except Exception:  # a closed session cannot say; the scrape must still succeed
        return "unknown"
