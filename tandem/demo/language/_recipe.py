"""What decides a language-model build: the recipe, its cache key, the hub's target.

Apart from the package (which builds and caches) so that ``_build`` can name the
recipe without importing the package that imports it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Final

from ._corpus import corpus_digest
from ._export import PRECISIONS
from ._train import ModelShape

__all__ = [
    "DEFAULT_DEVICE_SHAPE",
    "DEFAULT_HUB_SHAPE",
    "HEAVY_HUB_SHAPE",
    "RECIPE_VERSION",
    "SPECULATIVE_RECIPE",
    "LanguageRecipe",
    "resolve_hub_target",
]

RECIPE_VERSION = 2  # bump when the code changes what a recipe produces

# About 0.23M and 1.97M parameters (the tied embedding included).
DEFAULT_DEVICE_SHAPE: Final = ModelShape(
    hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, batch_size=16, lr=5e-3
)
DEFAULT_HUB_SHAPE: Final = ModelShape(
    hidden=192, layers=4, heads=6, kv_heads=2, intermediate=512, batch_size=16, lr=5e-3
)


@dataclass(frozen=True, kw_only=True)
class LanguageRecipe:
    """Everything that decides what gets built; its hash names the cache entry.

    ``hub_precision`` is ``"auto"`` (FP16 on CUDA when ONNX Runtime GenAI has
    CUDA, else FP32 on CPU), or one of ``int4``/``int8``/``fp32``/``fp16``;
    ``hub_provider`` is ``"auto"``, ``"cpu"`` or ``"cuda"``. ``steps`` and
    ``max_train_seconds`` bound the lockstep training of the pair (the default
    keeps a cold build within 5 minutes on 2 cores). Tests shrink the shapes
    and steps to build in seconds.

    ``distill=True`` trains the hub first and then the device on the hub's
    soft targets (weight ``distill_weight`` on the KL to the hub's
    temperature-1 distribution, the rest on the text), for ``device_steps``
    steps (default ``steps``), so that the device's greedy tokens agree with
    the hub's often: a draft model for speculative decoding (see
    :data:`SPECULATIVE_RECIPE`). The build then also measures that agreement
    on the held-out text. The three fields enter the cache key only when they
    differ from their defaults, so recipes that do not use them keep the key
    they had before the fields existed.
    """

    vocab_size: int = 2048
    context: int = 128
    heldout_fraction: float = 0.08
    split_seed: int = 0
    seed: int = 0
    device: ModelShape = DEFAULT_DEVICE_SHAPE
    hub: ModelShape = DEFAULT_HUB_SHAPE
    steps: int = 500
    max_train_seconds: float = 210.0
    device_precision: str = "int4"
    hub_precision: str = "auto"
    hub_provider: str = "auto"
    distill: bool = False
    distill_weight: float = 0.8
    device_steps: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in (0, 1], not {self.distill_weight}")
        if self.device_steps is not None and self.device_steps < 1:
            raise ValueError("device_steps must be >= 1 (or None: the recipe's steps)")
        if self.vocab_size < 259 or self.context < 8 or self.steps < 1:
            raise ValueError(
                "vocab_size must be >= 259 (bytes + specials), context >= 8, steps >= 1"
            )
        for which, shape in (("device", self.device), ("hub", self.hub)):
            _check_export_shape(which, shape, self.vocab_size)
        if self.max_train_seconds <= 0:
            raise ValueError("max_train_seconds must be > 0")
        if self.device_precision not in PRECISIONS:
            raise ValueError(f"device_precision {self.device_precision!r} not in {[*PRECISIONS]}")
        if self.hub_precision not in (*PRECISIONS, "auto"):
            raise ValueError(f"hub_precision {self.hub_precision!r} not in auto, {[*PRECISIONS]}")
        if self.hub_provider not in ("auto", "cpu", "cuda"):
            raise ValueError(f"hub_provider {self.hub_provider!r} not in auto, cpu, cuda")

    def key(self) -> str:
        """16 hex digits of SHA-256 over the version, every field, the hub target and the text."""
        fields = dataclasses.asdict(self)
        for name, default in _KEYED_IF_SET.items():
            if fields[name] == default:
                del fields[name]  # the key of a recipe without them is the key it always had
        payload = {
            "recipe_version": RECIPE_VERSION,
            **fields,
            "hub_target": resolve_hub_target(self),
            "corpus": corpus_digest(),
        }
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _check_export_shape(which: str, shape: ModelShape, vocab_size: int) -> None:
    """Refuse what exports wrong: with the MLP's intermediate size equal to the vocabulary
    size, ONNX Runtime GenAI's model builder writes a model whose logits are not the
    checkpoint's (max difference ~5 against torch's, argmax never equal; found with a
    768-wide hub and a 2048-token vocabulary, and 1536 or 2304 export exactly)."""
    if shape.intermediate == vocab_size:
        raise ValueError(
            f"the {which} shape's intermediate size {shape.intermediate} equals the vocabulary "
            "size: ONNX Runtime GenAI's model builder exports it wrong; choose another"
        )


_KEYED_IF_SET = {"distill": False, "distill_weight": 0.8, "device_steps": None}

# About 84M parameters: greedy decoding through ONNX Runtime GenAI (FP32, CPU) takes
# 15-30 ms a token on one core of this kind of machine, heavier than a round trip divided by
# the tokens a speculative round accepts. Few steps of one window each (~1.5 s on an idle
# core, several times that on a busy one): the hub is weak at text, and the device learns
# to predict what it predicts. (Intermediate 2304, not 2048: see _check_export_shape.)
HEAVY_HUB_SHAPE: Final = ModelShape(
    hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2304, batch_size=1, lr=2e-3
)

# The heavy hub and a distilled default-shape device: the pair for speculative decoding.
SPECULATIVE_RECIPE: Final = LanguageRecipe(
    hub=HEAVY_HUB_SHAPE,
    steps=200,
    device_steps=300,
    max_train_seconds=240.0,
    hub_provider="cpu",
    distill=True,
)


def resolve_hub_target(recipe: LanguageRecipe) -> tuple[str, str]:
    """``(precision, provider)`` for the hub model: FP16 on CUDA where available, else FP32."""
    provider = recipe.hub_provider
    if provider == "auto":
        provider = "cuda" if _genai_has_cuda() else "cpu"
    precision = recipe.hub_precision
    if precision == "auto":
        precision = "fp16" if provider == "cuda" else "fp32"
    if provider not in PRECISIONS[precision]:
        raise ValueError(f"no {precision} export for {provider}")
    return precision, provider


def _genai_has_cuda() -> bool:
    try:
        import onnxruntime_genai as og
    except ImportError:
        return False
    return bool(og.is_cuda_available())
