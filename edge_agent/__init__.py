"""Tandem's on-device SDK: run a small model locally, offload what it should not answer.

Typical use::

    from edge_agent import EdgeAgent, OffloadPolicy

    policy = OffloadPolicy.budget(0.15, score="margin")   # offload ~15% least sure
    with EdgeAgent("mnist-int8.onnx", device_id="cam-7", broker="mqtt://hub.local",
                   cloud_model="mnist", policy=policy) as agent:
        agent.calibrate(held_out_images)
        result = agent.infer(image, deadline_ms=50)
        result.source, result.output, result.latency

A device holds one MQTT connection (``DeviceLink``, client id = device id):
the agent's uplink makes it, and a ``ModelUpdater`` and a
``TelemetryReporter`` of the same agent use it too.
``share_answers=ExampleSharing(sample_rate=0.05)`` (opt-in) lets the hub keep
the offloaded requests the device got wrong as training examples.

Text generation on the device: ``EdgeAgent(None, device_id=..., language_model=DIR)``
(an ONNX Runtime GenAI model folder; ``tandem[llm]``), then ``agent.generate(prompt,
max_tokens=64)`` streams ``TextChunk``s and ``agent.chat(messages, conversation=...)``
keeps a dialogue's KV cache (``edge_agent.language``). With ``broker=`` and
``cloud_language_model=`` the presets ``prefer_cloud``, ``cloud_only`` and a heavy
``prefer_edge`` turn stream the hub's text over MQTT, and the device finishes a turn
whose hub fails mid-stream (``CloudTextSettings``).

``tracing=shared.TracingSettings(endpoint=...)`` (or the standard ``OTEL_*``
variables) exports OpenTelemetry spans of every call over OTLP/HTTP, and an
offloaded request's trace continues through the hub (docs/tracing.md; needs
``tandem[otel]``; without it, or off, nothing of OpenTelemetry is imported).

Never imports torch, fastapi or the hub/CDN packages: a device installs ``tandem[edge]``.
"""

from ._agent import AgentStats, AsyncEdgeAgent, BaseAgent, EdgeAgent
from ._breaker import BreakerState, CircuitBreaker
from ._device_link import DeviceLink
from ._errors import (
    DowngradeError,
    DownloadError,
    EdgeError,
    InferenceError,
    IntegrityError,
    InvalidInputError,
    ModelLoadError,
    NoAnswerError,
    RouterLoadError,
    RuntimeUnavailableError,
    SmokeTestError,
    StoreError,
    TextOffloadUnavailableError,
    UntrustedUpdateError,
    UpdateError,
    UplinkError,
)
from ._estimator import Ewma, LatencyEstimator, NetworkEstimator
from ._learned import InputFeatures, LearnedScore, output_features
from ._outcome import FallbackReason
from ._policy import Decision, HeavyCheck, OffloadPolicy, RequestFacts, Route, UncertainCheck
from ._report import AgentMetrics, TelemetryReporter
from ._result import InferenceResult, LatencyBreakdown, Source
from ._scores import SCORES, entropy, margin, max_probability, to_probabilities
from ._sharing import ExampleSharing
from ._telemetry import AgentSnapshot, LatencyWindow, ModelCounters, TelemetryRecorder
from ._uplink import MqttUplink, UplinkStats
from .language import (
    AsyncTextStream,
    CloudTextSettings,
    Conversation,
    FinishReason,
    GenerationRecord,
    HandoffPolicy,
    LanguageRuntime,
    LiteRTLanguageRuntime,
    Sampling,
    TextChunk,
    TextStream,
    load_language_runtime,
)
from .runtimes import ModelRuntime, TensorSpec, load_runtime
from .updater import DeviceModelStore, DownloadSettings, ModelUpdater, UpdaterStats

__all__ = [
    "SCORES",
    "AgentMetrics",
    "AgentSnapshot",
    "AgentStats",
    "AsyncEdgeAgent",
    "AsyncTextStream",
    "BaseAgent",
    "BreakerState",
    "CircuitBreaker",
    "CloudTextSettings",
    "Conversation",
    "Decision",
    "DeviceLink",
    "DeviceModelStore",
    "DowngradeError",
    "DownloadError",
    "DownloadSettings",
    "EdgeAgent",
    "EdgeError",
    "Ewma",
    "ExampleSharing",
    "FallbackReason",
    "FinishReason",
    "GenerationRecord",
    "HandoffPolicy",
    "HeavyCheck",
    "InferenceError",
    "InferenceResult",
    "InputFeatures",
    "IntegrityError",
    "InvalidInputError",
    "LanguageRuntime",
    "LatencyBreakdown",
    "LatencyEstimator",
    "LatencyWindow",
    "LearnedScore",
    "LiteRTLanguageRuntime",
    "ModelCounters",
    "ModelLoadError",
    "ModelRuntime",
    "ModelUpdater",
    "MqttUplink",
    "NetworkEstimator",
    "NoAnswerError",
    "OffloadPolicy",
    "RequestFacts",
    "Route",
    "RouterLoadError",
    "RuntimeUnavailableError",
    "Sampling",
    "SmokeTestError",
    "Source",
    "StoreError",
    "TelemetryRecorder",
    "TelemetryReporter",
    "TensorSpec",
    "TextChunk",
    "TextOffloadUnavailableError",
    "TextStream",
    "UncertainCheck",
    "UntrustedUpdateError",
    "UpdateError",
    "UpdaterStats",
    "UplinkError",
    "UplinkStats",
    "entropy",
    "load_language_runtime",
    "load_runtime",
    "margin",
    "max_probability",
    "output_features",
    "to_probabilities",
]
