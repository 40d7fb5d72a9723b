"""``GET /healthz`` (always 200 while serving) and ``GET /metrics`` (Prometheus), both open.

``/metrics`` answers 404 where prometheus-client is not installed; see
``model_cdn._metrics`` for what it holds.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import Response

from ._errors import HttpError

if TYPE_CHECKING:
    from .._metrics import CdnMetrics
    from ..rollout._controller import RolloutController

__all__ = ["add_health_routes", "new_metrics"]

logger = logging.getLogger("model_cdn.http")


def new_metrics(controller: RolloutController | None) -> CdnMetrics | None:
    """The app's own metrics, or None where prometheus-client is not installed."""
    try:
        from .._metrics import CdnMetrics
    except ImportError:
        logger.info("prometheus-client is not installed: GET /metrics is off")
        return None
    metrics = CdnMetrics()
    if controller is not None:
        metrics.watch_rollouts(controller)
    return metrics


def add_health_routes(app: FastAPI, metrics: CdnMetrics | None) -> None:
    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        if metrics is None:
            raise HttpError(404, "metrics need prometheus-client installed")
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}
