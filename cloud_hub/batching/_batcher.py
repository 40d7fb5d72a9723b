"""The dynamic batcher: one bounded queue and one worker thread per served model.

Shape (after Ray Serve's ``batching.py``): a queue, a wake-up signal, one
future per request; arguments are checked eagerly in ``submit`` so a bad
request fails alone and never poisons a batch; the executor must return one
row per input row; an error reaches every future of its batch and the worker
goes on with the next one.

Why threads and not an asyncio loop: the callers are threads (paho's network
thread delivers MQTT requests) and, later, asyncio handlers; the work is a
blocking call into ONNX Runtime or torch, which release the GIL. A
``threading.Condition`` guarding a ``RequestQueue`` is the least machinery
that serves both: ``submit`` takes the lock for an append, from any thread,
and returns a ``ResultFuture`` at once; the worker thread forms batches
(``_queue`` holds the rules, with no clock or lock of its own) and computes
with the lock released, so requests keep queueing during compute. An asyncio
loop would add a loop to own and a thread hop per request for no gain.
``ResultFuture`` is a ``concurrent.futures.Future`` that is also awaitable, so
``.result(timeout)`` works outside a loop and ``await`` inside one.

Future callbacks run on the worker thread (or on the submitting thread if
the future is already done); keep them short, e.g. hand off to a queue.

A request that finds the worker idle and the queue otherwise empty is
computed at once: the ``max_queue_delay_ms`` window only runs while
requests keep company (two or more queued, e.g. those that arrived during
the previous batch's compute), so the default window costs a lone request
nothing.

Deadlines are ``time.monotonic()`` seconds. A request already past its
deadline at ``submit`` is refused there; one that expires while queued gets
``DeadlineExceededError`` when the worker next looks, without compute.
``stop`` refuses new requests, answers queued ones with ``HubStoppingError``
and lets the batch in flight finish.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from shared import TensorSpec

from .._errors import (
    DeadlineExceededError,
    ExecutorError,
    HubError,
    HubStoppingError,
    InvalidRequestError,
    OverloadedError,
)
from .._results import HubResult
from ..executors import Executor
from ._queue import (
    InputChecker,
    PendingRequest,
    RequestQueue,
    Take,
    split_outputs,
    stack_inputs,
)
from ._stats import BatcherMetrics

__all__ = ["DynamicBatcher", "HubResult", "ResultFuture"]

log = logging.getLogger(__name__)


class ResultFuture(concurrent.futures.Future[HubResult]):
    """A ``concurrent.futures.Future`` that can also be awaited in an asyncio loop."""

    def __await__(self) -> Generator[Any, None, HubResult]:
        return asyncio.wrap_future(self).__await__()


class DynamicBatcher:
    """Groups concurrent requests for one model into batches and runs them on its executor."""

    def __init__(
        self,
        executor: Executor,
        *,
        inputs: Sequence[TensorSpec],
        max_batch_size: int = 64,
        max_queue_delay_ms: float = 2.0,
        max_queue_size: int = 1024,
        model: str = "model",
        version: str = "1",
        allow_non_finite: bool = False,
    ) -> None:
        if not inputs:
            raise ValueError("a batcher needs the model's input specs to check requests")
        self.allow_non_finite = allow_non_finite
        self.executor = executor
        self.inputs = tuple(inputs)
        self.model = model
        self.version = version
        self.max_batch_size = max_batch_size
        self.metrics = BatcherMetrics()
        self._check = InputChecker(
            self.inputs,
            max_batch_size=max_batch_size,
            model=model,
            allow_non_finite=allow_non_finite,
        )
        self._queue = RequestQueue(
            max_batch_size=max_batch_size,
            max_queue_delay_s=max_queue_delay_ms / 1000.0,
            max_queue_size=max_queue_size,
        )
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> DynamicBatcher:
        """Start the worker thread. Requests submitted before start wait for it."""
        with self._cond:
            if self._stopping:
                raise HubStoppingError(f"batcher for {self.label} was stopped; make a new one")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name=f"batcher-{self.label}", daemon=True
                )
                self._thread.start()
        return self

    def stop(self, timeout_s: float | None = 10.0) -> None:
        """Refuse new requests, answer queued ones with ``HubStoppingError``, join the worker."""
        with self._cond:
            self._stopping = True
            dropped = self._queue.drain()
            self._cond.notify_all()
        if dropped:
            self.metrics.count("cancelled", len(dropped))
            error = HubStoppingError(f"the hub is stopping; {self.label} will not compute this")
            for request in dropped:
                _fail(request.ticket, error)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("batcher %s: the batch in flight outlived stop()", self.label)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def label(self) -> str:
        return f"{self.model}@{self.version}"

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def __enter__(self) -> DynamicBatcher:
        return self.start()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- submitting -----------------------------------------------------------------------

    def submit(
        self, inputs: Mapping[str, np.ndarray], deadline: float | None = None
    ) -> ResultFuture:
        """Queue one request (``[n, *dims]`` arrays, n >= 1) and return its future.

        ``deadline`` is a ``time.monotonic()`` time after which the answer is
        useless. Raises at once, before queueing: ``InvalidRequestError`` (or
        ``RequestTooLargeError``) for inputs the model cannot take,
        ``DeadlineExceededError`` for a deadline already past,
        ``OverloadedError`` when the queue is full, ``HubStoppingError``
        after ``stop``. Thread-safe.
        """
        try:
            checked, rows, key = self._check(inputs)
        except InvalidRequestError:
            self.metrics.count("rejected_invalid")
            raise
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            self.metrics.count("expired")
            raise DeadlineExceededError(
                f"deadline passed {1000 * (now - deadline):.1f} ms before {self.label} got it"
            )
        future = ResultFuture()
        request = PendingRequest(checked, rows, key, now, deadline, future)
        with self._cond:
            if self._stopping:
                self.metrics.count("rejected_overloaded")
                raise HubStoppingError(f"the hub is stopping; {self.label} takes no requests")
            try:
                self._queue.push(request)
            except OverloadedError as e:
                self.metrics.count("rejected_overloaded")
                raise OverloadedError(f"{self.label}: {e}") from None
            self._cond.notify()
        self.metrics.count("submitted")
        return future

    # -- the worker -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                take = self._next(self._queue)
                if take is None:
                    return
            try:
                self._expire(take.expired)
                if take.batch:
                    self._compute(take.batch)
            except Exception:  # a bug here must not end the worker: every future still waits
                log.exception("batcher %s: unexpected error; continuing", self.label)

    def _next(self, queue: RequestQueue) -> Take | None:
        """Wait (lock held) until there is a batch or expiries to handle; None once stopping."""
        while True:
            if self._stopping:
                return None
            now = time.monotonic()
            take = queue.take(now, idle=True)  # the executor waits for this thread
            if take.batch or take.expired:
                return take
            timeout = None if take.wake_at is None else max(0.0, take.wake_at - now)
            self._cond.wait(timeout)

    def _expire(self, expired: list[PendingRequest]) -> None:
        if not expired:
            return
        self.metrics.count("expired", len(expired))
        now = time.monotonic()
        for request in expired:
            waited = 1000 * (now - request.arrival)
            _fail(
                request.ticket,
                DeadlineExceededError(
                    f"deadline passed after {waited:.1f} ms in {self.label}'s queue"
                ),
            )

    def _compute(self, batch: list[PendingRequest]) -> None:
        live = [r for r in batch if r.ticket.set_running_or_notify_cancel()]
        if len(live) < len(batch):
            self.metrics.count("cancelled", len(batch) - len(live))
        if not live:
            return
        started = time.monotonic()
        rows = sum(r.rows for r in live)
        error: HubError | None = None
        parts: list[dict[str, np.ndarray]] = []
        try:
            stacked = stack_inputs(live)
            if self.max_batch_size:
                parts = split_outputs(self.executor.run_batch(stacked), [r.rows for r in live])
            else:
                parts = [self.executor.run(stacked)]
        except HubError as e:
            error = e
        except Exception as e:  # numpy while stacking, or an executor outside the base class
            error = ExecutorError(f"{self.label}: {e}")
            error.__cause__ = e
        compute_ms = 1000 * (time.monotonic() - started)
        waits = [1000 * (started - r.arrival) for r in live]
        self.metrics.record_batch(
            rows=rows, queue_ms=waits, compute_ms=compute_ms, ok=error is None
        )
        if error is not None:
            log.warning("batcher %s: batch of %d rows failed: %s", self.label, rows, error)
            for request in live:
                request.ticket.set_exception(error)
            return
        for request, part, waited in zip(live, parts, waits, strict=True):
            request.ticket.set_result(
                HubResult(
                    outputs=part,
                    model=self.model,
                    model_version=self.version,
                    queue_ms=waited,
                    compute_ms=compute_ms,
                    batch_rows=rows,
                    batch_requests=len(live),
                )
            )


def _fail(future: concurrent.futures.Future[Any], error: BaseException) -> None:
    if future.set_running_or_notify_cancel():
        future.set_exception(error)
