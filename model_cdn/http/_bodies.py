"""Reading what a request carries, bounded: bodies, signed JSON documents, version numbers.

A body of a media type the route does not take is refused with 415 before
it is read (``shared.body_media_type``: JSON for documents,
``application/octet-stream`` for blobs, or no ``Content-Type`` at all). A
body is refused with 413 as soon as it passes its limit: before reading
when ``Content-Length`` says so, while reading otherwise (a chunked body has
no length to trust). A document is plain JSON (no ``NaN``/``Infinity``) and
an object, at most ``shared.MAX_DOCUMENT_BYTES``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fastapi import Request

from shared import MAX_DOCUMENT_BYTES
from shared.server import BINARY_MEDIA_TYPE, JSON_MEDIA_TYPE, body_media_type

from ._errors import HttpError

__all__ = ["BINARY", "JSON", "parse_version", "read_body", "read_json"]

JSON = frozenset({JSON_MEDIA_TYPE})
BINARY = frozenset({BINARY_MEDIA_TYPE})

_VERSION = re.compile(r"[1-9][0-9]{0,17}")


def parse_version(text: str) -> int:
    """A version number from a URL, or 400."""
    if not _VERSION.fullmatch(text):
        raise HttpError(400, f"version must be a positive integer, got {text[:40]!r}")
    return int(text)


async def read_body(
    request: Request,
    limit: int,
    what: str,
    on_chunk: Callable[[bytes], object] | None = None,
    *,
    media_types: frozenset[str] = BINARY,
) -> bytes:
    """The request body, refused with 415 unless of ``media_types``, with 413 as soon as it
    passes ``limit`` bytes.

    ``on_chunk`` sees every chunk as it arrives (hashing then costs no second pass).
    """
    body_media_type(request.headers.get("content-type"), media_types)  # 415 (``_errors``)
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


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object (a signed document, a rollout request), or 400/413."""
    body = await read_body(request, MAX_DOCUMENT_BYTES, "document", media_types=JSON)
    try:
        doc = json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise HttpError(400, f"the body is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise HttpError(400, "the body must be a signed JSON document (an object)")
    return doc
