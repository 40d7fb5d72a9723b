"""The tiny language-model pair the language tests build: seconds, not minutes."""

from __future__ import annotations

from tandem.demo.language import LanguageRecipe, ModelShape

_DEVICE = ModelShape(
    hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, batch_size=2, lr=1e-3
)
_HUB = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, batch_size=2, lr=1e-3)


def tiny_recipe(*, context: int = 48) -> LanguageRecipe:
    """Four training steps of a 1-layer device model and a 2-layer hub model, on the CPU."""
    return LanguageRecipe(
        vocab_size=320, context=context, device=_DEVICE, hub=_HUB, steps=4,
        max_train_seconds=120.0, hub_provider="cpu",
    )  # fmt: skip
