"""The one interface every transport counts its answers through, and the one rule it counts by.

Two implementations, one per plane: ``HubMetrics`` (``_prometheus``) keeps an
in-process ``Hub``'s counters in a prometheus_client registry; ``BookRecorder``
(``_plane``) keeps one process's counters of a multi-process hub in its
shared-memory ``MetricsBook`` (``_book``), merged when ``/metrics`` is served.
The MQTT front and the HTTP and gRPC APIs call ``record`` and never know which.

What a request counts as is decided here once (``count_of``), so the two
planes cannot drift apart: the transport must be one of ``TRANSPORTS``; an
answer with outputs is a success under the result's model and version, with
its duration; an ``OK`` without a result is counted as ``INTERNAL``, since
nothing says it succeeded; a failure is labelled with the served model and
version, and a request for anything not served with ``UNSERVED`` (a label
set a client cannot grow). Each backend only increments what it is told.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

from shared import ErrorCode

if TYPE_CHECKING:
    from .._results import HubResult

__all__ = ["TRANSPORTS", "UNSERVED", "Counted", "RequestRecorder", "count_of", "served_labels"]

TRANSPORTS = ("http", "mqtt", "grpc")
UNSERVED = "_unserved"
"""The model or version label of a request for what is not served (never an empty label)."""


class RequestRecorder(Protocol):
    content_type: str  # of what ``render`` returns

    def record(
        self,
        transport: str,
        model: str,
        version: str | None,
        *,
        received: float,
        error: ErrorCode = ErrorCode.OK,
        result: HubResult | None = None,
    ) -> None:
        """Count one answered request (``count_of``). ``received``: ``time.monotonic()``
        at receipt.

        ``error`` is the code its reply carries (``OK``: answered with
        ``result``'s outputs). Thread-safe; called by the transports.
        """
        ...

    def render(self) -> bytes:
        """The Prometheus text exposition of everything counted."""
        ...


class Counted(NamedTuple):
    """What one answered request counts as (see the module docstring)."""

    labels: tuple[str, ...]  # model, version, transport; and the reason for a failure
    duration_us: float | None  # receipt to now for an answer with outputs; None: a failure


def count_of(
    transport: str,
    model: str,
    version: str | None,
    *,
    received: float,
    error: ErrorCode,
    result: HubResult | None,
    served: Callable[[], Mapping[str, str]],
) -> Counted:
    """How ``record(transport, model, version, ...)`` counts; ``served()`` gives
    {model: version} of what is served, asked for failures only (it may cost)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if error is ErrorCode.OK and result is not None:
        duration_us = 1e6 * (time.monotonic() - received)
        return Counted((result.model, result.model_version, transport), duration_us)
    if error is ErrorCode.OK:  # an answer without a result: nothing to say it succeeded
        error = ErrorCode.INTERNAL
    model_label, version_label = served_labels(served(), model, version)
    return Counted((model_label, version_label, transport, error.value), None)


def served_labels(served: Mapping[str, str], model: str, version: str | None) -> tuple[str, str]:
    """``(model, version)`` labels of a request, given ``served`` {model: version}."""
    if model not in served:
        return UNSERVED, UNSERVED
    if version is None or version == served[model]:
        return model, served[model]
    return model, UNSERVED
