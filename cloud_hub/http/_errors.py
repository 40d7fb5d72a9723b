"""How the hub's HTTP API answers a failure: the status of each wire code, and the
``{"error": "..."}`` body (with ``Retry-After`` on 503) for infer failures and for the
exceptions FastAPI and Starlette raise before a route runs."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from shared import ErrorCode, ProtocolError, UnsupportedMediaTypeError

from .._errors import HubError, error_code

__all__ = [
    "describe", "error_response", "http_error", "hub_error", "status_of", "validation_error",
]  # fmt: skip

log = logging.getLogger(__name__)

_RETRY_AFTER_S = "1"
_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.UNKNOWN_MODEL: 404,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INTERNAL: 500,
}


def status_of(code: ErrorCode | None) -> int:
    """The HTTP status of a wire code (``None``, as an internal failure: 500)."""
    return _STATUS.get(code or ErrorCode.INTERNAL, 500)


def describe(error: Exception) -> tuple[int, ErrorCode, str]:
    """HTTP status, wire code and message for an infer failure."""
    if isinstance(error, UnsupportedMediaTypeError):
        return 415, ErrorCode.BAD_REQUEST, str(error)
    if isinstance(error, ClientDisconnect):  # gone mid-body (or dropped as too slow)
        return 400, ErrorCode.BAD_REQUEST, "the client went away before its body ended"
    code = error_code(error)
    if isinstance(error, HubError | ProtocolError):
        return _STATUS[code], code, str(error) or type(error).__name__
    log.exception("unexpected error serving an HTTP inference request", exc_info=error)
    return 500, ErrorCode.INTERNAL, "internal server error"


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"Retry-After": _RETRY_AFTER_S} if status == 503 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def hub_error(_request: Request, exc: Exception) -> Response:
    status, _code, message = describe(exc)
    return error_response(status, message)


async def http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    response = error_response(exc.status_code, str(exc.detail))
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


async def validation_error(_request: Request, exc: Exception) -> Response:
    return error_response(400, f"invalid request: {exc}")
