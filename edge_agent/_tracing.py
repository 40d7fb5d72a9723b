"""OpenTelemetry spans of the agent's calls, exported over OTLP/HTTP when tracing is on.

``open_tracer`` returns an ``EdgeTracer`` when tracing is configured (an
explicit ``shared.TracingSettings``, ``True``, or the standard environment
variables: ``TracingSettings.from_env``) and the ``opentelemetry`` packages
are installed (``tandem[otel]``); else ``None``, and the agent's calls do
nothing for tracing beyond one ``is None`` check: OpenTelemetry is imported
here only when a tracer is opened, so a device without it, or with tracing
off, loads none of it.

Each agent has its own ``TracerProvider`` (a ``BatchSpanProcessor`` in front
of the OTLP/HTTP exporter, so a call never waits on an export), shut down,
and so flushed, by ``close``. The spans of one call, all with the attribute
``tandem.request_id``::

    tandem.infer            the call (parent: the caller's current span, if any)
      tandem.decision       the route before the local run; again after it (uncertain?);
                            attributes tandem.route, tandem.decision, tandem.score
      tandem.local_run      the edge model
      tandem.send           encoding and publishing the request (its traceparent goes
                            in the frame header: the hub's spans are its children)
      tandem.wait           waiting for the hub's reply
      tandem.local_run      the fallback's run, when the cloud failed first

A call the sampler leaves out (``TracingSettings.sample_ratio`` or
``OTEL_TRACES_SAMPLER``: a non-recording root)
builds no child spans, yet its request still carries the root's trace
context (sampled flag off), so the hub leaves it out too.

The root span's attributes say what the call became: ``tandem.model``,
``tandem.device``, ``tandem.route`` and ``tandem.decision`` (the route and
its reason), ``tandem.offloaded`` (routed to the cloud), ``tandem.source``
(edge, cloud, edge-fallback), ``tandem.fallback`` (why, for a fallback),
``tandem.deadline_met``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shared import TracingSettings, open_tracer_provider

if TYPE_CHECKING:
    from concurrent.futures import Future

    from shared import Message

    from ._policy import Decision
    from ._result import InferenceResult

__all__ = ["UNTRACED", "CallTrace", "EdgeTracer", "open_tracer", "step_of", "traced_send"]

log = logging.getLogger("tandem.edge.tracing")

_INSTRUMENTATION = "tandem.edge_agent"
_DEFAULT_SERVICE = "tandem-edge"


def open_tracer(
    tracing: TracingSettings | bool | None, device_id: str, model: str
) -> EdgeTracer | None:
    """The agent's tracer, or ``None`` when tracing is off or OpenTelemetry is missing.

    ``None``: the environment decides; ``False``: off; ``True``: on, with the
    environment's endpoint and service name (or their defaults).
    """
    provider = open_tracer_provider(
        tracing, {"tandem.device": device_id}, "the agent", default_service=_DEFAULT_SERVICE
    )
    if provider is None:
        return None
    return EdgeTracer(provider, device_id=device_id, model=model)


class EdgeTracer:
    """One agent's tracer: ``begin`` opens the spans of a call."""

    def __init__(self, provider: Any, *, device_id: str, model: str) -> None:
        from opentelemetry import trace

        self._provider = provider
        self._trace = trace
        self.tracer = provider.get_tracer(_INSTRUMENTATION)
        self.device_id = device_id
        self.model = model

    def begin(self) -> CallTrace:
        """Start a call's root span, a child of the caller's current span if there is one."""
        root = self.tracer.start_span(
            "tandem.infer",
            attributes={"tandem.device": self.device_id, "tandem.model": self.model},
        )
        return CallTrace(self, root, self._trace.set_span_in_context(root))

    def shutdown(self) -> None:
        """Export what is buffered, then stop (the agent's ``close``)."""
        try:
            self._provider.shutdown()
        except Exception:  # an exporter's failure must not fail close
            log.exception("tracing shutdown failed")


class CallTrace:
    """The spans of one call: its root and the steps under it."""

    __slots__ = ("context", "recording", "request_id", "root", "tracer")

    def __init__(self, tracer: EdgeTracer, root: Any, context: Any) -> None:
        self.tracer = tracer
        self.root = root
        self.context = context
        self.request_id = ""
        self.recording: bool = root.is_recording()  # False: sampled out, no child spans

    def named(self, request_id: str) -> None:
        """The call has its request id (``_begin`` made it)."""
        self.request_id = request_id
        self.root.set_attribute("tandem.request_id", request_id)

    def step(self, name: str) -> _Step | _Untraced:
        """A child span for ``with``: ended on exit, marked with the error type on one."""
        return _Step(self, name) if self.recording else UNTRACED

    def finish(self, result: InferenceResult, *, route: str, decision: str) -> None:
        """End the root span with what the call became."""
        root = self.root
        source = str(result.source)
        route = str(route)
        root.set_attributes(
            {
                "tandem.route": route,
                "tandem.decision": str(decision),
                "tandem.offloaded": route == "cloud",
                "tandem.source": source,
                "tandem.deadline_met": result.deadline_met,
            }
        )
        if source == "edge-fallback":
            root.set_attribute("tandem.fallback", str(result.reason))
        root.end()

    def failed(self, error: BaseException) -> None:
        """End the root span of a call that raised."""
        from opentelemetry.trace import Status, StatusCode

        self.root.set_attribute("error.type", type(error).__name__)
        self.root.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        self.root.end()


class _Step:
    """A child span of a call, as a context manager; ``traceparent`` names it on the wire."""

    __slots__ = ("_call", "_name", "span")

    def __init__(self, call: CallTrace, name: str) -> None:
        self._call = call
        self._name = name
        self.span: Any = None

    def __enter__(self) -> _Step:
        call = self._call
        self.span = call.tracer.tracer.start_span(
            self._name, context=call.context, attributes={"tandem.request_id": call.request_id}
        )
        return self

    def __exit__(self, kind: type[BaseException] | None, error: object, _tb: object) -> None:
        if kind is not None:
            self.span.set_attribute("error.type", kind.__name__)
        self.span.end()

    def traceparent(self) -> tuple[str, str | None]:
        """This span's W3C ``traceparent`` and ``tracestate`` (``None``: empty)."""
        return _context_header(self.span)

    def set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def decided(self, decision: Decision) -> None:
        """A decision span's outcome: the route, its reason, the score when there is one."""
        span = self.span
        span.set_attribute("tandem.route", str(decision.route))
        span.set_attribute("tandem.decision", str(decision.reason))
        if decision.score is not None:
            span.set_attribute("tandem.score", float(decision.score))


def _context_header(span: Any) -> tuple[str, str | None]:
    """``span``'s W3C ``traceparent`` and ``tracestate`` (``None``: empty)."""
    context = span.get_span_context()
    flags = int(context.trace_flags)
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    return parent, state or None


class _Untraced:
    """The step of a call that is not traced, or sampled out: nothing, one shared instance."""

    __slots__ = ()

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        return None

    def decided(self, decision: Decision) -> None:
        return None


UNTRACED = _Untraced()  # one instance for every call: no object per untraced step


def step_of(trace: CallTrace | None, name: str) -> _Step | _Untraced:
    """A span named ``name`` of a call for ``with``, or ``UNTRACED`` when it is not traced."""
    return UNTRACED if trace is None else trace.step(name)


def traced_send(
    trace: CallTrace, send: Callable[..., tuple[Future[Message], int]]
) -> Future[Message]:
    """Publish through ``send`` (``MqttUplink.send``) in a ``tandem.send`` span whose W3C
    context goes in the frame header: the hub's spans become this span's children.
    Sampled out: no span, and the root's context goes (the hub then samples it out too)."""
    if not trace.recording:
        traceparent, tracestate = _context_header(trace.root)
        return send(traceparent=traceparent, tracestate=tracestate)[0]
    with _Step(trace, "tandem.send") as step:
        traceparent, tracestate = step.traceparent()
        future, sent_bytes = send(traceparent=traceparent, tracestate=tracestate)
        step.set("tandem.request_bytes", sent_bytes)
    return future
