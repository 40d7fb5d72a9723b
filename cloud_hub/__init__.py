"""Tandem's cloud hub: serves offloaded inference requests from MQTT on a GPU, batched.

Two planes over the same parts. ``tandem hub`` (and ``python -m cloud_hub``) runs
the process plane, ``cloud_hub.plane``: a supervisor, MQTT and HTTP ingress
processes and one executor process per model instance, joined by shared-memory
rings; that is the production hub. ``Hub`` is the embedded plane: everything in
one process, for the library, the demo and tests.

Quick start (embedded)::

    from cloud_hub import Hub
    from shared import MqttSettings

    with Hub("models/", mqtt=MqttSettings.from_url("mqtt://127.0.0.1:1883")) as hub:
        hub.run_forever()  # or: python -m cloud_hub --repo models/

The pieces: ``ModelRepository`` (Triton-like directories, see ``ModelConfig``)
→ executors (``OnnxExecutor``, ``TorchExecutor``, ``CallableExecutor``)
→ ``DynamicBatcher`` (one per model) ← ``MqttFront`` (requests in, replies
out, over a ``shared.MqttSession``), all owned by ``Hub``, whose
``HubMetrics`` (``hub.prometheus``) keeps its Prometheus registry.
A model whose config has ``collection`` (``CollectionConfig``) keeps the
offloaded requests its devices got wrong as training examples.
``cloud_hub.http`` serves the same hub over HTTP (the Open Inference
Protocol v2, and ``/metrics``); it is imported on first use, since it pulls
in FastAPI and uvicorn. Errors derive from ``HubError``; each carries the
wire ``ErrorCode`` a device receives. ``Hub(tracing=shared.TracingSettings(...))``
(or the standard ``OTEL_*`` variables, or ``tandem hub --otlp-endpoint``) exports
OpenTelemetry spans of every answered request, continuing the device's trace
(docs/tracing.md; needs ``tandem[otel]``).
"""

import importlib as _importlib

from ._errors import (
    BadRequestError,
    BrokerError,
    DeadlineExceededError,
    ExecutorError,
    ExecutorReplyError,
    HubError,
    HubStoppingError,
    InvalidRequestError,
    IpcClosedError,
    ModelConfigError,
    ModelNotFoundError,
    OverloadedError,
    RepositoryError,
    RequestTooLargeError,
    error_code,
)
from ._hub import Hub
from ._results import HubResult
from .batching._batcher import DynamicBatcher, ResultFuture
from .batching._stats import BatcherMetrics, BatcherStats
from .collect._config import CollectionConfig
from .executors import CallableExecutor, Executor, OnnxExecutor, TorchExecutor
from .metrics._prometheus import HubMetrics
from .mqtt._coalesce import Coalescing
from .mqtt._front import MqttFront
from .repository._config import ModelConfig, TensorSpec
from .repository._repository import ModelRepository, ServedModel

__all__ = [
    "BadRequestError",
    "BatcherMetrics",
    "BatcherStats",
    "BrokerError",
    "CallableExecutor",
    "Coalescing",
    "CollectionConfig",
    "DeadlineExceededError",
    "DynamicBatcher",
    "Executor",
    "ExecutorError",
    "ExecutorReplyError",
    "Hub",
    "HubError",
    "HubMetrics",
    "HubResult",
    "HubStoppingError",
    "InvalidRequestError",
    "IpcClosedError",
    "ModelConfig",
    "ModelConfigError",
    "ModelNotFoundError",
    "ModelRepository",
    "MqttFront",
    "OnnxExecutor",
    "OverloadedError",
    "RepositoryError",
    "RequestTooLargeError",
    "ResultFuture",
    "ServedModel",
    "TensorSpec",
    "TorchExecutor",
    "error_code",
    "http",
]


def __getattr__(name: str) -> object:
    if name == "http":  # the HTTP API, loaded when first used
        return _importlib.import_module(f"{__name__}.http")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
