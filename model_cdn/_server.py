"""The CDN's HTTP API: models, signed manifests, immutable blobs, device assignments.

Routes (devices and the updater rely on this layout)::

    GET    /healthz
    GET    /v1/models                                        {"models": [name, …]}
    GET    /v1/models/{name}/versions                        {"versions": [{version,
                                                               blob_digest, published_at}]}
    GET    /v1/models/{name}/manifest                        latest signed manifest
    GET    /v1/models/{name}/versions/{version}/manifest     one signed manifest
    GET    /v1/blobs/{digest}            (and HEAD)          the blob; ranges, ETag, immutable
    GET    /v1/devices/{device}/assignments/{model}          signed assignment
  admin (Authorization: Bearer <admin token>, or an API key with the scope in brackets):
    PUT    /v1/blobs/{digest}                 [models:publish]  body = the bytes; digest checked
    POST   /v1/models/{name}/versions         [models:publish]  body = signed manifest
    DELETE /v1/models/{name}/versions/{version}                  [models:publish]
    PUT    /v1/devices/{device}/assignments/{model}              [rollout:admin]
                                                 body = signed assignment; MQTT retained

With ``api_keys`` (a ``shared.ApiKeyGuard``) reads need a key with
``models:read`` (or the read or admin token): see ``_auth`` for the rules.

Blobs are immutable and named by their digest, so they go out with
``ETag: "sha256:…"`` and ``Cache-Control: immutable`` and any CDN or S3 can
front this server. Local files are sent by Starlette's ``FileResponse``
(which handles ranges and ``HEAD``; see ``_ranges`` for the rules both paths
share) in 1 MiB reads; other stores are streamed from ``store.open()`` in
64 KiB chunks.
Nothing here reads a whole blob into memory except an upload, which is
bounded by ``max_blob_bytes``.

Every name and digest in a path is checked before it reaches the registry or
the store (no ``..``, ``/``, upper-case hex), and every error is JSON
``{"error": "…"}`` with its status: 400 bad input, 401 no or malformed
credentials or an unknown or revoked API key, 403 wrong token or a key
without the scope, 404 unknown, 409 version not above the latest, 413 too
large, 416 bad range, 429 a key over its rate (with Retry-After), 502 MQTT
publish failed, 503 storage failed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from shared import (
    ApiKeyGuard,
    ManifestError,
    MqttSettings,
    PublicKey,
    TandemError,
    Topics,
)

from ._auth import AuthDenied, CdnAuth
from ._errors import (
    AssignmentNotPublishedError,
    AuthError,
    BlobNotFoundError,
    CdnError,
    DeviceNotFoundError,
    DocumentRejectedError,
    InvalidNameError,
    ModelNotFoundError,
    RegistryError,
    RolloutConflictError,
    RolloutNotFoundError,
    RolloutStateError,
    StoreError,
    VersionConflictError,
)
from ._operations import add_version, assign_version, delete_version
from ._publisher import AssignmentPublisher
from ._ranges import RangeNotSatisfiableError, etag_matches, plan_range
from ._rollout_routes import add_rollout_routes
from .registry import Registry
from .registry._rows import check_name, dump_document
from .store import BlobStore, check_digest

__all__ = ["create_app"]

if TYPE_CHECKING:
    from ._metrics import CdnMetrics
    from .rollout._controller import RolloutController

logger = logging.getLogger(__name__)

# Upload limit: the body is held in memory (BlobStore.put takes bytes); a bigger
# model belongs in S3 through its own multipart upload, not through this API.
MAX_BLOB_BYTES = 1024**3
MAX_DOCUMENT_BYTES = 1024 * 1024  # a signed manifest or assignment
CHUNK_BYTES = 64 * 1024
BLOB_FILE_CHUNK_BYTES = 1024 * 1024  # per read of a local blob file (``_BlobFileResponse``)
IMMUTABLE = "public, max-age=31536000, immutable"
_VERSION = re.compile(r"[1-9][0-9]{0,17}")


class HttpError(Exception):
    """An error answer: status, one-line message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def _status_of(error: TandemError) -> int:
    """The HTTP status of one of our own errors (most specific first)."""
    for kind, status in (
        (InvalidNameError, 400),
        (DocumentRejectedError, 400),
        (AssignmentNotPublishedError, 502),
        (AuthError, 403),
        (ManifestError, 400),  # includes SignatureError and ExpiredError
        (ModelNotFoundError, 404),
        (BlobNotFoundError, 404),
        (DeviceNotFoundError, 404),
        (RolloutNotFoundError, 404),
        (VersionConflictError, 409),
        (RolloutStateError, 409),
        (RolloutConflictError, 409),
        (RegistryError, 503),
        (StoreError, 503),
    ):
        if isinstance(error, kind):
            return status
    return 400 if isinstance(error, ValueError) else 500


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _version(text: str) -> int:
    if not _VERSION.fullmatch(text):
        raise HttpError(400, f"version must be a positive integer, got {text[:40]!r}")
    return int(text)


class _BlobFileResponse(FileResponse):
    """``FileResponse`` answering one range at most, and no range when told to ignore it.

    Our ``plan_range`` decides; when it says "whole blob" the request's
    ``Range`` never reaches ``FileResponse``, which would otherwise answer
    some ranges we ignore (an unknown unit) with 400.
    """

    max_ranges = 1
    # Starlette reads 64 KiB per worker-thread hop and event-loop pass; at 1 MiB a blob
    # costs about a fifth of the CPU (bench (e): 256 KiB halves it, 4 MiB gains nothing more).
    chunk_size = BLOB_FILE_CHUNK_BYTES

    def __init__(self, *args: Any, honour_range: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.honour_range = honour_range

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.honour_range:
            drop = (b"range", b"if-range")
            scope = {
                **scope,
                "headers": [(k, v) for k, v in scope["headers"] if k.lower() not in drop],
            }
        await super().__call__(scope, receive, send)


def _chunks(stream: BinaryIO, start: int, length: int) -> Iterator[bytes]:
    """``length`` bytes from ``start``, 64 KiB at a time; closes the stream however it ends."""
    try:
        stream.seek(start)
        while length > 0:
            chunk = stream.read(min(CHUNK_BYTES, length))
            if not chunk:
                raise StoreError(f"blob ended {length} bytes early")
            length -= len(chunk)
            yield chunk
    finally:
        stream.close()


def create_app(
    *,
    registry: Registry,
    store: BlobStore,
    admin_token: str | None,
    read_token: str | None = None,
    trusted_keys: list[PublicKey] | None = None,
    mqtt: MqttSettings | None = None,
    topics: Topics = Topics(),  # noqa: B008 - frozen dataclass, safe as a default
    max_blob_bytes: int = MAX_BLOB_BYTES,
    api_keys: ApiKeyGuard | None = None,
    controller: RolloutController | None = None,
    publisher: AssignmentPublisher | None = None,
) -> FastAPI:
    """The CDN app over ``registry`` and ``store``.

    ``admin_token`` None turns the admin routes off (403) unless ``api_keys``
    is set. ``read_token`` set makes reads need it (or the admin token).
    ``api_keys`` set lets keys with scopes in, and makes reads need one
    (or a token). ``trusted_keys`` set makes
    uploads of manifests and assignments need a signature by one of them
    (devices check again; this only stops mistakes early). ``mqtt`` set makes
    an assignment PUT also publish it, retained, to the device. ``controller``
    set turns on the rollout API (``_rollout_routes``); the caller starts and
    stops it.
    """
    for what, token in (("admin", admin_token), ("read", read_token)):
        if token is not None and (not token or not token.isprintable() or " " in token):
            raise CdnError(f"the {what} token must be non-empty printable text without spaces")
    app = FastAPI(title="Tandem model CDN", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.registry, app.state.store = registry, store
    app.state.metrics = metrics = _new_metrics()
    if metrics is not None and controller is not None:
        metrics.watch_rollouts(controller)
    keys = list(trusted_keys) if trusted_keys else None
    if publisher is None and controller is not None:
        publisher = controller.publisher
    if publisher is None and mqtt is not None:
        publisher = AssignmentPublisher.connect(mqtt, topics, lazy=True)
    app.state.publisher = publisher

    # -- errors ------------------------------------------------------------

    @app.exception_handler(HttpError)
    async def _on_http_error(_r: Request, e: HttpError) -> Response:
        return _error(e.status, str(e), e.headers)

    @app.exception_handler(TandemError)
    async def _on_tandem_error(_r: Request, e: TandemError) -> Response:
        status = _status_of(e)
        if status >= 500:
            logger.error("%s", e)
        return _error(status, str(e))

    @app.exception_handler(StarletteHTTPException)
    async def _on_route_error(_r: Request, e: StarletteHTTPException) -> Response:
        return _error(e.status_code, str(e.detail), dict(e.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_r: Request, e: RequestValidationError) -> Response:
        return _error(
            400, f"bad request: {e.errors()[0].get('msg', 'invalid') if e.errors() else e}"
        )

    # -- auth --------------------------------------------------------------

    auth = CdnAuth(admin_token=admin_token, read_token=read_token, api_keys=api_keys)

    def guarded(check: Callable[[str | None], None]) -> list[Any]:
        def dependency(request: Request) -> None:
            try:
                check(request.headers.get("authorization"))
            except AuthDenied as e:
                raise HttpError(e.status, str(e), e.headers) from e

        return [Depends(dependency)]

    read = guarded(auth.require_read)
    publish = guarded(lambda header: auth.require_admin(header, "models:publish"))
    rollout = guarded(lambda header: auth.require_admin(header, "rollout:admin"))

    # -- reads -------------------------------------------------------------

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        if metrics is None:
            raise HttpError(404, "metrics need prometheus-client installed")
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=read)
    def list_models() -> dict[str, Any]:
        return {"models": registry.list_models()}

    @app.get("/v1/models/{name}/versions", dependencies=read)
    def list_versions(name: str) -> dict[str, Any]:
        records = registry.list_versions(check_name(name, "model name"))
        return {
            "versions": [
                {"version": r.version, "blob_digest": r.blob_digest, "published_at": r.published_at}
                for r in records
            ]
        }

    def document(doc: dict[str, Any], cache: str) -> Response:
        return Response(
            dump_document(doc), media_type="application/json", headers={"Cache-Control": cache}
        )

    @app.get("/v1/models/{name}/manifest", dependencies=read)
    def latest_manifest(name: str) -> Response:
        record = registry.get_version(check_name(name, "model name"))
        if metrics is not None:
            metrics.manifest_served(name, record.version)
        return document(record.manifest, "no-cache")

    @app.get("/v1/models/{name}/versions/{version}/manifest", dependencies=read)
    def manifest(name: str, version: str) -> Response:
        record = registry.get_version(check_name(name, "model name"), _version(version))
        if metrics is not None:
            metrics.manifest_served(name, record.version)
        # A version's manifest never changes, but it may be withdrawn: cache it briefly.
        return document(record.manifest, "public, max-age=300")

    @app.api_route("/v1/blobs/{digest}", methods=["GET", "HEAD"], dependencies=read)
    def blob(digest: str, request: Request) -> Response:
        check_digest(digest)
        etag = f'"{digest}"'
        headers = {"ETag": etag, "Cache-Control": IMMUTABLE, "Accept-Ranges": "bytes"}
        path = store.local_path(digest)
        if path is not None:
            try:
                info = os.stat(path)
            except FileNotFoundError as e:
                raise BlobNotFoundError(f"no blob {digest}") from e
            if not stat.S_ISREG(info.st_mode):
                raise BlobNotFoundError(f"no blob {digest}")
            size = info.st_size
        else:
            size = store.size(digest)
        if etag_matches(request.headers.get("if-none-match"), etag):
            if metrics is not None and request.method == "GET":
                metrics.blob_unchanged(digest)
            return Response(status_code=304, headers=headers)
        try:
            byte_range = plan_range(
                request.headers.get("range"), request.headers.get("if-range"), etag, size
            )
        except RangeNotSatisfiableError as e:
            raise HttpError(416, str(e), {"Content-Range": f"bytes */{e.size}"}) from e
        if metrics is not None and request.method == "GET":
            sent = size if byte_range is None else byte_range.length
            metrics.blob_served(digest, sent, partial=byte_range is not None)
        if path is not None:
            return _BlobFileResponse(
                path,
                headers=headers,
                media_type="application/octet-stream",
                stat_result=info,
                honour_range=byte_range is not None,
            )
        status, start, length = 200, 0, size
        if byte_range is not None:
            status, start, length = 206, byte_range.start, byte_range.length
            headers["Content-Range"] = byte_range.content_range(size)
        headers["Content-Length"] = str(length)
        if request.method == "HEAD":
            return Response(
                status_code=status, headers=headers, media_type="application/octet-stream"
            )
        return StreamingResponse(
            _chunks(store.open(digest), start, length),
            status_code=status,
            headers=headers,
            media_type="application/octet-stream",
        )

    @app.get("/v1/devices/{device}/assignments/{model}", dependencies=read)
    def get_assignment(device: str, model: str) -> Response:
        doc = registry.get_assignment(
            check_name(device, "device id"), check_name(model, "model name")
        )
        if doc is None:
            raise HttpError(404, f"no assignment of model {model} to device {device}")
        return document(doc, "no-cache")

    # -- admin -------------------------------------------------------------

    @app.put("/v1/blobs/{digest}", dependencies=publish)
    async def put_blob(digest: str, request: Request) -> Response:
        check_digest(digest)
        hasher = hashlib.sha256()
        body = await _read_body(request, max_blob_bytes, "blob", hasher.update)
        actual = "sha256:" + hasher.hexdigest()
        if actual != digest:
            raise HttpError(400, f"the body's digest is {actual}, not {digest} as the URL says")
        existed = await run_in_threadpool(store.exists, digest)
        if not existed:
            await run_in_threadpool(store.put, body)
        return JSONResponse(
            {"digest": digest, "size": len(body)}, status_code=200 if existed else 201
        )

    @app.post("/v1/models/{name}/versions", dependencies=publish)
    async def post_version(name: str, request: Request) -> Response:
        check_name(name, "model name")
        doc = await _read_json(request)

        def add() -> dict[str, Any]:
            record = add_version(registry, store, doc, trusted_keys=keys, name=name)
            return {
                "name": record.name,
                "version": record.version,
                "blob_digest": record.blob_digest,
                "published_at": record.published_at,
            }

        return JSONResponse(await run_in_threadpool(add), status_code=201)

    @app.delete("/v1/models/{name}/versions/{version}", dependencies=publish)
    def remove_version(name: str, version: str) -> dict[str, Any]:
        number = _version(version)
        delete_version(registry, name, number)
        return {"deleted": {"name": name, "version": number}}

    @app.put("/v1/devices/{device}/assignments/{model}", dependencies=rollout)
    async def put_assignment(device: str, model: str, request: Request) -> Response:
        doc = await _read_json(request)

        def assign() -> dict[str, Any]:
            result = assign_version(
                registry, publisher, device, model, doc, trusted_keys=keys, wait=True
            )
            return result.to_dict()

        return JSONResponse(await run_in_threadpool(assign))

    add_rollout_routes(
        app,
        controller=controller,
        registry=registry,
        dependencies=rollout,
        read_json=_read_json,
        http_error=HttpError,
    )
    return app


def _new_metrics() -> CdnMetrics | None:
    """The app's own metrics, or None where prometheus-client is not installed."""
    try:
        from ._metrics import CdnMetrics
    except ImportError:
        logger.info("prometheus-client is not installed: GET /metrics is off")
        return None
    return CdnMetrics()


async def _read_body(
    request: Request, limit: int, what: str, on_chunk: Callable[[bytes], object] | None = None
) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes.

    ``on_chunk`` sees every chunk as it arrives (hashing then costs no second pass).
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"the {what} is {declared} bytes; the limit is {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if on_chunk is not None:
            on_chunk(chunk)
        if len(body) > limit:
            raise HttpError(413, f"the {what} is over the limit of {limit} bytes")
    return bytes(body)


def _no_constants(name: str) -> Any:
    raise HttpError(400, f"the document is not plain JSON: {name} is not a number")


async def _read_json(request: Request) -> dict[str, Any]:
    body = await _read_body(request, MAX_DOCUMENT_BYTES, "document")
    try:
        doc = json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise HttpError(400, f"the body is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise HttpError(400, "the body must be a signed JSON document (an object)")
    return doc
