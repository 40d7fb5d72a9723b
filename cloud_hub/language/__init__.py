"""Language models in the hub: ONNX Runtime GenAI's ``Engine`` with limits, per model.

``LanguageEngine`` hosts one model folder on one scheduling thread (continuous
batching, limits per turn, a bounded queue, cancellation that frees the slot
at once; a conversation's next turn continues its kept KV cache);
``VllmEngine`` serves the same contract from vLLM on a CUDA machine
(``"engine": "vllm"``; written against vLLM's documented API, not yet run
here); ``LanguageModels`` loads the repository's directories whose
``config.json`` says ``"platform": "onnxruntime_genai"``. ``cloud_hub.Hub``
serves them (``hub.language``), ``cloud_hub.plane`` in a language executor
process per model (``TurnEngine``: what both offer the fronts), and
``cloud_hub.http`` answers OpenAI's
``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` for them.
``Verifier`` checks a device's speculative drafts against a served model's
ONNX graph on plain ONNX Runtime (``VerifyModel``; sessions bounded by
``SessionLimits``), for ``cloud_hub.mqtt``'s ``SpecFront``.
``accept_drafts`` is speculative decoding's verification rule (greedy, or
rejection sampling over ``target_probs``), pure.
"""

from ._accept import Acceptance, accept_drafts, target_probs
from ._conversations import ConversationLimits
from ._engine import LanguageEngine, check_turn
from ._models import (
    ENGINES,
    PLATFORM,
    LanguageConfig,
    LanguageModels,
    ServedLanguageModel,
    engine_missing,
    is_language_model_dir,
    open_engine,
    read_language_config,
)
from ._options import GenerationLimits, Sampling
from ._turn import Sink, Turn, TurnEngine, TurnUpdate
from ._verifier import Verifier
from ._verify_model import VerifyModel
from ._verify_sessions import SessionLimits
from ._vllm import VllmEngine

__all__ = [
    "ENGINES",
    "PLATFORM",
    "Acceptance",
    "ConversationLimits",
    "GenerationLimits",
    "LanguageConfig",
    "LanguageEngine",
    "LanguageModels",
    "Sampling",
    "ServedLanguageModel",
    "SessionLimits",
    "Sink",
    "Turn",
    "TurnEngine",
    "TurnUpdate",
    "Verifier",
    "VerifyModel",
    "VllmEngine",
    "accept_drafts",
    "check_turn",
    "engine_missing",
    "is_language_model_dir",
    "open_engine",
    "read_language_config",
    "target_probs",
]
