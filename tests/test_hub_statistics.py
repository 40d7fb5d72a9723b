"""The statistics API's two pure parts: ``ModelCounts`` -> Triton's JSON
(``cloud_hub.http._statistics``), and the process plane's books -> ``ModelCounts``
(``counts_from_books``), over real books written to and read from a directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cloud_hub.http._statistics import model_stats
from cloud_hub.metrics import ModelCounts, counts_from_books
from cloud_hub.metrics._book import MetricsBook, read_books

STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def test_model_stats_has_tritons_shape_and_nanoseconds() -> None:
    counts = ModelCounts(
        "m", "3", success=5, success_us=12.5, failure=2, queue=5, queue_us=7.25, compute=5,
        compute_us=40.0, inference_count=9, execution_count=3,
        batches={4: (1, 20.0), 1: (2, 30.5)}, last_inference_ms=1_700_000_000_123,
    )  # fmt: skip
    entry = model_stats(counts)
    assert (entry["name"], entry["version"]) == (counts.model, counts.version)
    assert entry["last_inference"] == counts.last_inference_ms
    assert entry["inference_count"] == counts.inference_count
    assert entry["execution_count"] == counts.execution_count
    stats = entry["inference_stats"]
    assert sorted(stats) == sorted(STATS)
    assert stats["success"] == {"count": counts.success, "ns": round(1000 * counts.success_us)}
    assert stats["fail"] == {"count": counts.failure, "ns": 0}
    assert stats["queue"] == {"count": counts.queue, "ns": round(1000 * counts.queue_us)}
    assert stats["compute_infer"] == {
        "count": counts.compute,
        "ns": round(1000 * counts.compute_us),
    }
    assert stats["compute_input"] == stats["compute_output"] == {"count": counts.compute, "ns": 0}
    sizes = [b["batch_size"] for b in entry["batch_stats"]]
    assert sizes == sorted(counts.batches)
    for batch in entry["batch_stats"]:
        n, us = counts.batches[batch["batch_size"]]
        assert batch["compute_infer"] == {"count": n, "ns": round(1000 * us)}
        assert batch["compute_input"] == batch["compute_output"] == {"count": n, "ns": 0}


def test_an_untouched_model_is_all_zeros() -> None:
    entry = model_stats(ModelCounts("m", "1"))
    assert entry["batch_stats"] == [] and entry["execution_count"] == 0
    assert all(s == {"count": 0, "ns": 0} for s in entry["inference_stats"].values())


def _executor_batch(book: MetricsBook, model: str, version: str, rows: int, us: float) -> None:
    """What ``_executor_loop`` records for one batch of one request."""
    labels = (model, version)
    book.inc("tandem_inference_count", labels, rows)
    book.inc("tandem_inference_exec_count", labels)
    book.inc("tandem_batch_executions", (*labels, str(rows)))
    book.inc("tandem_batch_compute_us", (*labels, str(rows)), us)
    book.observe("tandem_inference_queue_duration_us", labels, us / 2, [100.0])
    book.observe("tandem_inference_compute_infer_duration_us", labels, us, [100.0])


def test_counts_from_books_sum_every_process_living_or_dead(tmp_path: Path) -> None:
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    dead = MetricsBook("executor-0", int(dead_pid), started=1)  # exited: its counts stay
    living = MetricsBook("executor-1")
    ingress = MetricsBook("ingress-http-0", os.getpid())
    _executor_batch(dead, "m", "2", 4, 30.0)
    dead.set("tandem_last_inference_ms", ("m", "2"), 2_000.0)
    _executor_batch(living, "m", "2", 4, 10.0)
    _executor_batch(living, "m", "2", 1, 5.0)
    living.set("tandem_last_inference_ms", ("m", "2"), 1_000.0)
    _executor_batch(living, "m", "1", 8, 99.0)  # another version: not counted
    _executor_batch(living, "other", "2", 2, 99.0)  # another model: not counted
    for transport in ("http", "mqtt"):
        ingress.inc("tandem_inference_request_success", ("m", "2", transport), 2)
        ingress.observe("tandem_inference_request_duration_us", ("m", "2", transport), 50, [1.0])
    ingress.inc("tandem_inference_request_failure", ("m", "2", "http", "invalid_input"))
    ingress.inc("tandem_inference_request_success", ("m", "1", "http"), 7)
    for book in (dead, living, ingress):
        book.dump(tmp_path)
    books = read_books(tmp_path)
    assert sorted(alive for _, alive in books) == [False, True, True]

    counts = counts_from_books(books, "m", "2")
    assert (counts.model, counts.version) == ("m", "2")
    assert counts.success == 4 and counts.failure == 1
    assert counts.success_us == 100.0
    assert counts.inference_count == 4 + 4 + 1 and counts.execution_count == 3
    assert counts.batches == {4: (2, 40.0), 1: (1, 5.0)}
    assert counts.queue == counts.compute == 3
    assert counts.compute_us == 45.0 and counts.queue_us == 22.5
    assert counts.last_inference_ms == 2_000  # the latest, a dead process's included
    assert counts_from_books(books, "m", "9") == ModelCounts("m", "9")
