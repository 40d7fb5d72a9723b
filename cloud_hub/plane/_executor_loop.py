"""An executor process's loop: one model instance, one batching queue, every ingress.

One thread does everything, in this order, round after round: accept new
ingress connections; read every announced request out of the rings into the
``RequestQueue`` (``_queue``: batch formation, expiry, bounded size); form
a batch and compute it; write each request's reply into the ring of the
ingress that sent it; tell each ingress how far its rings moved. With no
threads there are no hand-offs and no locks on the way of a request; while
a batch computes, the next requests wait in the rings and join the queue as
soon as it ends (they are read before the next batch is formed, so batches
fill up under load rather than leaving one by one).

Every request gets exactly one reply, to its own key, from its own ingress's
connection: outputs (rows in its own order), or ``deadline_exceeded`` (its
deadline passed in the queue), ``overloaded`` (the queue is full, or the
executor is stopping), ``internal`` (the model failed on its batch). A
request whose ingress has gone (its connection closed) is dropped from the queue:
nobody is left to answer, and that ingress's devices time out and fall back.

``retire`` (SIGUSR1 in an executor process: a newer version took over) stops
taking new connections and ends the loop once every ingress has let go of this
one (after its last replies) and nothing is queued, or after
``RETIRE_TIMEOUT_S`` at the latest, answering what is left ``overloaded``.

Metrics go into a ``MetricsBook`` (``_book``) under the Triton-like
names of ``_prometheus``: rows and batches executed, batch sizes, queue and
compute durations, rejections, queue depth, and the executor's device.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import time
from collections.abc import Callable

import numpy as np

from shared import ErrorCode

from .._errors import ExecutorError, HubError
from .._model_info import ModelInfo
from ..batching._queue import PendingRequest, RequestQueue, split_outputs, stack_inputs
from ..metrics._book import MetricsBook
from ..metrics._prometheus import DURATION_BUCKETS_US, batch_size_buckets
from ..repository._repository import ServedModel
from ._ipc import IngressPeer, IpcClosedError, IpcListener
from ._records import RequestRecord

__all__ = ["ExecutorLoop", "model_info"]

log = logging.getLogger(__name__)

_IDLE_WAKE_S = 0.5  # with nothing queued, still look at ``on_tick`` this often
RETIRE_TIMEOUT_S = 60.0  # a retiring executor waits this long for its ingress to let go


def model_info(served: ServedModel, *, instance: int = 0) -> ModelInfo:
    """What an executor of ``served`` tells every ingress in its hello."""
    config = served.config
    return ModelInfo(
        model=served.name,
        version=served.version,
        platform=str(config.platform),
        max_batch_size=config.max_batch_size or 0,
        inputs=tuple(config.inputs or ()),
        outputs=tuple(config.outputs or ()),
        device=_device(served),
        instance=instance,
        pid=os.getpid(),
        extra={
            "max_queue_size": config.max_queue_size,
            "max_queue_delay_ms": config.max_queue_delay_ms,
            "allow_non_finite": config.allow_non_finite,
        },
    )


class ExecutorLoop:
    """Serves ``served`` to every ingress that connects to ``address`` (see module docstring)."""

    def __init__(
        self,
        served: ServedModel,
        *,
        address: str,
        instance: int = 0,
        book: MetricsBook | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        config = served.config
        self.served = served
        self.info = model_info(served, instance=instance)
        self.batched = config.batched
        self._input_names = [s.name for s in self.info.inputs]
        self._output_index = {s.name: i for i, s in enumerate(self.info.outputs)}
        self.queue = RequestQueue(
            max_batch_size=config.max_batch_size or 0,
            max_queue_delay_s=config.max_queue_delay_ms / 1000.0,
            max_queue_size=config.max_queue_size,
        )
        self.book = book or MetricsBook("executor")
        self._labels = (served.name, served.version)
        self._batch_bounds = batch_size_buckets(config.max_batch_size or 0)
        self.book.set_info(
            "tandem_executor",
            self._labels,
            {"platform": self.info.platform, "device": self.info.device},
        )
        self._on_tick = on_tick
        self._selector = selectors.DefaultSelector()
        self.server = IpcListener(address, self.info)
        self._selector.register(self.server, selectors.EVENT_READ)
        self._peers: set[IngressPeer] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._retire_by: float | None = None  # set once retiring: the latest end
        self._wake_at: float | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Make ``run`` answer what is queued ("overloaded") and return. Thread- and signal-safe."""
        self._stopping = True
        with contextlib.suppress(OSError):  # the pipe is full (a wake-up is pending) or closed
            os.write(self._wake_w, b"x")

    def retire(self) -> None:
        """Take no new connections; end once the ingress processes are gone (signal-safe)."""
        if self._retire_by is None:
            self._retire_by = time.monotonic() + RETIRE_TIMEOUT_S
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"r")

    def run(self) -> None:
        """Serve until ``stop``; then close every connection and the listening socket."""
        log.info("executor %s serving on %s", self.info.model, self.info.device)
        try:
            while not self._stopping:
                self._poll(self._timeout())
                self._work()
                self._flush()
                if self._on_tick is not None:
                    self._on_tick()
                if self._retire_by is not None:
                    self._retiring()
        finally:
            self._shutdown()

    # -- one round ------------------------------------------------------------------------

    def _timeout(self) -> float:
        if self._wake_at is None:
            return _IDLE_WAKE_S
        return min(_IDLE_WAKE_S, max(0.0, self._wake_at - time.monotonic()))

    def _poll(self, timeout: float | None) -> None:
        for key, _events in self._selector.select(timeout):
            target = key.fileobj
            if target is self.server:
                self._accept()
            elif target == self._wake_r:
                os.read(self._wake_r, 512)
            else:
                assert isinstance(target, IngressPeer)
                self._read(target)

    def _retiring(self) -> None:
        if self.server.fileno() >= 0:  # no new ingress: they connect to the new version
            self._selector.unregister(self.server)
            self.server.close()
            log.info("executor %s@%s retiring", self.info.model, self.info.version)
        assert self._retire_by is not None
        if (not self._peers and not len(self.queue)) or time.monotonic() > self._retire_by:
            self._stopping = True

    def _accept(self) -> None:
        while (peer := self.server.accept()) is not None:
            self._peers.add(peer)
            self._selector.register(peer, selectors.EVENT_READ)
            log.info("ingress %s connected", peer.ingress_id)

    def _read(self, peer: IngressPeer) -> None:
        try:
            for record in peer.requests():
                self._admit(peer, record)
        except (IpcClosedError, ValueError) as e:  # ValueError: a corrupt ring record
            self._drop(peer, str(e))

    def _admit(self, peer: IngressPeer, record: RequestRecord) -> None:
        inputs = {self._input_names[i]: a for i, a in record.tensors}
        key = tuple(inputs[name].shape[1:] for name in self._input_names) if self.batched else ()
        now = time.monotonic()
        if record.deadline is not None and record.deadline <= now:
            waited = 1000.0 * (now - record.arrival)
            self._refuse(
                peer,
                record.key,
                ErrorCode.DEADLINE_EXCEEDED,
                f"deadline passed after {waited:.1f} ms",
            )
            return
        request = PendingRequest(
            inputs, record.rows, key, record.arrival, record.deadline, (peer, record.key)
        )
        try:
            self.queue.push(request)
        except HubError as e:  # OverloadedError: the queue is full
            self.book.inc("tandem_overload_rejections", self._labels)
            self._refuse(peer, record.key, ErrorCode.OVERLOADED, f"{self.info.model}: {e}")

    def _refuse(self, peer: IngressPeer, key: int, code: ErrorCode, message: str) -> None:
        peer.reply(key, code, message)

    def _work(self) -> None:
        """Compute batches while the queue has them, reading new arrivals between batches."""
        while True:
            take = self.queue.take(time.monotonic(), idle=True)
            for request in take.expired:
                peer, key = request.ticket
                waited = 1000.0 * (time.monotonic() - request.arrival)
                self._refuse(
                    peer,
                    key,
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"deadline passed after {waited:.1f} ms in {self.info.model}'s queue",
                )
            self._wake_at = take.wake_at
            if not take.batch:
                self.book.set("tandem_queue_depth", self._labels, len(self.queue))
                return
            self._compute(take.batch)
            self._flush()  # replies leave before the next batch is formed
            self._poll(0.0)

    def _compute(self, batch: list[PendingRequest]) -> None:
        started = time.monotonic()
        rows = sum(r.rows for r in batch)
        error: HubError | None = None
        parts: list[dict[str, np.ndarray]] = []
        try:
            stacked = stack_inputs(batch)
            executor = self.served.executor
            if self.batched:
                parts = split_outputs(executor.run_batch(stacked), [r.rows for r in batch])
            else:
                parts = [executor.run(stacked)]
            unknown = set(parts[0]) - set(self._output_index) if parts else set()
            if unknown:
                raise ExecutorError(f"the model returned outputs it does not declare: {unknown}")
        except HubError as e:
            error = e
        except Exception as e:  # numpy while stacking, or an executor outside the base class
            error = ExecutorError(f"{self.info.model}: {e}")
        compute_ms = 1000.0 * (time.monotonic() - started)
        self._record_batch(batch, rows, started, compute_ms)
        if error is not None:
            log.warning("executor %s: batch of %d rows failed: %s", self.info.model, rows, error)
            for request in batch:
                peer, key = request.ticket
                peer.reply(key, error.code, str(error))
            return
        index = self._output_index
        for request, part in zip(batch, parts, strict=True):
            peer, key = request.ticket
            if peer.closed:
                continue
            peer.reply(
                key,
                tensors=[(index[name], array) for name, array in part.items()],
                queue_ms=1000.0 * (started - request.arrival),
                compute_ms=compute_ms,
                batch_rows=rows,
                batch_requests=len(batch),
            )

    def _record_batch(
        self, batch: list[PendingRequest], rows: int, started: float, compute_ms: float
    ) -> None:
        book, labels = self.book, self._labels
        book.inc("tandem_inference_count", labels, rows)
        book.inc("tandem_inference_exec_count", labels)
        book.observe("tandem_batch_size", labels, rows, self._batch_bounds)
        by_size = (*labels, str(rows))  # bounded: 1 … max_batch_size (the statistics API)
        book.inc("tandem_batch_executions", by_size)
        book.inc("tandem_batch_compute_us", by_size, 1000.0 * compute_ms)
        book.set("tandem_last_inference_ms", labels, 1000.0 * time.time())
        book.observe_many(
            "tandem_inference_queue_duration_us",
            labels,
            [1e6 * (started - request.arrival) for request in batch],
            DURATION_BUCKETS_US,
        )
        book.observe(  # as in Triton: every request of a batch observes the batch's compute
            "tandem_inference_compute_infer_duration_us",
            labels,
            1000.0 * compute_ms,
            DURATION_BUCKETS_US,
            n=len(batch),
        )

    def _flush(self) -> None:
        for peer in list(self._peers):
            peer.flush()
            if peer.closed:
                self._drop(peer, "the connection broke")

    def _drop(self, peer: IngressPeer, why: str) -> None:
        if peer not in self._peers:
            return
        self._peers.discard(peer)
        self._selector.unregister(peer)
        dropped = self.queue.discard(lambda r: r.ticket[0] is peer)
        log.warning(
            "ingress %s left (%s); %d of its queued requests dropped",
            peer.ingress_id,
            why,
            len(dropped),
        )
        peer.close()

    def _shutdown(self) -> None:
        for request in self.queue.drain():
            peer, key = request.ticket
            peer.reply(key, ErrorCode.OVERLOADED, "the hub is stopping; try again later")
        self._flush()
        for peer in list(self._peers):
            self._selector.unregister(peer)
            peer.close()
        self._peers.clear()
        self._selector.close()
        self.server.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)


def _device(served: ServedModel) -> str:
    try:
        return str(served.executor.device)
    except Exception:  # a closed session cannot say
        return "unknown"
