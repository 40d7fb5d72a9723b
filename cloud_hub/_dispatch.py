"""What the hub's transports (MQTT, HTTP) submit requests to: in process, or to executors.

A transport decodes a request and calls ``dispatcher.submit(model, version,
inputs, deadline=, arrival=, done=)``; ``done`` is later called exactly once
with an ``HubResult`` or the exception to answer with. A request refused
at once (unknown model, invalid inputs, overloaded) raises from ``submit``
instead. Two dispatchers:

- ``LocalDispatcher``: a ``Hub`` in this process (its dynamic batchers, on
  threads): the library and tests embed this one;
- ``PoolDispatcher``: the executor processes of ``tandem hub``, reached through
  shared-memory rings (``_executor_pool``): what the hub's ingress
  processes use, so that many of them feed one batching queue per model.

``describe`` gives a model's served description (``ModelInfo``) for metadata
routes and readiness, the same way for both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np

from shared import ErrorCode

from ._errors import ExecutorReplyError, HubError, HubStoppingError
from ._model_info import ModelInfo
from ._results import HubResult
from .plane._records import ReplyRecord

if TYPE_CHECKING:
    from .plane._executor_pool import ExecutorPool

__all__ = [
    "Dispatcher",
    "Done",
    "ExecutorReplyError",
    "Outcome",
    "PoolDispatcher",
    "answer_of",
    "future_outcome",
]

Outcome = HubResult | BaseException
Done = Callable[[Outcome], None]


class Dispatcher(Protocol):
    def submit(
        self,
        model: str,
        version: str | None,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None,
        arrival: float,
        done: Done,
    ) -> None: ...

    def describe(self, model: str, version: str | None = None) -> ModelInfo: ...

    def model_names(self) -> list[str]: ...

    def ready(self) -> bool: ...

    def model_ready(self, model: str, version: str | None = None) -> bool: ...


def future_outcome(future: concurrent.futures.Future[HubResult]) -> Outcome:
    try:
        return future.result(timeout=0)
    except concurrent.futures.CancelledError:
        return HubStoppingError("the request was cancelled before compute")
    except BaseException as e:
        return e


async def answer_of(
    dispatcher: Dispatcher,
    model: str,
    version: str | None,
    inputs: Mapping[str, np.ndarray],
    deadline: float | None,
    arrival: float,
) -> HubResult:
    """Submit to ``dispatcher`` and await its answer, whichever thread gives it (the HTTP
    and gRPC APIs' infer, on their event loop)."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Outcome] = loop.create_future()
    here = threading.get_ident()

    def settle(outcome: Outcome) -> None:
        if not answer.done():  # the client may have gone (the task was cancelled)
            answer.set_result(outcome)

    def done(outcome: Outcome) -> None:
        if threading.get_ident() == here:
            settle(outcome)
        else:
            loop.call_soon_threadsafe(settle, outcome)

    dispatcher.submit(model, version, inputs, deadline=deadline, arrival=arrival, done=done)
    outcome = await answer
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class PoolDispatcher:
    """The executor processes of this hub, through an ``ExecutorPool``."""

    def __init__(self, pool: ExecutorPool) -> None:
        self.pool = pool

    def submit(
        self,
        model: str,
        version: str | None,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None,
        arrival: float,
        done: Done,
    ) -> None:
        def answered(info: ModelInfo, reply: ReplyRecord | HubError) -> None:
            done(_result(info, reply))

        self.pool.submit(model, version, inputs, deadline=deadline, arrival=arrival, done=answered)

    def describe(self, model: str, version: str | None = None) -> ModelInfo:
        return self.pool.info(model, version)

    def model_names(self) -> list[str]:
        return self.pool.model_names

    def ready(self) -> bool:
        return self.pool.ready()

    def model_ready(self, model: str, version: str | None = None) -> bool:
        try:
            self.pool.info(model, version)
        except HubError:
            return False
        return True


def _result(info: ModelInfo, reply: ReplyRecord | HubError) -> Outcome:
    if isinstance(reply, BaseException):
        return reply
    if reply.error is not ErrorCode.OK:
        return ExecutorReplyError(reply.message, reply.error)
    outputs = {info.outputs[index].name: array for index, array in reply.tensors}
    return HubResult(
        outputs=outputs,
        model=info.model,
        model_version=info.version,
        queue_ms=reply.queue_ms,
        compute_ms=reply.compute_ms,
        batch_rows=reply.batch_rows,
        batch_requests=reply.batch_requests,
    )
