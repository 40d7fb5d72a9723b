"""What the hub's transports (MQTT, HTTP) submit requests to: in process, or to executors.

A transport decodes a request and calls ``backend.submit(model, version,
inputs, deadline=, arrival=, done=)``; ``done`` is later called exactly once
with an ``HubResult`` or the exception to answer with. A request refused
at once (unknown model, invalid inputs, overloaded) raises from ``submit``
instead. Two backends:

- ``LocalBackend``: a ``Hub`` in this process (its dynamic batchers, on
  threads): the library and tests embed this one;
- ``PoolBackend``: the executor processes of ``tandem hub``, reached through
  shared-memory rings (``_executor_pool``): what the hub's ingress
  processes use, so that many of them feed one batching queue per model.

``describe`` gives a model's served description (``ModelInfo``) for metadata
routes and readiness, the same way for both.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np

from shared import ErrorCode

from ._batcher import HubResult
from ._errors import ExecutorReplyError, HubError, HubStoppingError
from ._link import ModelInfo
from ._records import ReplyRecord

if TYPE_CHECKING:
    from ._executor_pool import ExecutorPool
    from ._server import Hub

__all__ = ["Backend", "Done", "ExecutorReplyError", "LocalBackend", "Outcome", "PoolBackend"]

Outcome = HubResult | BaseException
Done = Callable[[Outcome], None]


class Backend(Protocol):
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


class LocalBackend:
    """A ``Hub`` in this process."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

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
        future = self.hub.submit(model, inputs, version=version, deadline=deadline)
        future.add_done_callback(lambda f: done(_outcome(f)))

    def describe(self, model: str, version: str | None = None) -> ModelInfo:
        from ._executor_loop import model_info  # the executor's own description, in process

        if not self.hub.running:
            raise HubStoppingError("the hub is not serving; try again shortly")
        return model_info(self.hub.repository.get(model, version))

    def model_names(self) -> list[str]:
        return sorted(m.name for m in self.hub.repository)

    def ready(self) -> bool:
        return self.hub.running and all(self.model_ready(m.name) for m in self.hub.repository)

    def model_ready(self, model: str, version: str | None = None) -> bool:
        return self.hub.running and any(
            b.model == model and (version is None or b.version == version) and b.running
            for b in self.hub.batchers()
        )


def _outcome(future: concurrent.futures.Future[HubResult]) -> Outcome:
    try:
        return future.result(timeout=0)
    except concurrent.futures.CancelledError:
        return HubStoppingError("the request was cancelled before compute")
    except BaseException as e:
        return e


class PoolBackend:
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
