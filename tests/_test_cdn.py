"""A model CDN on loopback for the updater tests: stdlib ``http.server``, real sockets.

Serves the contract's layout::

    GET /v1/models/{name}/versions/{version}/manifest   signed manifest JSON
    GET /v1/models/{name}/manifest                      the latest one
    GET /v1/blobs/{digest}                              bytes; ETag, Range, If-Range
    GET /v1/devices/{device}/assignments/{model}        signed assignment JSON, or 404

and can be told to misbehave per blob (``BlobFault``): cut the connection
after N bytes, stream without end, serve another body first under another
ETag, ignore ``If-Range``. Every request is logged (``requests``), with the
body bytes the server managed to write.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["BlobFault", "LoopbackCdn", "RequestRecord"]

_RANGE = re.compile(r"bytes=(\d+)-")
_ENDLESS_CAP = 256 * 1024 * 1024  # the server gives up streaming at some point, too


@dataclass
class BlobFault:
    """How to misbehave when serving one blob."""

    drop_after: int | None = None  # cut the first request after this many body bytes
    first_body: bytes | None = None  # serve this (ETag "stale") on the first request
    ignore_if_range: bool = False  # answer any Range with 206, whatever If-Range says
    endless: bool = False  # no Content-Length; after the blob, junk until the client leaves


@dataclass
class RequestRecord:
    path: str
    range: str | None
    if_range: str | None
    status: int
    sent: int = 0  # body bytes written


@dataclass
class _State:
    token: str | None = None
    manifests: dict[tuple[str, int], bytes] = field(default_factory=dict)
    latest: dict[str, bytes] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    assignments: dict[tuple[str, str], bytes] = field(default_factory=dict)
    faults: dict[str, BlobFault] = field(default_factory=dict)
    requests: list[RequestRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        state = self.server.state
        record = RequestRecord(
            self.path, self.headers.get("Range"), self.headers.get("If-Range"), 0
        )
        with state.lock:
            state.requests.append(record)
        if state.token is not None and self.headers.get("Authorization") != f"Bearer {state.token}":
            self._simple(record, 401, b"missing or wrong read token")
            return
        parts = self.path.split("/")
        body: bytes | None = None
        if self.path.startswith("/v1/blobs/") and len(parts) == 4:
            self._blob(record, parts[3])
            return
        if len(parts) == 7 and parts[:3] == ["", "v1", "models"] and parts[4] == "versions":
            if parts[6] == "manifest" and parts[5].isdigit():
                body = state.manifests.get((parts[3], int(parts[5])))
        elif len(parts) == 5 and parts[:3] == ["", "v1", "models"] and parts[4] == "manifest":
            body = state.latest.get(parts[3])
        elif len(parts) == 6 and parts[:3] == ["", "v1", "devices"] and parts[4] == "assignments":
            body = state.assignments.get((parts[3], parts[5]))
        if body is None:
            self._simple(record, 404, b"not found")
        else:
            self._simple(record, 200, body, "application/json")

    def _simple(
        self, record: RequestRecord, status: int, body: bytes, ctype: str = "text/plain"
    ) -> None:
        record.status = status
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        record.sent = len(body)

    def _blob(self, record: RequestRecord, digest: str) -> None:
        state = self.server.state
        real = state.blobs.get(digest)
        if real is None:
            self._simple(record, 404, b"no such blob")
            return
        fault = state.faults.get(digest) or BlobFault()
        with state.lock:
            first = sum(1 for r in state.requests if r.path == self.path) == 1
        body, etag = real, f'"{digest}"'
        if fault.first_body is not None and first:
            body, etag = fault.first_body, '"stale"'
        start, status = 0, 200
        match = _RANGE.fullmatch(record.range or "")
        if match is not None and (
            record.if_range is None or record.if_range == etag or fault.ignore_if_range
        ):
            start, status = int(match.group(1)), 206
            if start >= len(body):
                self._simple(record, 416, b"range not satisfiable")
                return
        record.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Cache-Control", "public, max-age=31536000, immutable")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        if not fault.endless:
            self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        if fault.drop_after is not None and first:
            payload = payload[: fault.drop_after]
        try:
            self.wfile.write(payload)
            record.sent += len(payload)
            if fault.endless:
                junk = b"\0" * 65536
                while record.sent < _ENDLESS_CAP:
                    self.wfile.write(junk)
                    record.sent += len(junk)
            self.wfile.flush()
        except OSError:  # the client hung up, as it should on an endless body
            self.close_connection = True
            return
        if fault.drop_after is not None and first:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class LoopbackCdn:
    """The CDN on 127.0.0.1:<free port>; ``close()`` stops it."""

    def __init__(self, *, token: str | None = None) -> None:
        self.state = _State(token=token)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    # -- content -------------------------------------------------------------------------

    def put_manifest(
        self, name: str, version: int, document: bytes, *, latest: bool = True
    ) -> None:
        self.state.manifests[(name, version)] = document
        if latest:
            self.state.latest[name] = document

    def put_blob(self, digest: str, data: bytes) -> None:
        self.state.blobs[digest] = data

    def put_assignment(self, device: str, model: str, document: bytes) -> None:
        self.state.assignments[(device, model)] = document

    def fault(self, digest: str, fault: BlobFault) -> None:
        self.state.faults[digest] = fault

    @property
    def requests(self) -> list[RequestRecord]:
        with self.state.lock:
            return list(self.state.requests)

    def blob_requests(self, digest: str) -> list[RequestRecord]:
        return [r for r in self.requests if r.path == f"/v1/blobs/{digest}"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
