"""W3C trace context as the wire carries it, and where traces go: no OpenTelemetry here.

A request may carry the trace it belongs to: the frame header's ``traceparent``
and ``tracestate`` fields (``shared._envelope``) and the HTTP headers of the
same names. Both are strings in the W3C Trace Context format
(https://www.w3.org/TR/trace-context/); ``parse_traceparent`` and
``parse_tracestate`` accept only what that format allows (version ``00``, lower
hex, no all-zero trace or span id; at most 32 list members of the key and value
grammar, 512 characters) and return ``None`` for anything else, so a bad value
is dropped, never the request that carried it.

``TracingSettings`` says where spans are exported (OTLP over HTTP), read by the
edge agent and by the hub, each of which imports OpenTelemetry only when
tracing is on (``edge_agent._tracing``, ``cloud_hub._tracing``). Without
explicit settings, tracing follows the standard environment variables
(``from_env``): on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set or ``OTEL_TRACES_EXPORTER`` is
``otlp``; off when ``OTEL_TRACES_EXPORTER`` is ``none`` or ``OTEL_SDK_DISABLED``
is ``true``, and off when none of them is set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ._errors import ConfigError

__all__ = [
    "TRACEPARENT_HEADER",
    "TRACESTATE_HEADER",
    "TracingSettings",
    "parse_traceparent",
    "parse_tracestate",
]

TRACEPARENT_HEADER = "traceparent"  # the frame header field and the HTTP header
TRACESTATE_HEADER = "tracestate"

_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_KEY = r"(?:[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}|[a-z][_0-9a-z\-*/]{0,255})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(f"{_KEY}={_VALUE}")
_MAX_TRACESTATE = 512
_MAX_MEMBERS = 32
_DEFAULT_ENDPOINT = "http://localhost:4318"


def parse_traceparent(value: object) -> str | None:
    """``value`` when it is a valid version-00 ``traceparent``, else ``None``."""
    if isinstance(value, str) and len(value) == 55 and _TRACEPARENT.fullmatch(value):
        return value
    return None


def parse_tracestate(value: object) -> str | None:
    """``value`` when it is a valid ``tracestate`` list, else ``None`` (an empty one too)."""
    if not isinstance(value, str) or not value or len(value) > _MAX_TRACESTATE:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]  # the grammar allows empty list members
    if not members or len(members) > _MAX_MEMBERS:
        return None
    if not all(_MEMBER.fullmatch(m) for m in members):
        return None
    return value


@dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """Where spans go: an OTLP/HTTP receiver (a Collector, Jaeger, Tempo...).

    ``endpoint``: the receiver's base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT``
    takes it (``/v1/traces`` is appended; a URL that already ends in
    ``/v1/traces`` is used as it is); ``None``: the environment's, else
    ``http://localhost:4318``. ``service_name``: ``None``: ``OTEL_SERVICE_NAME``,
    else the side's default (``tandem-edge``, ``tandem-hub``).
    ``export_timeout_s``: how long one export may take, retries included, before
    its spans are dropped; it also bounds how long closing waits on an
    unreachable receiver. ``sample_ratio``: the share of traces recorded, as
    ``parentbased_traceidratio`` (a request whose device recorded it is recorded
    by the hub too); ``None``: ``OTEL_TRACES_SAMPLER``, else every trace.
    A setting that cannot work raises ``ConfigError``.
    """

    endpoint: str | None = None
    service_name: str | None = None
    export_timeout_s: float = 10.0
    sample_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.endpoint is not None and not re.match(r"https?://[^/\s]+", self.endpoint):
            raise ConfigError(f"endpoint must be an http(s) URL, got {self.endpoint!r:.80}")
        if not self.export_timeout_s > 0:
            raise ConfigError("export_timeout_s must be positive")
        if self.sample_ratio is not None and not 0.0 <= self.sample_ratio <= 1.0:
            raise ConfigError(f"sample_ratio must be from 0 to 1, got {self.sample_ratio!r}")

    @classmethod
    def resolve(cls, tracing: TracingSettings | bool | None) -> TracingSettings | None:
        """What a ``tracing=`` option means: ``None``: the environment decides
        (``from_env``); ``False``: off (``None``); ``True``: on, with the environment's
        endpoint and service name (or their defaults); settings: those."""
        if tracing is None:
            return cls.from_env()
        if tracing is True:
            return cls()
        if tracing is False:
            return None
        return tracing

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TracingSettings | None:
        """Settings from the standard OpenTelemetry variables, or ``None``: tracing off."""
        env = os.environ if environ is None else environ
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporter == "none":
            return None
        asked = any(
            env.get(name, "").strip()
            for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        if not asked and "otlp" not in exporter.split(","):
            return None
        return cls()

    def traces_url(self, environ: Mapping[str, str] | None = None) -> str:
        """The URL spans are posted to."""
        env = os.environ if environ is None else environ
        if self.endpoint is None:
            traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
            if traces:
                return traces  # the signal's own variable is the full URL
        base = (
            self.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or _DEFAULT_ENDPOINT
        )
        if base.rstrip("/").endswith("/v1/traces"):
            return base
        return base.rstrip("/") + "/v1/traces"

    def service(self, default: str, environ: Mapping[str, str] | None = None) -> str:
        """The ``service.name`` the spans carry."""
        env = os.environ if environ is None else environ
        return self.service_name or env.get("OTEL_SERVICE_NAME", "").strip() or default
