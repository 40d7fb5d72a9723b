"""Text generation on the device: ONNX Runtime GenAI or LiteRT-LM, streams, conversations.

``EdgeAgent.generate`` / ``chat`` (and their ``AsyncEdgeAgent`` twins) are
built from this package: ``LanguageRuntime`` (the model), ``TextStream``
(one turn's chunks and final ``GenerationRecord``), ``Conversation`` (a
dialogue that keeps its KV cache), ``Sampling``, and the presets with the
heavy rule (``_presets``, pure); the hub's side of a turn over MQTT
(``_cloud``: ``TextLink``, ``CloudLeg``, ``CloudTextSettings``) with its
reorder buffer (``_reorder``, pure); handing a turn to the hub mid-turn
(``HandoffPolicy``, ``_handoff``, over the window scores of ``_confidence``,
both pure), before the first token on the prompt's score (``_prompt_score``),
under a budget of turns or tokens (``_text_budget``, pure); speculative
decoding across the link (``SpecStream``, ``_speculative``, over ``_spec_link``
and ``_spec_sampling``; ``SpecStats`` on its record) and its draft length
(``DraftLength``, ``best_k``, ``crossover``, ``_draft_length``, pure).
Importing it does not import
``onnxruntime_genai``; loading a model does. ``load_language_runtime`` picks
the runtime by the folder's contents: a ``.litertlm`` file runs on LiteRT-LM
(``LiteRTLanguageRuntime``, ``_litert_runtime``, which imports ``litert_lm``
when it loads), anything else on ONNX Runtime GenAI.
"""

from ._chat import Conversation, render_turn
from ._cloud import CloudTextSettings
from ._confidence import (
    WINDOW_SCORES,
    ScoreWindow,
    StepScore,
    WindowStats,
    step_score,
    uncertainty,
    window_stats,
)
from ._draft_length import DraftLength, best_k, crossover, expected_tokens, round_seconds
from ._generation import FinishReason, GenerationRecord, Sampling, TextChunk
from ._handoff import HandoffPolicy, TurnWatch, replay, turn_peak
from ._litert_runtime import LiteRTLanguageRuntime
from ._loader import load_language_runtime
from ._presets import DeviceRates, Preset, TextRoute, is_heavy, predicted_ms, route_text
from ._prompt_router import PromptRouter
from ._prompt_score import PROMPT_FEATURES, PromptScore, prompt_score
from ._runtime import LanguageRuntime
from ._spec_stats import SpecStats
from ._speculative import DraftControl, SpecStream
from ._stream import AsyncTextStream, TextStream
from ._text_budget import (
    UNITS,
    Thresholds,
    TurnTrace,
    calibrate_thresholds,
    handoff_position,
    hub_share,
    hub_units,
)

__all__ = [
    "PROMPT_FEATURES",
    "UNITS",
    "WINDOW_SCORES",
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
    "PromptRouter",
    "PromptScore",
    "Sampling",
    "ScoreWindow",
    "SpecStats",
    "SpecStream",
    "StepScore",
    "TextChunk",
    "TextRoute",
    "TextStream",
    "Thresholds",
    "TurnTrace",
    "TurnWatch",
    "WindowStats",
    "best_k",
    "calibrate_thresholds",
    "crossover",
    "expected_tokens",
    "handoff_position",
    "hub_share",
    "hub_units",
    "is_heavy",
    "load_language_runtime",
    "predicted_ms",
    "prompt_score",
    "render_turn",
    "replay",
    "round_seconds",
    "route_text",
    "step_score",
    "turn_peak",
    "uncertainty",
    "window_stats",
]
