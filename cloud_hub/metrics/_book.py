"""Counters, gauges and histograms that a hub process keeps, and how processes share them.

A ``MetricsBook`` is plain Python (dicts of floats; an increment costs a dict
lookup), because the hot paths of the ingress and executor processes record
into it for every request. Each process of a hub dumps its book as JSON into
the hub's metrics directory (``dump``: write a temporary file, then rename, so
a reader never sees half a file), periodically and when it stops; the process
that serves ``/metrics`` merges every file (``merge_books``):

- counters and histograms are summed over every file, those of processes
  that have exited included (a restarted process starts a new file, so
  totals never go down);
- gauges are summed over the files of processes still running (a dead
  process's queue is not waiting any more).

Series are keyed by metric name and a tuple of label values; every label
value comes from the hub's own names (served models and versions, transports,
wire error codes), never from a request, so a client cannot create series.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import atomic_write_bytes

__all__ = ["BookDumper", "Histogram", "MetricsBook", "merge_books", "read_books"]

log = logging.getLogger(__name__)

Labels = tuple[str, ...]


@dataclass
class Histogram:
    """Cumulative-on-read histogram: ``counts[i]`` observations in bucket i (last: +Inf)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def merge(self, other: Histogram) -> None:
        if other.bounds != self.bounds:
            raise ValueError("cannot merge histograms with different buckets")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total


class MetricsBook:
    """One process's metrics. Thread-safe: every change and ``to_json`` take one lock."""

    def __init__(self, role: str = "hub", pid: int | None = None, started: int = 0) -> None:
        self.role = role
        self.pid = os.getpid() if pid is None else pid
        self.started = started or _start_ticks(self.pid)  # tells a reused pid apart
        self.counters: dict[tuple[str, Labels], float] = {}
        self.gauges: dict[tuple[str, Labels], float] = {}
        self.histograms: dict[tuple[str, Labels], Histogram] = {}
        self.info: dict[tuple[str, Labels], dict[str, str]] = {}
        self._lock = threading.Lock()

    def inc(self, name: str, labels: Labels, value: float = 1.0) -> None:
        key = (name, labels)
        with self._lock:
            self.counters[key] = self.counters.get(key, 0.0) + value

    def set(self, name: str, labels: Labels, value: float) -> None:
        with self._lock:
            self.gauges[(name, labels)] = value

    def observe(
        self, name: str, labels: Labels, value: float, bounds: Sequence[float], n: int = 1
    ) -> None:
        """``n`` observations of ``value`` (a batch's compute counts once per request)."""
        key = (name, labels)
        with self._lock:
            histogram = self.histograms.get(key)
            if histogram is None:
                histogram = self.histograms[key] = Histogram(tuple(bounds))
            histogram.observe(value, n)

    def observe_many(
        self, name: str, labels: Labels, values: Sequence[float], bounds: Sequence[float]
    ) -> None:
        """Every value of ``values``, under one lock."""
        key = (name, labels)
        with self._lock:
            histogram = self.histograms.get(key)
            if histogram is None:
                histogram = self.histograms[key] = Histogram(tuple(bounds))
            for value in values:
                histogram.observe(value)

    def set_info(self, name: str, labels: Labels, values: dict[str, str]) -> None:
        with self._lock:
            self.info[(name, labels)] = dict(values)

    # -- sharing between processes ---------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return self._to_json()

    def _to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "pid": self.pid,
            "started": self.started,
            "counters": [[n, list(lb), v] for (n, lb), v in self.counters.items()],
            "gauges": [[n, list(lb), v] for (n, lb), v in self.gauges.items()],
            "histograms": [
                [n, list(lb), list(h.bounds), h.counts, h.total]
                for (n, lb), h in self.histograms.items()
            ],
            "info": [[n, list(lb), v] for (n, lb), v in self.info.items()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MetricsBook:
        book = cls(str(data["role"]), int(data["pid"]), int(data.get("started", 0)) or -1)
        for n, lb, v in data["counters"]:
            book.counters[(n, tuple(lb))] = float(v)
        for n, lb, v in data["gauges"]:
            book.gauges[(n, tuple(lb))] = float(v)
        for n, lb, bounds, counts, total in data["histograms"]:
            book.histograms[(n, tuple(lb))] = Histogram(
                tuple(bounds), [int(c) for c in counts], float(total)
            )
        for n, lb, v in data["info"]:
            book.info[(n, tuple(lb))] = {str(k): str(x) for k, x in v.items()}
        return book

    def dump(self, directory: Path) -> None:
        """Write this book to ``directory/<role>-<pid>.json`` atomically."""
        target = directory / f"{self.role}-{self.pid}.json"
        # Not durable: a book lives as long as its process and is rewritten every second.
        atomic_write_bytes(target, json.dumps(self.to_json()).encode(), mode=0o600, durable=False)


class BookDumper:
    """Dumps a book into ``directory`` at most every ``every_s`` (``tick``), and at ``close``."""

    def __init__(self, book: MetricsBook, directory: Path, every_s: float = 1.0) -> None:
        self.book = book
        self.directory = directory
        self.every_s = every_s
        self._next = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every_s
            self.close()

    def close(self) -> None:
        try:
            self.book.dump(self.directory)
        except OSError as e:  # the directory went away (the hub is stopping): nothing to keep
            log.debug("metrics not written: %s", e)


def read_books(directory: Path) -> list[tuple[MetricsBook, bool]]:
    """Every book in ``directory`` and whether its process is still running."""
    books: list[tuple[MetricsBook, bool]] = []
    for path in sorted(directory.glob("*.json")):
        try:
            book = MetricsBook.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # replaced or removed while listing; the next scrape sees it
        books.append((book, _alive(book.pid, book.started)))
    return books


def merge_books(books: Iterable[tuple[MetricsBook, bool]]) -> MetricsBook:
    """One book: counters and histograms of all, gauges and info of the living."""
    merged = MetricsBook("merged", 0, -1)
    for book, alive in books:
        for key, value in book.counters.items():
            merged.counters[key] = merged.counters.get(key, 0.0) + value
        for key, histogram in book.histograms.items():
            mine = merged.histograms.get(key)
            if mine is None:
                merged.histograms[key] = Histogram(
                    histogram.bounds, list(histogram.counts), histogram.total
                )
            elif mine.bounds == histogram.bounds:
                mine.merge(histogram)
        if alive:
            for key, value in book.gauges.items():
                merged.gauges[key] = merged.gauges.get(key, 0.0) + value
            merged.info.update(book.info)
    return merged


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22 of /proc/<pid>/stat


def _alive(pid: int, started: int) -> bool:
    return pid > 0 and started > 0 and _start_ticks(pid) == started
