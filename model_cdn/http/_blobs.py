"""Blobs: immutable, content-addressed, range-capable; uploads checked against their digest.

::

    GET, HEAD  blob    the blob; ranges, ETag, Cache-Control: immutable
    PUT        blob    [models:publish] body = the bytes; 201 new, 200 already there

Blobs never change and are named by their digest, so they go out with
``ETag: "sha256:…"`` and ``Cache-Control: immutable`` and any CDN or S3 can
front this server. Local files are sent by Starlette's ``FileResponse``
(which handles ranges and ``HEAD``; see ``_ranges`` for the rules both paths
share) in 1 MiB reads; other stores are streamed from ``store.open()`` in
64 KiB chunks. Nothing here reads a whole blob into memory except an
upload, which is bounded by ``max_blob_bytes``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from shared import CdnPaths
from shared.server.store import BlobStore, check_digest

from .._errors import BlobNotFoundError, StoreError
from ._auth import Guards
from ._bodies import read_body
from ._errors import HttpError
from ._ranges import ByteRange, etag_matches, plan_range

if TYPE_CHECKING:
    from .._metrics import CdnMetrics

__all__ = ["BLOB_FILE_CHUNK_BYTES", "CHUNK_BYTES", "IMMUTABLE", "add_blob_routes"]

CHUNK_BYTES = 64 * 1024
BLOB_FILE_CHUNK_BYTES = 1024 * 1024  # per read of a local blob file (``_BlobFileResponse``)
IMMUTABLE = "public, max-age=31536000, immutable"
_OCTETS = "application/octet-stream"


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


def _local_file(path: Path, digest: str) -> os.stat_result:
    """The blob file's ``stat``; a missing or irregular file is no blob (404)."""
    try:
        info = os.stat(path)
    except FileNotFoundError as e:
        raise BlobNotFoundError(f"no blob {digest}") from e
    if not stat.S_ISREG(info.st_mode):
        raise BlobNotFoundError(f"no blob {digest}")
    return info


class _BlobRoutes:
    def __init__(self, store: BlobStore, metrics: CdnMetrics | None, max_blob_bytes: int) -> None:
        self.store, self.metrics, self.max_blob_bytes = store, metrics, max_blob_bytes

    def get_blob(self, digest: str, request: Request) -> Response:
        check_digest(digest)
        etag = f'"{digest}"'
        headers = {"ETag": etag, "Cache-Control": IMMUTABLE, "Accept-Ranges": "bytes"}
        path = self.store.local_path(digest)
        info = _local_file(path, digest) if path is not None else None
        size = info.st_size if info is not None else self.store.size(digest)
        metrics = self.metrics if request.method == "GET" else None  # HEAD is no download
        if etag_matches(request.headers.get("if-none-match"), etag):
            if metrics is not None:
                metrics.blob_unchanged(digest)
            return Response(status_code=304, headers=headers)
        # RangeNotSatisfiableError: answered 416 with Content-Range: bytes */size
        byte_range = plan_range(
            request.headers.get("range"), request.headers.get("if-range"), etag, size
        )
        if metrics is not None:
            sent = size if byte_range is None else byte_range.length
            metrics.blob_served(digest, sent, partial=byte_range is not None)
        if path is not None:
            return _BlobFileResponse(
                path,
                headers=headers,
                media_type=_OCTETS,
                stat_result=info,
                honour_range=byte_range is not None,
            )
        return self._stream(digest, request, headers, size, byte_range)

    def _stream(
        self,
        digest: str,
        request: Request,
        headers: dict[str, str],
        size: int,
        byte_range: ByteRange | None,
    ) -> Response:
        """A blob without a local file (S3 and the like), from ``store.open()``."""
        status, start, length = 200, 0, size
        if byte_range is not None:
            status, start, length = 206, byte_range.start, byte_range.length
            headers["Content-Range"] = byte_range.content_range(size)
        headers["Content-Length"] = str(length)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers, media_type=_OCTETS)
        return StreamingResponse(
            _chunks(self.store.open(digest), start, length),
            status_code=status,
            headers=headers,
            media_type=_OCTETS,
        )

    async def put_blob(self, digest: str, request: Request) -> Response:
        check_digest(digest)
        hasher = hashlib.sha256()
        body = await read_body(request, self.max_blob_bytes, "blob", hasher.update)
        actual = "sha256:" + hasher.hexdigest()
        if actual != digest:
            raise HttpError(400, f"the body's digest is {actual}, not {digest} as the URL says")
        existed = await run_in_threadpool(self.store.exists, digest)
        if not existed:
            await run_in_threadpool(self.store.put, body)
        return JSONResponse(
            {"digest": digest, "size": len(body)}, status_code=200 if existed else 201
        )


def add_blob_routes(
    app: FastAPI, store: BlobStore, metrics: CdnMetrics | None, max_blob_bytes: int, guards: Guards
) -> None:
    routes = _BlobRoutes(store, metrics, max_blob_bytes)
    router = app.router
    path = CdnPaths.ROUTES["blob"]
    router.add_api_route(path, routes.get_blob, methods=["GET", "HEAD"], dependencies=guards.read)
    router.add_api_route(path, routes.put_blob, methods=["PUT"], dependencies=guards.publish)
