"""OpenTelemetry spans of the requests the hub answers, exported over OTLP/HTTP when on.

``open_hub_tracer`` returns a ``HubTracer`` when tracing is configured (an
explicit ``shared.TracingSettings``, ``True``, or the standard environment
variables: ``TracingSettings.from_env``) and the ``opentelemetry`` packages
are installed (``tandem[otel]``); else ``None``, and the transports skip
tracing with one ``is None`` check. OpenTelemetry is imported only here, and
only when a tracer is opened.

Spans are built once the reply is out, in the ingress process (the MQTT
front, the HTTP app), from times it took and the timings the reply carries
(``HubResult.queue_ms`` / ``compute_ms``, measured where the batch ran, in
this process or in an executor process): nothing is exported from the
executors, and nothing is added to a request's path but two clock reads.
One request's spans, all with ``tandem.request_id`` (when the request has
an id)::

    tandem.hub.ingress   receipt to reply sent; the child of the device's span when the
                         request carried W3C trace context (the frame's ``traceparent``,
                         or the HTTP header), else a root
      tandem.hub.batch   submit to result, with tandem.batch_rows / tandem.batch_requests
        tandem.hub.queue     waiting for its batch
        tandem.hub.compute   its batch's compute
      tandem.hub.reply   encoding and sending the reply

Queue and compute are placed back from the moment the result came (the
reply's timings are durations, measured on the executor's side of a ring):
compute ends then, the queue before it, neither starting before submit. A
request refused before it reached a batch has no batch span; its ingress
span has ``tandem.error`` (the wire code) and an error status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared import (
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    ErrorCode,
    TracingSettings,
    open_tracer_provider,
    parse_traceparent,
    parse_tracestate,
)

from ._results import HubResult

__all__ = ["HubTracer", "RequestTimes", "TracedRequest", "open_hub_tracer"]

log = logging.getLogger(__name__)

_INSTRUMENTATION = "tandem.cloud_hub"
_DEFAULT_SERVICE = "tandem-hub"


def open_hub_tracer(
    tracing: TracingSettings | bool | None, resource: Mapping[str, str] | None = None
) -> HubTracer | None:
    """The hub's tracer, or ``None`` when tracing is off or OpenTelemetry is missing.

    ``None``: the environment decides; ``False``: off; ``True``: on, with the
    environment's endpoint and service name (or their defaults). ``resource``:
    more attributes of the process (a plane's ingress names itself).
    """
    provider = open_tracer_provider(
        tracing, dict(resource or {}), "the hub", default_service=_DEFAULT_SERVICE
    )
    if provider is None:
        return None
    return HubTracer(provider)


@dataclass(frozen=True, kw_only=True)
class RequestTimes:
    """When one request passed each point in the ingress (``time.monotonic()`` seconds)."""

    received: float  # the frame or the body came in
    submitted: float | None  # handed to the dispatcher (None: refused before)
    answered: float  # the outcome was there: the reply starts being built
    sent: float  # the reply was handed to the transport


@dataclass(frozen=True, kw_only=True)
class TracedRequest:
    """What the spans of one request say about it."""

    transport: str  # "mqtt" | "http"
    request_id: str | None
    model: str
    version: str | None
    device: str | None = None
    traceparent: str | None = None  # validated W3C trace context (``shared.parse_*``)
    tracestate: str | None = None

    @classmethod
    def http(
        cls,
        headers: Mapping[str, str],
        model: str,
        version: str | None,
        request_id: str | None,
    ) -> TracedRequest:
        """An HTTP infer request, in the trace its ``traceparent`` header names (if valid)."""
        traceparent = parse_traceparent(headers.get(TRACEPARENT_HEADER))
        tracestate = None
        if traceparent is not None:
            tracestate = parse_tracestate(headers.get(TRACESTATE_HEADER))
        return cls(
            transport="http",
            request_id=request_id,
            model=model,
            version=version,
            traceparent=traceparent,
            tracestate=tracestate,
        )


class HubTracer:
    """Builds each answered request's spans after the fact, with explicit times."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = provider
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self.tracer = provider.get_tracer(_INSTRUMENTATION)

    def record(
        self,
        request: TracedRequest,
        times: RequestTimes,
        *,
        error: ErrorCode,
        result: HubResult | None,
    ) -> None:
        """Emit the spans of one answered request; never raises (it runs in reply paths)."""
        try:
            self._record(request, times, error, result)
        except Exception:
            log.exception("could not build the spans of request %s", request.request_id)

    def _record(
        self,
        request: TracedRequest,
        times: RequestTimes,
        error: ErrorCode,
        result: HubResult | None,
    ) -> None:
        trace = self._trace
        offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock, for OTLP

        def ns(t: float) -> int:
            return int(t * 1e9) + offset_ns

        carrier = {"traceparent": request.traceparent or ""}
        if request.tracestate:
            carrier["tracestate"] = request.tracestate
        parent = self._propagator.extract(carrier) if request.traceparent else None
        common: dict[str, Any] = {"tandem.model": request.model}
        if request.request_id:
            common["tandem.request_id"] = request.request_id
        attributes = dict(common, **{"tandem.transport": request.transport})
        attributes["tandem.error"] = error.value
        if request.version:
            attributes["tandem.model_version"] = request.version
        if request.device:
            attributes["tandem.device"] = request.device
        kind = trace.SpanKind.SERVER if request.transport == "http" else trace.SpanKind.CONSUMER
        tracer = self.tracer
        ingress = tracer.start_span(
            "tandem.hub.ingress",
            context=parent,
            kind=kind,
            attributes=attributes,
            start_time=ns(times.received),
        )
        inside = trace.set_span_in_context(ingress)
        if times.submitted is not None:
            self._batch(inside, common, times, result, ns)
        reply = tracer.start_span(
            "tandem.hub.reply", context=inside, attributes=common, start_time=ns(times.answered)
        )
        reply.end(end_time=ns(times.sent))
        if error is not ErrorCode.OK:
            ingress.set_status(trace.Status(trace.StatusCode.ERROR, error.value))
        ingress.end(end_time=ns(times.sent))

    def _batch(
        self,
        inside: Any,
        common: dict[str, Any],
        times: RequestTimes,
        result: HubResult | None,
        ns: Any,
    ) -> None:
        assert times.submitted is not None
        tracer = self.tracer
        attributes = dict(common)
        if result is not None:
            attributes["tandem.batch_rows"] = result.batch_rows
            attributes["tandem.batch_requests"] = result.batch_requests
            attributes["tandem.model_version"] = result.model_version
        batch = tracer.start_span(
            "tandem.hub.batch",
            context=inside,
            attributes=attributes,
            start_time=ns(times.submitted),
        )
        if result is not None:
            within = self._trace.set_span_in_context(batch)
            compute_start = max(times.submitted, times.answered - result.compute_ms / 1000.0)
            queue_start = max(times.submitted, compute_start - result.queue_ms / 1000.0)
            queue = tracer.start_span(
                "tandem.hub.queue", context=within, attributes=common, start_time=ns(queue_start)
            )
            queue.end(end_time=ns(compute_start))
            compute = tracer.start_span(
                "tandem.hub.compute",
                context=within,
                attributes=common,
                start_time=ns(compute_start),
            )
            compute.end(end_time=ns(times.answered))
        batch.end(end_time=ns(times.answered))

    def flush(self, timeout_s: float = 5.0) -> None:
        self._provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is buffered, then stop (the hub's ``stop``)."""
        try:
            self._provider.shutdown()
        except Exception:  # an exporter's failure must not fail a stop
            log.exception("tracing shutdown failed")
