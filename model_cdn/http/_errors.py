"""Error answers of the CDN's HTTP API: every error is JSON ``{"error": "…"}`` with its status.

Statuses: 400 bad input, 401 no or malformed credentials or an unknown or
revoked API key, 403 wrong token or a key without the scope, 404 unknown,
405 a method the path does not take, 409 version not above the latest or a
rollout state or conflict, 413 too large, 415 a body's Content-Type the
route does not take (text, form, multipart: see ``shared.server._http_guards``),
416 a range that starts past the end of the blob, 429 a key over its
rate (with ``Retry-After``), 502 MQTT publish failed, 503 storage, registry
or rollouts off.

``model_cdn.HttpError`` (and its ``AuthDenied``, ``RangeNotSatisfiableError``)
is an answer that carries its own status and headers: routes raise it where
only HTTP knows the status. The library's other errors (``model_cdn.CdnError``,
``shared.TandemError``) are mapped to statuses by ``status_of``, most
specific first; anything else is a bug and answers 500.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared import InvalidStoreKeyError, ManifestError, TandemError, UnsupportedMediaTypeError

from .._errors import (
    AssignmentNotPublishedError,
    AuthError,
    BlobNotFoundError,
    DeviceNotFoundError,
    DocumentRejectedError,
    HttpError,
    InvalidNameError,
    ModelNotFoundError,
    NoRolloutLeaderError,
    RegistryError,
    RolloutConflictError,
    RolloutNotFoundError,
    RolloutStateError,
    StoreError,
    VersionConflictError,
)

__all__ = ["HttpError", "error_response", "install_error_handlers", "status_of"]

logger = logging.getLogger("model_cdn.http")

# most specific first: a subclass must come before its base
_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (InvalidNameError, 400),
    (InvalidStoreKeyError, 400),  # a malformed digest: before StoreError, its base
    (DocumentRejectedError, 400),
    (AssignmentNotPublishedError, 502),
    (AuthError, 403),
    (UnsupportedMediaTypeError, 415),
    (ManifestError, 400),  # includes SignatureError and ExpiredError
    (ModelNotFoundError, 404),
    (BlobNotFoundError, 404),
    (DeviceNotFoundError, 404),
    (RolloutNotFoundError, 404),
    (VersionConflictError, 409),
    (RolloutStateError, 409),
    (RolloutConflictError, 409),
    (NoRolloutLeaderError, 503),
    (RegistryError, 503),
    (StoreError, 503),
)


def status_of(error: TandemError) -> int:
    """The HTTP status of one of our own errors (most specific first)."""
    if isinstance(error, HttpError):
        return error.status
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 400 if isinstance(error, ValueError) else 500


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _on_http_error(_r: Request, e: Exception) -> Response:
    assert isinstance(e, HttpError)
    return error_response(e.status, str(e), e.headers)


async def _on_tandem_error(_r: Request, e: Exception) -> Response:
    assert isinstance(e, TandemError)
    status = status_of(e)
    if status >= 500:
        logger.error("%s", e)
    return error_response(status, str(e))


async def _on_route_error(_r: Request, e: Exception) -> Response:
    assert isinstance(e, StarletteHTTPException)
    return error_response(e.status_code, str(e.detail), dict(e.headers or {}))


async def _on_validation(_r: Request, e: Exception) -> Response:
    assert isinstance(e, RequestValidationError)
    errors = e.errors()
    return error_response(400, f"bad request: {errors[0].get('msg', 'invalid') if errors else e}")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as JSON ``{"error": …}`` with its status."""
    app.add_exception_handler(HttpError, _on_http_error)
    app.add_exception_handler(TandemError, _on_tandem_error)
    app.add_exception_handler(StarletteHTTPException, _on_route_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
