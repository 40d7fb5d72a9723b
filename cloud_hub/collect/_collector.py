"""Collecting hard examples at the hub: offloaded requests the edge got wrong, and a sample.

An ``ExampleCollector`` lives in each process that takes MQTT requests (an
ingress process of ``tandem hub``, or an in-process ``Hub``). For a model
whose ``config.json`` has a ``collection`` key (``CollectionConfig``):

1. ``admit`` (the MQTT session's thread, as the request is decoded) keeps a
   reference to the request's inputs when its header carries the device's
   answer (``shared.EdgeAnswer``): a device that does not share its answers
   is never collected from;
2. ``answered`` (the thread that sends the reply, once the cloud answered)
   applies the rules (``_rules``: disagreements, the sample, the
   per-device cap, the backlog bound), copies the kept rows (the inputs, or
   only their fingerprints when ``keep_inputs`` is false; the cloud's and the
   edge's answers, score, versions, device, time) into the model's buffer
   and returns: no I/O on a request's path;
3. a writer thread turns a buffer into a shard (``shared.write_shard``) once
   it holds ``shard_rows`` rows or ``flush_s`` after its first row, through
   the model's blob store, then sweeps the model's shards (retention, byte
   budget; ``_collect_rules.shards_to_delete``) and recounts each device's
   rows from the manifests that remain, every writer's, so caps hold across
   the hub's processes and restarts, give or take what other processes hold
   unwritten.

Nothing here can fail a request: a bad answer summary, a store that is down
or a full backlog costs the example (counted), never the reply. Counters go
through ``count(name, labels, n)`` (a ``MetricsBook.inc``): the families are
in ``_metrics``; label values are served model names and fixed reasons.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared import (
    EdgeAnswer,
    ExampleRows,
    ExampleShardError,
    FrameError,
    Message,
    StoreError,
    input_digests,
    top_classes,
)
from shared.server import ShardManifest, read_manifest, shard_prefix, write_shard
from shared.server.store import BlobStore, open_store

from .._results import HubResult
from ..repository._config import ModelConfig
from ._config import CollectionConfig
from ._rules import DeviceQuota, row_reasons, shards_to_delete

__all__ = ["CountFn", "ExampleCollector", "Pending"]

log = logging.getLogger(__name__)

CountFn = Callable[[str, tuple[str, ...], float], None]
_TICK_S = 0.5  # how often the writer looks for buffers due by time
_STOP = object()


@dataclass(frozen=True, slots=True)
class Pending:
    """A request that may become examples once the cloud answered it."""

    model: str
    device: str
    received: float  # Unix seconds
    answer: EdgeAnswer
    inputs: Mapping[str, np.ndarray]


@dataclass
class _Model:
    """One collecting model: its settings, store, buffer and quota (guarded by the lock)."""

    name: str
    config: CollectionConfig
    store: BlobStore
    quota: DeviceQuota
    chunks: list[ExampleRows] = field(default_factory=list)
    buffered: int = 0  # rows in ``chunks``
    queued: int = 0  # rows handed to the writer, not written yet
    first_at: float = 0.0  # monotonic time of the buffer's first row
    seq: int = 0
    manifests: dict[str, ShardManifest] = field(default_factory=dict)  # read once, by key


class ExampleCollector:
    """See the module docstring. ``start`` before use, ``close`` to write what is left."""

    def __init__(
        self,
        models: Mapping[str, CollectionConfig],
        *,
        writer: str,
        count: CountFn | None = None,
        stores: Mapping[str, BlobStore] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.writer = writer
        self._count: CountFn = count or (lambda name, labels, n: None)
        self._rng = rng or random.Random()
        self._models = {
            name: _Model(
                name,
                config,
                (stores or {}).get(name) or open_store(config.store),
                DeviceQuota(config.max_per_device),
            )
            for name, config in models.items()
        }
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_models(
        cls, configs: Mapping[str, ModelConfig], *, writer: str, count: CountFn | None = None
    ) -> ExampleCollector | None:
        """A collector for the models whose config has ``collection`` (None: no model does)."""
        chosen = {
            name: config.collection
            for name, config in configs.items()
            if config.collection is not None
        }
        if not chosen:
            return None
        return cls(chosen, writer=writer, count=count)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> ExampleCollector:
        for model in self._models.values():
            self._sweep(model)  # counts what devices already have in the set
        self._thread = threading.Thread(target=self._run, name="example-writer", daemon=True)
        self._thread.start()
        return self

    def flush(self, timeout_s: float = 30.0) -> None:
        """Write every buffered row now and wait until it is stored (or dropped)."""
        with self._lock:
            for model in self._models.values():
                self._hand_off(model)
        done = threading.Event()
        self._jobs.put(done)
        if not done.wait(timeout_s):
            log.warning("examples not written within %.0f s", timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is buffered, then stop the writer. Safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self.flush(timeout_s)
        self._jobs.put(_STOP)
        thread.join(timeout_s)

    # -- requests (hot paths: no I/O) -----------------------------------------------------

    def admit(self, request: Message, inputs: Mapping[str, np.ndarray]) -> Pending | None:
        """A candidate when the model collects and the device shared its answer; else None."""
        model = self._models.get(request.model)
        if model is None:
            return None
        try:
            answer = EdgeAnswer.from_header(request.extra)
        except FrameError as e:
            self._skipped(request.model, "bad_answer", 1)
            log.debug("request %s: edge answer not usable: %s", request.request_id, e)
            return None
        if answer is None:
            return None
        return Pending(request.model, request.device_id or "unknown", time.time(), answer, inputs)

    def answered(self, pending: Pending, result: HubResult) -> None:
        """Keep the rows the rules keep; never raises (it runs on the replying thread)."""
        try:
            self._answered(pending, result)
        except Exception:
            log.exception("collecting request of %s failed", pending.device)

    def _answered(self, pending: Pending, result: HubResult) -> None:
        model = self._models[pending.model]
        config = model.config
        first = next(iter(result.outputs.values()), None)
        rows = len(next(iter(pending.inputs.values()), ()))
        cloud = top_classes(first) if first is not None else np.zeros(0, np.int64)
        if len(cloud) != rows:
            self._skipped(model.name, "mismatch", 1)  # not one class per row: nothing to compare
            return
        reasons, skip = row_reasons(
            pending.answer, cloud, sample_rate=config.sample_rate, draw=self._rng.random
        )
        if skip is not None:
            self._skipped(model.name, skip, 1)
            return
        wanted = [i for i, reason in enumerate(reasons) if reason is not None]
        if not wanted:
            return
        with self._lock:
            room = model.quota.room(pending.device)
            backlog = config.max_pending_rows - model.buffered - model.queued
            kept = wanted[: max(0, min(room, backlog))]
            if kept:
                model.quota.wait(pending.device, len(kept))
                self._buffer(model, _rows(pending, result, cloud, reasons, kept, config))
        if len(kept) < len(wanted):
            why = "device_cap" if room < len(wanted) else "backlog"
            self._skipped(model.name, why, len(wanted) - len(kept))
        for reason, n in Counter(reasons[i] for i in kept).items():
            assert reason is not None
            self._count("tandem_examples_collected", (model.name, reason), n)

    def _buffer(self, model: _Model, rows: ExampleRows) -> None:
        """Add rows to the model's buffer (under the lock); a full buffer goes to the writer."""
        if model.chunks and _signature(model.chunks[0]) != _signature(rows):
            self._hand_off(model)  # new shapes: a shard holds one kind of row
        if not model.chunks:
            model.first_at = time.monotonic()
        model.chunks.append(rows)
        model.buffered += len(rows)
        if model.buffered >= model.config.shard_rows:
            self._hand_off(model)

    def _hand_off(self, model: _Model) -> None:
        if not model.chunks:
            return
        chunks, model.chunks = model.chunks, []
        model.queued += model.buffered
        model.buffered = 0
        self._jobs.put((model, chunks))

    def _skipped(self, model: str, reason: str, n: int) -> None:
        self._count("tandem_examples_skipped", (model, reason), n)

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=_TICK_S)
            except queue.Empty:
                job = None
            if job is _STOP:
                return
            if isinstance(job, threading.Event):
                job.set()
            elif job is not None:
                self._write(*job)
            self._hand_off_due()

    def _hand_off_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            for model in self._models.values():
                if model.chunks and now - model.first_at >= model.config.flush_s:
                    self._hand_off(model)

    def _write(self, model: _Model, chunks: list[ExampleRows]) -> None:
        rows = ExampleRows.concat(chunks)
        by_device = Counter(rows.devices)
        try:
            model.seq += 1
            manifest = write_shard(model.store, model.name, rows, writer=self.writer, seq=model.seq)
        except (StoreError, ExampleShardError) as e:
            log.warning("%d examples of %s not stored: %s", len(rows), model.name, e)
            with self._lock:
                model.queued -= len(rows)
                model.quota.dropped(by_device)
            self._skipped(model.name, "store_error", len(rows))
            return
        with self._lock:
            model.queued -= len(rows)
            model.quota.written(by_device)
            model.manifests[manifest.key] = manifest
        self._count("tandem_example_shards_written", (model.name,), 1)
        self._sweep(model)

    def _sweep(self, model: _Model) -> None:
        """Apply retention and the byte budget, then recount what each device has stored."""
        try:
            listed = {o.key: o.size for o in model.store.list_objects(shard_prefix(model.name))}
            present = {k[:-5]: size for k, size in listed.items() if k.endswith(".json")}
            for key, size in present.items():  # other writers' shards: read their manifests once
                if key not in model.manifests:
                    model.manifests[key] = read_manifest(model.store, key + ".json", size)
            manifests = [m for k, m in model.manifests.items() if k in present]
            doomed = shards_to_delete(
                manifests,
                now=time.time(),
                max_age_s=model.config.retention_s,
                max_bytes=model.config.max_bytes,
            )
            for manifest, why in doomed:
                model.store.delete_object(manifest.manifest_key)  # uncommit first
                model.store.delete_object(manifest.data_key)
                self._count("tandem_example_shards_deleted", (model.name, why), 1)
            gone = {m.key for m, _ in doomed}
            remaining = [m for m in manifests if m.key not in gone]
        except (StoreError, ExampleShardError) as e:
            log.warning("cannot sweep the examples of %s: %s", model.name, e)
            return
        with self._lock:
            model.manifests = {m.key: m for m in remaining}
            model.quota.recount(remaining)


def _signature(rows: ExampleRows) -> tuple[Any, ...]:
    return tuple(
        (k, v.dtype.str, v.shape[1:])
        for columns in (rows.inputs, rows.outputs)
        for k, v in sorted(columns.items())
    ), rows.inputs_kept


def _rows(
    pending: Pending,
    result: HubResult,
    cloud: np.ndarray,
    reasons: list[str | None],
    kept: list[int],
    config: CollectionConfig,
) -> ExampleRows:
    """Copies of the kept rows (the request's arrays may be views of buffers reused later)."""
    index = np.asarray(kept)
    inputs = {k: np.array(v[index]) for k, v in pending.inputs.items()}
    answer = pending.answer
    edge = (
        np.asarray(answer.labels, dtype=np.int64)[index]
        if answer.labels is not None
        else np.full(len(kept), -1, dtype=np.int64)
    )
    score = np.nan if answer.score is None else answer.score
    n = len(kept)
    return ExampleRows(
        inputs=inputs if config.keep_inputs else {},
        input_sha256=input_digests(inputs),
        outputs={k: np.array(v[index]) for k, v in result.outputs.items()},
        cloud_labels=cloud[index],
        edge_labels=edge,
        edge_scores=np.full(n, score, dtype=np.float32),
        reasons=[str(reasons[i]) for i in kept],
        devices=[pending.device] * n,
        edge_models=[answer.model or ""] * n,
        cloud_versions=[result.model_version] * n,
        times=np.full(n, pending.received, dtype=np.float64),
    )
