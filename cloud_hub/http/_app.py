"""The hub's HTTP API: the Open Inference Protocol v2 (KServe / Triton) and Prometheus metrics.

Routes (``[/versions/{v}]`` is optional; without it the served version answers)::

    GET  /v2                                       server metadata (extensions: binary_tensor_data)
    GET  /v2/health/live                           200 {"live": true} once the process is up
    GET  /v2/health/ready                          200 {"ready": true}; 503 naming what is missing
                                                   (no model loaded, models loading, the broker)
    GET  /v2/models/{name}[/versions/{v}]          model metadata; 404 if not served
    GET  /v2/models/{name}[/versions/{v}]/ready    200 {"name", "ready": true}; 503; 404
    POST /v2/models/{name}[/versions/{v}]/infer    inference: JSON, or JSON + binary tensors
    GET  /v2/models/stats                          Triton's statistics of every served model
    GET  /v2/models/{name}[/versions/{v}]/stats    one model's statistics; 404 if not served
    GET|POST /v2/repository/index                  [{name, version, state, reason}]; body
                                                   {"ready": true}: only the ready ones
    POST /v2/repository/models/{name}/load|unload  501: not supported (``_repository``)
    GET  /metrics                                  the hub's Prometheus registry (``_prometheus``)
    GET  /openapi.json, /docs                      the OpenAPI document of the JSON protocol
    GET  /v1/models, POST /v1/completions, POST /v1/chat/completions
                                                   OpenAI-compatible text generation for an
                                                   in-process Hub's language models (``_openai``)

Errors are ``{"error": "..."}`` with the status of the hub's wire code:
400 bad_request / invalid_input (malformed JSON, wrong datatype or shape,
binary sizes that do not add up, a bad header length), 404 unknown_model,
413 too_large (the body, its JSON part or a tensor above the limits, or more
rows than max_batch_size; the body's Content-Length is checked before
reading, the streamed length while reading), 415 a Content-Encoding other
than identity, or a Content-Type other than JSON or application/octet-stream
(none at all is taken: Triton's client sends none; ``shared.server._http_guards``
says why text, form and multipart bodies are refused), 503 overloaded or not
serving (with Retry-After), 504
deadline_exceeded (Triton's request parameter ``timeout``, microseconds), 500
only when the model itself failed or its outputs cannot be encoded. With
``api_keys``: 401, 403 and 429 (``_auth``).

Why async routes in front of a threaded hub: an infer route awaits its
``ResultFuture`` without holding a thread, so as many requests as clients
send wait in the batcher at once and batch together (with the MQTT ones:
both call ``Hub.submit``). Bodies above ``OFFLOAD_BYTES`` are decoded and
encoded in a worker thread so that one large JSON body does not stall the
loop. Every infer outcome is counted in ``hub.prometheus`` with
``transport="http"``.

``dependencies`` (FastAPI ``Depends``) run before every ``/v2`` route, not
``/metrics`` (scraped from inside the network). ``api_keys`` (a
``shared.ApiKeyGuard``) adds one that asks for API keys with scopes and
per-key rate limits: see ``_auth`` for which route needs what; health
probes, ``/v2`` and ``/metrics`` stay open; the statistics and repository
routes need ``rollout:admin``. The statistics are what ``/metrics`` counts,
in Triton's JSON (``_statistics``): ``ServedHub.statistics`` gives them
(``HubMetrics.model_counts`` in process, ``PlaneMetrics.model_counts`` over
the process plane's books, which lag up to a second: each process writes its
book about every second).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from pydantic.json_schema import models_json_schema
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared import ErrorCode, Limits, TensorError, UnsupportedMediaTypeError
from shared.server import BINARY_MEDIA_TYPE, JSON_MEDIA_TYPE, ApiKeyGuard, body_media_type

from .._dispatch import Dispatcher, answer_of
from .._errors import (
    ExecutorError,
    HubError,
)
from .._hub import Hub
from .._tracing import HubTracer, RequestTimes, TracedRequest
from ..language import LanguageModels
from ..metrics import ModelCounts, RequestRecorder
from ._auth import api_key_auth
from ._bodies import OFFLOAD_BYTES, ByteBudget, declared_length, maybe_offload, read_body
from ._codec import (
    HEADER_LENGTH,
    check_requested_outputs,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from ._errors import describe, error_response, http_error, hub_error, validation_error
from ._openai import TokenBudget, openai_router
from ._repository import ModelController, add_repository_routes
from ._schemas import (
    ErrorResponse,
    InferenceRequest,
    InferenceResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MAX_JSON_BYTES",
    "SERVER_NAME",
    "ServedHub",
    "create_app",
    "drop_tracebacks",
    "server_version",
]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 64 * MiB
# JSON tensors cost ~8-30x their text in Python objects: large tensors go binary.
DEFAULT_MAX_JSON_BYTES = 16 * MiB
# Request bodies held at once (read, decoded, waiting for the model); past it: 503.
DEFAULT_MAX_INFLIGHT_BYTES = 256 * MiB
SERVER_NAME = "tandem-hub"
EXTENSIONS = ("binary_tensor_data",)
_INFER_MEDIA_TYPES = frozenset({JSON_MEDIA_TYPE, BINARY_MEDIA_TYPE})
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": what}
    for status, what in {
        400: "Malformed request: JSON, datatype, shape, binary sizes or header length.",
        404: "No such model or version is served here.",
        413: "Body, JSON part or a tensor above the server's limits.",
        503: "Overloaded or not serving; retry after Retry-After seconds.",
        504: "The request's deadline (parameter 'timeout', µs) passed before compute.",
        500: "The model failed.",
    }.items()
}


@dataclass(frozen=True)
class ServedHub:
    """What the API serves: a dispatcher, where answers are counted, and the size limits.

    ``create_app(hub)`` builds one from an in-process ``Hub``; a hub's HTTP
    ingress process builds one over its executor pool.
    """

    dispatcher: Dispatcher
    metrics: RequestRecorder
    limits: Limits
    missing: Callable[[], list[str]] | None = None  # what else readiness waits for (a broker)
    language: LanguageModels | None = None  # served by the OpenAI routes (/v1), if any
    statistics: Callable[[str, str], ModelCounts] | None = None  # counts of model@version
    control: ModelController | None = None  # repository load and unload (tandem hub)
    tracer: HubTracer | None = None  # spans of each infer request (``cloud_hub._tracing``)

    @classmethod
    def of(cls, hub: Hub | ServedHub) -> ServedHub:
        """What an in-process ``Hub`` serves (a ``ServedHub`` as it is)."""
        if isinstance(hub, ServedHub):
            return hub
        return cls(
            hub.dispatcher,
            hub.prometheus,
            hub.limits,
            hub.missing,
            hub.language,
            hub.prometheus.model_counts,
        )

    def not_ready(self) -> list[str]:
        """What readiness still waits for (models, the broker...); empty: ready."""
        missing = [] if self.missing is None else self.missing()
        names = self.dispatcher.model_names()
        if not names and not (self.language is not None and len(self.language)):
            missing.insert(0, "models: none loaded")  # language models alone are models too
        elif not self.dispatcher.ready():
            waiting = [m for m in names if not self.dispatcher.model_ready(m)]
            missing.insert(0, f"models: loading {waiting}" if waiting else "the hub is not running")
        return missing


def create_app(
    hub: Hub | ServedHub,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    dependencies: Sequence[Any] = (),
    api_keys: ApiKeyGuard | None = None,
    token_budget: TokenBudget | None = None,
) -> FastAPI:
    """The FastAPI app serving ``hub`` (which the caller starts and stops).

    An in-process ``Hub`` also gets the OpenAI-compatible ``/v1`` routes for its
    language models (``_openai``; ``token_budget`` limits each key's tokens), and
    so does a ``ServedHub`` with ``language`` (a process plane's ingress, whose
    engines are its language executors' clients). Each infer request's spans go to
    the hub's tracer when it has one (``Hub(tracing=...)``, ``ServedHub.tracer``).
    """
    language, given = hub.language, hub
    hub = ServedHub.of(hub)
    _check_sizes(max_body_bytes, max_json_bytes, max_inflight_bytes)
    if api_keys is not None:
        dependencies = [api_key_auth(api_keys), *dependencies]
    api = _InferenceApi(
        hub,
        tracer=_tracer_of(given),
        max_body_bytes=max_body_bytes,
        max_json_bytes=max_json_bytes,
        max_inflight_bytes=max_inflight_bytes,
    )
    app = FastAPI(
        title="Tandem hub: Open Inference Protocol v2",
        version=server_version(),
        description="KServe v2 / Triton HTTP inference with the binary tensor data extension.",
    )
    router = APIRouter(prefix="/v2", dependencies=list(dependencies))
    router.add_api_route("", api.server_metadata, methods=["GET"], response_model=ServerMetadata)
    router.add_api_route("/health/live", api.live, methods=["GET"], response_model=LiveResponse)
    router.add_api_route(
        "/health/ready",
        api.ready,
        methods=["GET"],
        response_model=ReadyResponse,
        responses={503: _ERRORS[503]},
    )
    add_repository_routes(  # before /models/{name}
        router,
        hub.dispatcher,
        hub.statistics,
        hub.control,
        lambda: [m.name for m in language] if language is not None else [],
    )
    for path, handlers in (
        ("/models/{model_name}", _unversioned(api)),
        ("/models/{model_name}/versions/{model_version}", _versioned(api)),
    ):
        metadata, ready, infer = handlers
        router.add_api_route(
            path,
            metadata,
            methods=["GET"],
            response_model=ModelMetadata,
            responses={404: _ERRORS[404]},
        )
        router.add_api_route(
            path + "/ready",
            ready,
            methods=["GET"],
            response_model=ModelReadyResponse,
            responses={404: _ERRORS[404], 503: _ERRORS[503]},
        )
        router.add_api_route(
            path + "/infer",
            infer,
            methods=["POST"],
            response_class=Response,
            responses={200: _INFER_RESPONSE, **_ERRORS},
            openapi_extra={"requestBody": _INFER_BODY},
        )
    app.include_router(router)
    if language is not None:
        app.include_router(openai_router(language, api_keys=api_keys, token_budget=token_budget))
    app.state.byte_budget = api.budget  # bytes of request bodies held now, and the limit
    app.add_api_route(
        "/metrics",
        api.metrics,
        methods=["GET"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
    )
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HubError, hub_error)
    app.openapi = _openapi_with_protocol_schemas(app)  # type: ignore[method-assign]
    return app


_HeaderLength = Annotated[
    str | None,
    Header(
        alias=HEADER_LENGTH,
        description="Bytes of JSON at the start of the body; binary tensors follow.",
    ),
]
_Handlers = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def _check_sizes(max_body_bytes: int, max_json_bytes: int, max_inflight_bytes: int) -> None:
    if max_body_bytes <= 0 or max_json_bytes <= 0 or max_inflight_bytes < max_body_bytes:
        raise ValueError(
            "max_body_bytes and max_json_bytes must be positive, max_inflight_bytes at least "
            "max_body_bytes"
        )


def _tracer_of(hub: Hub | ServedHub) -> Callable[[], HubTracer | None]:
    """Its tracer, read at each request: an in-process ``Hub`` opens one at ``start``."""
    return lambda: hub.tracer


def _unversioned(api: _InferenceApi) -> _Handlers:
    """Handlers of /v2/models/{model_name}/...: the served version answers."""

    async def metadata(model_name: str) -> Any:
        return await api.model_metadata(model_name, None)

    async def ready(model_name: str) -> Any:
        return await api.model_ready(model_name, None)

    async def infer(request: Request, model_name: str, header: _HeaderLength = None) -> Response:
        return await api.infer(request, model_name, None, header)

    return metadata, ready, infer


def _versioned(api: _InferenceApi) -> _Handlers:
    """Handlers of /v2/models/{model_name}/versions/{model_version}/..."""

    async def metadata(model_name: str, model_version: str) -> Any:
        return await api.model_metadata(model_name, model_version)

    async def ready(model_name: str, model_version: str) -> Any:
        return await api.model_ready(model_name, model_version)

    async def infer(
        request: Request, model_name: str, model_version: str, header: _HeaderLength = None
    ) -> Response:
        return await api.infer(request, model_name, model_version, header)

    return metadata, ready, infer


class _InferenceApi:
    """The route handlers, over one served hub."""

    def __init__(
        self,
        hub: ServedHub,
        *,
        tracer: Callable[[], HubTracer | None],
        max_body_bytes: int,
        max_json_bytes: int,
        max_inflight_bytes: int,
    ) -> None:
        self.hub = hub
        self.tracer = tracer
        self.dispatcher = hub.dispatcher
        self.language = hub.language
        self.prometheus = hub.metrics
        self.limits = hub.limits
        self.max_body_bytes = max_body_bytes
        self.max_json_bytes = max_json_bytes
        self.budget = ByteBudget(max_inflight_bytes)
        self._big_decodes = asyncio.Semaphore(1)

    async def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)}

    async def live(self) -> dict[str, Any]:
        return {"live": True}

    async def ready(self) -> Any:
        missing = self.hub.not_ready()
        if missing:
            return error_response(503, f"not ready: {'; '.join(missing)}")
        return {"ready": True}

    async def model_metadata(self, model_name: str, model_version: str | None) -> Any:
        info = self.dispatcher.describe(model_name, model_version)
        batched = info.max_batch_size > 0

        def tensors(specs: Sequence[Any]) -> list[dict[str, Any]]:
            return [
                {
                    "name": s.name,
                    "datatype": s.datatype,
                    "shape": [-1, *s.dims] if batched else list(s.dims),  # KServe: -1 is free
                }
                for s in specs
            ]

        return {
            "name": info.model,
            "versions": [info.version],
            "platform": info.platform,
            "inputs": tensors(info.inputs),
            "outputs": tensors(info.outputs),
        }

    async def model_ready(self, model_name: str, model_version: str | None) -> Any:
        info = self.dispatcher.describe(model_name, model_version)
        if not self.dispatcher.model_ready(model_name, model_version):
            return error_response(503, f"model {info.model}@{info.version} is not ready")
        return {"name": info.model, "ready": True}

    async def infer(
        self,
        request: Request,
        model_name: str,
        model_version: str | None,
        inference_header_content_length: str | None,
    ) -> Response:
        received = time.monotonic()
        tracer = self.tracer()
        submitted: float | None = None
        request_id: str | None = None
        lease = self.budget.lease()
        try:
            body_media_type(request.headers.get("content-type"), _INFER_MEDIA_TYPES)
            declared = declared_length(request, self.max_body_bytes)
            body = await read_body(request, self.max_body_bytes, declared, lease)
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise UnsupportedMediaTypeError(
                    f"Content-Encoding {encoding!r:.40} is not supported; send the body as is"
                )
            header_length = parse_header_length(
                inference_header_content_length, len(body), max_json_bytes=self.max_json_bytes
            )
            info = self.dispatcher.describe(model_name, model_version)
            decoded = await self._decode(body, header_length)
            del body  # the tensors are decoded: the text can go
            check_requested_outputs(info, decoded)
            deadline = None if decoded.timeout_us is None else received + decoded.timeout_us / 1e6
            request_id = decoded.id
            if tracer is not None:
                submitted = time.monotonic()
            result = await answer_of(
                self.dispatcher, model_name, model_version, decoded.inputs, deadline, received
            )
            answered = time.monotonic()
            try:
                content, json_length = await maybe_offload(
                    sum(a.nbytes for a in result.outputs.values()),
                    encode_infer_response,
                    result.outputs,
                    model=result.model,
                    version=result.model_version,
                    request_id=decoded.id,
                    requested=decoded.outputs,
                    binary_output=decoded.binary_output,
                )
            except TensorError as e:  # the model's outputs, not the request, are at fault
                raise ExecutorError(
                    f"cannot encode {info.model}@{info.version}'s outputs: {e}"
                ) from e
        except Exception as e:  # every failure becomes its status; asyncio cancellation passes
            status, code, message = describe(e)
            drop_tracebacks(e)  # their frames hold the body: free it now, not at the next GC
            self.prometheus.record("http", model_name, model_version, received=received, error=code)
            if tracer is not None:
                now = time.monotonic()
                traced = TracedRequest.http(request.headers, model_name, model_version, request_id)
                times = RequestTimes(received=received, submitted=submitted, answered=now, sent=now)
                tracer.record(traced, times, error=code, result=None)
            return error_response(status, message)
        finally:
            lease.release()  # answered, refused or cancelled: its bytes are free again
        self.prometheus.record("http", model_name, model_version, received=received, result=result)
        if tracer is not None:
            traced = TracedRequest.http(request.headers, model_name, model_version, request_id)
            now = time.monotonic()
            times = RequestTimes(
                received=received, submitted=submitted, answered=answered, sent=now
            )
            tracer.record(traced, times, error=ErrorCode.OK, result=result)
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(json_length)},
        )

    async def _decode(self, body: bytearray, header_length: int | None) -> Any:
        """Decode; a big body in a worker thread, one big body at a time (memory stays bounded)."""
        if len(body) <= OFFLOAD_BYTES:
            return decode_infer_request(body, header_length, limits=self.limits)
        async with self._big_decodes:
            return await run_in_threadpool(
                decode_infer_request, body, header_length, limits=self.limits
            )

    def metrics(self) -> Response:  # sync: FastAPI runs it in a worker thread
        return Response(
            self.prometheus.render(), headers={"Content-Type": self.prometheus.content_type}
        )


def drop_tracebacks(error: BaseException | None) -> None:
    """Clear the tracebacks of ``error`` and what it chains to.

    A traceback holds the frames it passed through, and they the request's
    body and tensors; a frame that also holds the exception (a worker thread's
    hand-off does) makes a cycle that only the cyclic GC frees, which may not
    run for a long while: a refused 7 MiB body stayed in memory.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def server_version() -> str:
    """This hub's version (the installed ``tandem`` distribution's)."""
    try:
        return importlib.metadata.version("tandem")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_INFER_RESPONSE: dict[str, Any] = {
    "model": InferenceResponse,
    "description": "JSON ($inference_response), or with binary outputs: JSON of "
    "Inference-Header-Content-Length bytes, then each binary output's bytes "
    "(application/octet-stream).",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}
_INFER_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}},
        "application/octet-stream": {
            "schema": {"type": "string", "format": "binary"},
            "description": "Binary tensor data extension: the JSON request "
            "(Inference-Header-Content-Length bytes), then each input with "
            "parameters.binary_data_size, in input order, little-endian.",
        },
    },
}


def _openapi_with_protocol_schemas(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI's document plus the request schemas the raw-body infer route cannot declare."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            _, defs = models_json_schema(
                [(InferenceRequest, "validation")], ref_template="#/components/schemas/{model}"
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in defs.get("$defs", {}).items():
                components.setdefault(name, definition)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
