"""The metrics of a multi-process hub: recorded per process, served merged.

Each process records into its own ``MetricsBook`` (``_book``): an
ingress process what its devices were told (``BookRecorder``, the same
``record`` signature as ``HubMetrics.record``), an executor process what it
computed (``_executor_loop``), a language executor its engine's ``stats()``
(``language._metrics.llm_samples``). Every book is dumped into the hub's metrics
directory; ``PlaneCollector`` merges them at scrape time into the Prometheus
families that ``HubMetrics`` serves for an in-process hub, with the same
names, help texts and labels, so dashboards do not care which one runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
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

from .._results import HubResult
from ..collect._metrics import COLLECTION_FAMILIES, COLLECTION_HELP
from ..language._metrics import LLM_FAMILIES
from ._book import Histogram, MetricsBook, merge_books, read_books
from ._counts import ModelCounts, counts_from_books
from ._prometheus import DURATION_BUCKETS_US, HELP
from ._recorder import count_of

__all__ = ["BookRecorder", "PlaneCollector", "PlaneMetrics"]

_MODEL = ["model", "version"]
_TRANSPORT = [*_MODEL, "transport"]
# name -> (kind, labels)
_FAMILIES: dict[str, tuple[str, list[str]]] = {
    "tandem_inference_request_success": ("counter", _TRANSPORT),
    "tandem_inference_request_failure": ("counter", [*_TRANSPORT, "reason"]),
    "tandem_inference_request_duration_us": ("histogram", _TRANSPORT),
    "tandem_inference_queue_duration_us": ("histogram", _MODEL),
    "tandem_inference_compute_infer_duration_us": ("histogram", _MODEL),
    "tandem_inference_count": ("counter", _MODEL),
    "tandem_inference_exec_count": ("counter", _MODEL),
    "tandem_batch_size": ("histogram", _MODEL),
    "tandem_queue_depth": ("gauge", _MODEL),
    "tandem_overload_rejections": ("counter", _MODEL),
    "tandem_executor": ("info", _MODEL),
    "tandem_hub_process_restarts": ("counter", ["role"]),
    "tandem_hub_mqtt_ingress_subscribed": ("gauge", []),
    "tandem_hub_mqtt_text_turns": ("gauge", []),
    "tandem_hub_mqtt_ingress_language_connected": ("gauge", ["model"]),
    "tandem_hub_version_swaps": ("counter", ["model"]),
    "tandem_hub_version_load_failures": ("counter", ["model"]),
    **COLLECTION_FAMILIES,
    # written by the language executors (their engines' stats(), see language._metrics)
    **{name: (kind, ["model", *labels]) for name, (kind, _, labels, _) in LLM_FAMILIES.items()},
}
_LLM_HELP = {name: help_text for name, (_, help_text, _, _) in LLM_FAMILIES.items()}


class BookRecorder:
    """Counts answered requests into a book, as ``HubMetrics.record`` does in process
    (both by ``count_of``).

    ``served`` returns {model: version} of what is served, so that a request
    for anything else is counted under ``UNSERVED`` (``model="_unserved"``).
    """

    def __init__(self, book: MetricsBook, served: Callable[[], dict[str, str]]) -> None:
        self.book = book
        self._served = served

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
        counted = count_of(
            transport, model, version, received=received, error=error, result=result,
            served=self._served,
        )  # fmt: skip
        if counted.duration_us is None:
            self.book.inc("tandem_inference_request_failure", counted.labels)
            return
        self.book.inc("tandem_inference_request_success", counted.labels)
        self.book.observe(
            "tandem_inference_request_duration_us",
            counted.labels,
            counted.duration_us,
            DURATION_BUCKETS_US,
        )


class PlaneCollector:
    """A Prometheus collector over every book in ``directory`` (and ``local`` ones)."""

    def __init__(
        self, directory: Path, local: Callable[[], list[MetricsBook]] | None = None
    ) -> None:
        self.directory = directory
        self._local = local

    def describe(self) -> list[Metric]:
        return []  # families depend on what is served; nothing to check at registration

    def books(self) -> list[tuple[MetricsBook, bool]]:
        """Every process's book and whether it runs; the ``local`` ones not yet on disk."""
        books = read_books(self.directory)
        if self._local is not None:
            on_disk = {(b.role, b.pid) for b, _ in books}
            books += [(b, True) for b in self._local() if (b.role, b.pid) not in on_disk]
        return books

    def collect(self) -> Iterator[Metric]:
        merged = merge_books(self.books())
        families: dict[str, Any] = {
            name: _family(name, kind, labels) for name, (kind, labels) in _FAMILIES.items()
        }
        for (name, labels), value in merged.counters.items():
            if name in families:
                families[name].add_metric(list(labels), value)
        for (name, labels), value in merged.gauges.items():
            if name in families:
                families[name].add_metric(list(labels), value)
        for (name, labels), histogram in merged.histograms.items():
            if name in families:
                families[name].add_metric(
                    list(labels), _buckets(histogram), sum_value=histogram.total
                )
        for (name, labels), values in merged.info.items():
            if name in families:
                families[name].add_metric(list(labels), values)
        yield from families.values()


class PlaneMetrics:
    """``render()`` for the process that serves ``/metrics`` of a multi-process hub."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self, directory: Path, local: Callable[[], list[MetricsBook]] | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        self._collector = PlaneCollector(directory, local)
        self.registry.register(self._collector)

    def model_counts(self, model: str, version: str) -> ModelCounts:
        """What every process counted of ``model@version`` (the statistics API)."""
        return counts_from_books(self._collector.books(), model, version)

    def render(self) -> bytes:
        return _generate_latest(self.registry)


def _family(name: str, kind: str, labels: list[str]) -> Metric:
    help_text = HELP.get(name) or COLLECTION_HELP.get(name) or _LLM_HELP.get(name, name)
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    if kind == "gauge":
        return GaugeMetricFamily(name, help_text, labels=labels)
    if kind == "histogram":
        return HistogramMetricFamily(name, help_text, labels=labels)
    return InfoMetricFamily(name, help_text, labels=labels)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
        running += count
        out.append((floatToGoString(bound), float(running)))
    out.append(("+Inf", float(histogram.count)))
    return out
