"""The metrics of example collection: what was kept, what was not and why, shards in the store.

::

    tandem_examples_collected_total{model,reason}   rows kept: reason disagree | sample
    tandem_examples_skipped_total{model,reason}     rows (a request: bad_answer, mismatch)
        not kept that the rules would have kept: device_cap (the device has its share),
        backlog (the store is behind), store_error (a shard failed to write), bad_answer
        (the device's answer summary did not parse), mismatch (no one class per row)
    tandem_example_shards_written_total{model}
    tandem_example_shards_deleted_total{model,reason}  reason retention | budget

Counted by ``ExampleCollector`` into a ``MetricsBook`` (``inc``); an ingress
process's book is merged with the hub's others (``PlaneCollector`` knows
these families), an in-process ``Hub`` serves its own through
``CollectionCollector``. Label values are served model names and the fixed
reasons above, never a request's words.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from ..metrics._book import MetricsBook

__all__ = ["COLLECTION_FAMILIES", "COLLECTION_HELP", "CollectionCollector"]

COLLECTION_FAMILIES: dict[str, tuple[str, list[str]]] = {
    "tandem_examples_collected": ("counter", ["model", "reason"]),
    "tandem_examples_skipped": ("counter", ["model", "reason"]),
    "tandem_example_shards_written": ("counter", ["model"]),
    "tandem_example_shards_deleted": ("counter", ["model", "reason"]),
}
COLLECTION_HELP = {
    "tandem_examples_collected": "Offloaded rows kept as training examples, by reason "
    "(disagree: edge and cloud differ; sample: drawn at random).",
    "tandem_examples_skipped": "Rows the collection rules would keep but did not, by reason "
    "(device_cap, backlog, store_error, bad_answer, mismatch).",
    "tandem_example_shards_written": "Shards of collected examples written to the store.",
    "tandem_example_shards_deleted": "Shards of collected examples deleted, by reason "
    "(retention, budget).",
}


class CollectionCollector:
    """A Prometheus collector over one book's collection counters (an in-process hub's)."""

    def __init__(self, book: MetricsBook) -> None:
        self.book = book

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        families = {
            name: CounterMetricFamily(name, COLLECTION_HELP[name], labels=labels)
            for name, (_kind, labels) in COLLECTION_FAMILIES.items()
        }
        for name, labels, value in self.book.to_json()["counters"]:  # a snapshot, locked
            if name in families:
                families[name].add_metric(list(labels), value)
        yield from families.values()
