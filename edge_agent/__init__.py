"""Tandem's on-device SDK: run a small model locally, offload what it should not answer.

Typical use::

    from edge_agent import EdgeAgent, OffloadPolicy

    policy = OffloadPolicy.budget(0.15, score="margin")   # offload ~15% least sure
    with EdgeAgent("mnist-int8.onnx", device_id="cam-7", broker="mqtt://hub.local",
                   cloud_model="mnist", policy=policy) as agent:
        agent.calibrate(held_out_images)
        result = agent.infer(image, deadline_ms=50)
        result.source, result.output, result.latency

Never imports torch, fastapi or the hub/CDN packages: a device installs ``tandem[edge]``.
"""

from ._agent import AgentStats, AsyncEdgeAgent, BaseAgent, EdgeAgent
from ._breaker import BreakerState, CircuitBreaker
from ._errors import (
    EdgeError,
    InferenceError,
    InvalidInputError,
    ModelLoadError,
    NoAnswerError,
    RuntimeUnavailableError,
    UplinkError,
)
from ._estimator import Ewma, LatencyEstimator, NetworkEstimator
from ._policy import Decision, HeavyCheck, OffloadPolicy, RequestFacts, Route, UncertainCheck
from ._result import InferenceResult, LatencyBreakdown, Source
from ._scores import SCORES, entropy, margin, max_probability, to_probabilities
from ._uplink import MqttUplink, UplinkStats
from .runtimes import ModelRuntime, TensorSpec, load_runtime

__all__ = [
    "SCORES",
    "AgentStats",
    "AsyncEdgeAgent",
    "BaseAgent",
    "BreakerState",
    "CircuitBreaker",
    "Decision",
    "EdgeAgent",
    "EdgeError",
    "Ewma",
    "HeavyCheck",
    "InferenceError",
    "InferenceResult",
    "InvalidInputError",
    "LatencyBreakdown",
    "LatencyEstimator",
    "ModelLoadError",
    "ModelRuntime",
    "MqttUplink",
    "NetworkEstimator",
    "NoAnswerError",
    "OffloadPolicy",
    "RequestFacts",
    "Route",
    "RuntimeUnavailableError",
    "Source",
    "TensorSpec",
    "UncertainCheck",
    "UplinkError",
    "UplinkStats",
    "entropy",
    "load_runtime",
    "margin",
    "max_probability",
    "to_probabilities",
]
