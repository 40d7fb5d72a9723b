"""The KServe v2 ``GRPCInferenceService`` over a ``ServedHub``: a ``grpc.aio`` servicer.

Each RPC does what the HTTP route of the same meaning does (``cloud_hub.http``),
through the same dispatcher, limits, readiness and metrics (counted with
``transport="grpc"``); ``_codec`` translates the messages. Errors are one-line
statuses::

    INVALID_ARGUMENT    malformed request, wrong datatype or shape (HTTP 400)
    NOT_FOUND           no such model or version (404)
    RESOURCE_EXHAUSTED  a tensor above the limits, more rows than max_batch_size (413);
                        the API key's rate spent (429); gRPC's own: a message above
                        the server's max_receive_message_length
    UNAVAILABLE         overloaded, stopping, not ready (503)
    DEADLINE_EXCEEDED   the request's timeout (parameter, or the call's deadline) passed (504)
    UNAUTHENTICATED     no, malformed, unknown or revoked API key (401)
    PERMISSION_DENIED   a key without the scope (403)
    INTERNAL            the model failed (500)

API keys (when the hub has them) travel as ``authorization: Bearer <key>``
metadata and are checked by the same ``ApiKeyGuard`` (same scopes, same rate
buckets) as HTTP's: ServerLive, ServerReady and ServerMetadata are open, as
their HTTP routes are; ModelReady and ModelMetadata need ``models:read`` or
``infer``; ModelInfer needs ``infer``; RepositoryIndex (what HTTP's
``/v2/repository/index`` answers) needs ``rollout:admin``. ModelReady answers ``ready: false`` for
a model that is not served, as Triton does (HTTP answers 404). With ``budget``
(the HTTP API's ``ByteBudget``, in a hub's ingress process) an infer request's
message counts against the same bytes-held-at-once limit as HTTP bodies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NoReturn

import grpc
from grpc import aio

from shared import (
    ErrorCode,
    InvalidApiKeyError,
    Limits,
    ProtocolError,
    RateLimitedError,
    ScopeError,
    TensorError,
    TensorSpec,
)
from shared.server import ApiKeyGuard

from .._dispatch import answer_of
from .._errors import ExecutorError, HubError, error_code
from ..http import SERVER_NAME, ServedHub, check_requested_outputs, server_version
from ..http._app import drop_tracebacks
from ..http._bodies import ByteBudget
from ..http._repository import repository_index
from . import inference_pb2 as pb
from . import inference_pb2_grpc as pb_grpc
from ._codec import decode_model_infer, encode_model_infer

__all__ = ["InferenceServicer", "status_of"]

log = logging.getLogger(__name__)

_S = grpc.StatusCode
_STATUS = {
    ErrorCode.BAD_REQUEST: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_INPUT: _S.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_MODEL: _S.NOT_FOUND,
    ErrorCode.TOO_LARGE: _S.RESOURCE_EXHAUSTED,
    ErrorCode.OVERLOADED: _S.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: _S.DEADLINE_EXCEEDED,
    ErrorCode.INTERNAL: _S.INTERNAL,
}
_READ = frozenset({"models:read", "infer"})
_INFER = frozenset({"infer"})
_ADMIN = frozenset({"rollout:admin"})  # as HTTP's repository routes


def status_of(error: Exception) -> tuple[grpc.StatusCode, ErrorCode, str]:
    """The gRPC status, wire code and one-line message for a failed RPC."""
    code = error_code(error)
    if isinstance(error, HubError | ProtocolError):
        message = str(error) or type(error).__name__
    else:
        log.exception("unexpected error serving a gRPC inference request", exc_info=error)
        message = "internal server error"
    return _STATUS.get(code, _S.INTERNAL), code, _one_line(message)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:1000]


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The RPCs over ``hub``; with ``api_keys``, the model RPCs need a key (module docstring)."""

    def __init__(
        self,
        hub: ServedHub,
        *,
        api_keys: ApiKeyGuard | None = None,
        budget: ByteBudget | None = None,
    ) -> None:
        self.hub = hub
        self.dispatcher = hub.dispatcher
        self.limits: Limits = hub.limits
        self.api_keys = api_keys
        self.budget = budget  # request bytes held at once, shared with the HTTP API's

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=not self.hub.not_ready())

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=server_version())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        await self._authorize(context, _READ)
        ready = self.dispatcher.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        await self._authorize(context, _READ)
        try:
            info = self.dispatcher.describe(request.name, request.version or None)
        except Exception as e:
            await _abort(context, e)
        batched = info.max_batch_size > 0

        def tensors(specs: Iterable[TensorSpec]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
            return [
                pb.ModelMetadataResponse.TensorMetadata(
                    name=s.name,
                    datatype=s.datatype,
                    shape=[*([-1] if batched else []), *(_dim(d) for d in s.dims)],  # -1: free
                )
                for s in specs
            ]

        return pb.ModelMetadataResponse(
            name=info.model,
            versions=[info.version],
            platform=info.platform,
            inputs=tensors(info.inputs),
            outputs=tensors(info.outputs),
        )

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: aio.ServicerContext
    ) -> pb.ModelInferResponse:
        received = time.monotonic()
        model, version = request.model_name, request.model_version or None
        await self._authorize(context, _INFER)
        lease = None if self.budget is None else self.budget.lease()
        try:
            if lease is not None:
                lease.hold(request.ByteSize())  # past the budget: UNAVAILABLE, at once
            info = self.dispatcher.describe(model, version)
            decoded = decode_model_infer(request, limits=self.limits)
            del request  # the tensors are decoded: the message can go
            check_requested_outputs(info, decoded)
            deadline = _deadline(received, decoded.timeout_us, context.time_remaining())
            result = await answer_of(
                self.dispatcher, model, version, decoded.inputs, deadline, received
            )
            try:
                response = encode_model_infer(
                    result.outputs,
                    model=result.model,
                    version=result.model_version,
                    request_id=decoded.id,
                    requested=decoded.outputs,
                )
            except TensorError as e:  # the model's outputs, not the request, are at fault
                raise ExecutorError(
                    f"cannot encode {info.model}@{info.version}'s outputs: {e}"
                ) from e
        except Exception as e:  # every failure becomes its status; cancellation passes
            status, code, message = status_of(e)
            drop_tracebacks(e)  # their frames hold the request: free it now, not at the next GC
            self.hub.metrics.record("grpc", model, version, received=received, error=code)
            await context.abort(status, message)
        finally:
            if lease is not None:
                lease.release()  # answered, refused or cancelled: its bytes are free again
        self.hub.metrics.record("grpc", model, version, received=received, result=result)
        return response

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        await self._authorize(context, _ADMIN)
        control = self.hub.control
        unloaded = control.unloaded() if control is not None else []
        entries = repository_index(self.dispatcher, ready_only=request.ready, unloaded=unloaded)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries]
        )

    async def _authorize(self, context: aio.ServicerContext, scopes: frozenset[str]) -> None:
        """Abort the RPC unless its ``authorization`` metadata holds a key with a ``scope``."""
        if self.api_keys is None:
            return
        header = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
        if header is None:
            await context.abort(_S.UNAUTHENTICATED, "missing authorization: Bearer <API key>")
        assert header is not None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            await context.abort(
                _S.UNAUTHENTICATED, "malformed authorization metadata: use 'Bearer <API key>'"
            )
        try:
            self.api_keys.check(token, scopes)
        except InvalidApiKeyError as e:
            await context.abort(_S.UNAUTHENTICATED, _one_line(str(e)))
        except ScopeError as e:
            await context.abort(_S.PERMISSION_DENIED, _one_line(str(e)))
        except RateLimitedError as e:
            await context.abort(_S.RESOURCE_EXHAUSTED, _one_line(str(e)))


async def _abort(context: aio.ServicerContext, error: Exception) -> NoReturn:
    status, _code, message = status_of(error)
    await context.abort(status, message)
    raise AssertionError("unreachable: abort raises")


def _dim(dim: int | None) -> int:
    return -1 if dim is None else dim


def _deadline(received: float, timeout_us: int | None, remaining_s: float | None) -> float | None:
    """The earlier of the request's ``timeout`` parameter and the call's own deadline."""
    budgets = [s for s in (None if timeout_us is None else timeout_us / 1e6, remaining_s) if s]
    return received + min(budgets) if budgets else None
