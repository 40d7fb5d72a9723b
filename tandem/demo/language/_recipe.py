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
    "RECIPE_VERSION",
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

    def __post_init__(self) -> None:
        if self.vocab_size < 259 or self.context < 8 or self.steps < 1:
            raise ValueError(
                "vocab_size must be >= 259 (bytes + specials), context >= 8, steps >= 1"
            )
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
        payload = {
            "recipe_version": RECIPE_VERSION,
            **dataclasses.asdict(self),
            "hub_target": resolve_hub_target(self),
            "corpus": corpus_digest(),
        }
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


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
