"""The OpenTelemetry tracer provider the edge agent and the hub export spans through.

``open_tracer_provider(tracing, attributes, who)`` resolves the tracing option
(``TracingSettings.resolve``) and, when tracing is on, builds an SDK
``TracerProvider`` with a batch processor and the OTLP/HTTP exporter. It is the
one module of ``shared`` that imports OpenTelemetry, and only inside that call:
importing it costs nothing, and without tracing nothing of OpenTelemetry loads.
Where OpenTelemetry is not installed it logs one warning and returns ``None``:
the caller serves untraced.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ._trace_context import TracingSettings

__all__ = ["open_tracer_provider"]

log = logging.getLogger(__name__)


def open_tracer_provider(
    tracing: TracingSettings | bool | None,
    attributes: Mapping[str, str],
    who: str,
    *,
    default_service: str,
) -> Any | None:
    """A ``TracerProvider`` for ``tracing``, or ``None`` (off, or OpenTelemetry missing).

    ``attributes``: the resource's (``service.name`` defaults to ``default_service``
    unless the settings or ``OTEL_SERVICE_NAME`` name one); ``who``: "the agent",
    "the hub", for the warning.
    """
    settings = TracingSettings.resolve(tracing)
    if settings is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        log.warning(
            "tracing asked for but OpenTelemetry is not installed (pip install "
            "'tandem[otel]'): %s; %s runs without it",
            e,
            who,
        )
        return None
    sampler = None
    if settings.sample_ratio is not None:  # else the SDK's own: OTEL_TRACES_SAMPLER, or all
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
    resource = Resource.create({"service.name": settings.service(default_service), **attributes})
    provider = TracerProvider(resource=resource, sampler=sampler)
    exporter = OTLPSpanExporter(endpoint=settings.traces_url(), timeout=settings.export_timeout_s)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing: %s's spans go to %s", who, settings.traces_url())
    return provider
