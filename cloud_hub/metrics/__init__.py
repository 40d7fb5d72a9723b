"""The hub's metrics: a process's book, the plane's merged view, Prometheus names.

- ``_recorder``: ``RequestRecorder``, the one ``record`` every transport calls,
  and ``count_of``, the one rule of what a request counts as;
- ``_prometheus``: ``HubMetrics``, the embedded ``Hub``'s registry (Triton's names);
- ``_counts``: ``ModelCounts``, one model version's counts for the statistics API,
  and ``counts_from_books`` over the process plane's books;
- ``_book`` and ``_plane``: the process plane's per-process books
  (``BookRecorder``) and their merged view at scrape (``PlaneCollector``).

Two subsystems keep their own Prometheus collector beside their code, not here:
``collect/_metrics.py`` (examples kept and skipped, shards) and
``language/_metrics.py`` (the language engines' turns and tokens). Each reads
counters only its subsystem keeps and names families only it knows; the
embedded ``Hub`` registers both in its ``HubMetrics`` registry, and
``PlaneCollector`` merges the collection families of every process's book.
"""

from ._counts import ModelCounts, counts_from_books
from ._recorder import UNSERVED, RequestRecorder

__all__ = ["UNSERVED", "ModelCounts", "RequestRecorder", "counts_from_books"]
