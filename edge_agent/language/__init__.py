"""Text generation on the device: ONNX Runtime GenAI or LiteRT-LM, streams, conversations.

``EdgeAgent.generate`` / ``chat`` (and their ``AsyncEdgeAgent`` twins) are
built from this package: ``LanguageRuntime`` (the model), ``TextStream``
(one turn's chunks and final ``GenerationRecord``), ``Conversation`` (a
dialogue that keeps its KV cache), ``Sampling``, and the presets with the
heavy rule (``_presets``, pure); the hub's side of a turn over MQTT
(``_cloud``: ``TextLink``, ``CloudLeg``, ``CloudTextSettings``) with its
reorder buffer (``_reorder``, pure); handing a turn to the hub mid-turn
(``HandoffPolicy``, ``_handoff``, over the window scores of ``_confidence``,
both pure); speculative decoding across the link (``SpecStream``,
``_speculative``, over ``_spec_link`` and ``_spec_sampling``; ``SpecStats``
on its record) and its draft length (``DraftLength``, ``best_k``,
``crossover``, ``_draft_length``, pure). Importing it does not import
``onnxruntime_genai``; loading a model does. ``load_language_runtime`` picks
the runtime by the folder's contents: a ``.litertlm`` file runs on LiteRT-LM
(``LiteRTLanguageRuntime``, ``_litert_runtime``, which imports ``litert_lm``
when it loads), anything else on ONNX Runtime GenAI.
"""

from ._chat import Conversation, render_turn
from ._cloud import CloudTextSettings
from ._confidence import (
    ScoreWindow,
    StepScore,
    WindowStats,
    step_score,
    uncertainty,
    window_stats,
)
from ._draft_length import DraftLength, best_k, crossover, expected_tokens, round_seconds
from ._handoff import HandoffPolicy, TurnWatch, turn_peak
from ._litert_runtime import LiteRTLanguageRuntime
from ._loader import load_language_runtime
from ._presets import DeviceRates, Preset, TextRoute, is_heavy, predicted_ms, route_text
from ._runtime import LanguageRuntime
from ._spec_stats import SpecStats
from ._speculative import DraftControl, SpecStream
from ._stream import (
    AsyncTextStream,
    FinishReason,
    GenerationRecord,
    Sampling,
    TextChunk,
    TextStream,
)

__all__ = [
    "AsyncTextStream",
    "CloudTextSettings",
    "Conversation",
    "DeviceRates",
    "DraftControl",
    "DraftLength",
    "FinishReason",
    "GenerationRecord",
    "HandoffPolicy",
    "LanguageRuntime",
    "LiteRTLanguageRuntime",
    "Preset",
    "Sampling",
    "ScoreWindow",
    "SpecStats",
    "SpecStream",
    "StepScore",
    "TextChunk",
    "TextRoute",
    "TextStream",
    "TurnWatch",
    "WindowStats",
    "best_k",
    "crossover",
    "expected_tokens",
    "is_heavy",
    "load_language_runtime",
    "predicted_ms",
    "render_turn",
    "round_seconds",
    "route_text",
    "step_score",
    "turn_peak",
    "uncertainty",
    "window_stats",
]
