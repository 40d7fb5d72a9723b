"""A real OTLP/HTTP trace receiver on loopback, for the tracing tests.

No OpenTelemetry Collector binary can run here (none is installed, none is
installable offline), so this stands in for one: an HTTP server that accepts
``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (what the
SDK's OTLP/HTTP exporter sends, over real HTTP), decodes it with
``opentelemetry-proto`` and keeps every span, as the Collector's OTLP
receiver would. Anything else is answered 404 or 400.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "ReceivedSpan"]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # lower hex, as W3C trace context writes it
    span_id: str
    parent_span_id: str  # "" for a root
    service: str
    start_ns: int
    end_ns: int
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


class OtlpReceiver:
    """Collects the spans posted to ``url``; ``wait_for`` waits on a condition."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.posts = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(400, "protobuf only")
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            service=str(resource.get("service.name", "")),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._changed:
            self.posts += 1
            self.spans.extend(got)
            self._changed.notify_all()

    def wait_for(self, condition: Any, timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """The spans once ``condition(spans)`` holds; ``AssertionError`` after ``timeout_s``."""
        with self._changed:
            if not self._changed.wait_for(lambda: condition(list(self.spans)), timeout_s):
                names = sorted(s.name for s in self.spans)
                raise AssertionError(f"spans never met the condition; got {names}")
            return list(self.spans)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._changed:
            return [s for s in self.spans if s.name == name]
