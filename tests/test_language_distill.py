"""The distilled pair (``LanguageRecipe(distill=True)``): the device learns the hub's distribution.

The default recipe's cache key is the one it had before the distillation
fields existed; a distilled device ends far nearer the hub (KL, greedy
agreement) than one trained on the text alone for as many steps; a distilled
build reports its agreement as measured through ONNX Runtime GenAI.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tandem.demo.language import (
    RECIPE_VERSION,
    SPECULATIVE_RECIPE,
    LanguageRecipe,
    build_language_models,
    resolve_hub_target,
)
from tandem.demo.language._corpus import corpus_digest
from tandem.demo.language._train import train_pair

from ._language import _DEVICE, _HUB, tiny_recipe

_NEW_FIELDS = ("distill", "distill_weight", "device_steps")


def _key_before_distill(recipe: LanguageRecipe) -> str:
    """``LanguageRecipe.key`` as it was written before the distillation fields existed."""
    fields = {k: v for k, v in dataclasses.asdict(recipe).items() if k not in _NEW_FIELDS}
    payload = {"recipe_version": RECIPE_VERSION, **fields,
               "hub_target": resolve_hub_target(recipe), "corpus": corpus_digest()}  # fmt: skip
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@pytest.mark.parametrize("recipe", [LanguageRecipe(), tiny_recipe(), LanguageRecipe(seed=3)])
def test_recipes_without_distillation_keep_their_cache_key(recipe: LanguageRecipe) -> None:
    assert recipe.key() == _key_before_distill(recipe)


def test_each_distillation_field_enters_the_key_once_set() -> None:
    base = tiny_recipe()
    keys = {
        base.key(),
        dataclasses.replace(base, distill=True).key(),
        dataclasses.replace(base, distill=True, distill_weight=0.5).key(),
        dataclasses.replace(base, distill=True, device_steps=9).key(),
    }
    assert len(keys) == 4
    assert SPECULATIVE_RECIPE.distill and SPECULATIVE_RECIPE.key() != LanguageRecipe().key()


def test_bad_distillation_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="distill_weight"):
        LanguageRecipe(distill=True, distill_weight=0.0)
    with pytest.raises(ValueError, match="device_steps"):
        LanguageRecipe(device_steps=0)
    with pytest.raises(ValueError, match="distill needs"):
        train_pair({"a": _DEVICE, "b": _HUB}, _markov_stream(), vocab_size=64, context=32,
                   steps=1, max_seconds=10, seed=0, progress=lambda f: None,
                   distill=0.5)  # fmt: skip


def _markov_stream(n: int = 12_000, vocab: int = 64) -> np.ndarray:
    """Tokens from a random, peaked Markov chain: something a model can learn in a few steps."""
    rng = np.random.default_rng(0)
    table = rng.dirichlet(np.full(vocab, 0.1), size=vocab)
    out = [0]
    for _ in range(n):
        out.append(int(rng.choice(vocab, p=table[out[-1]])))
    return np.asarray(out, dtype=np.int64)


def _nearness(trained: dict[str, Any], tokens: np.ndarray) -> tuple[float, float]:
    """KL(hub || device) per position and greedy agreement, on the stream's first windows."""
    import torch

    x = torch.from_numpy(tokens[:1600]).reshape(-1, 40)[:, :33]
    with torch.no_grad():
        hub = torch.log_softmax(trained["hub"].model(input_ids=x).logits, -1)
        device = torch.log_softmax(trained["device"].model(input_ids=x).logits, -1)
    kl = float((hub.exp() * (hub - device)).sum(-1).mean())
    return kl, float((hub.argmax(-1) == device.argmax(-1)).float().mean())


def test_a_distilled_device_ends_nearer_the_hub_than_one_trained_on_text() -> None:
    tokens = _markov_stream()
    shapes = {"device": dataclasses.replace(_DEVICE, lr=1e-2, batch_size=8),
              "hub": dataclasses.replace(_HUB, lr=1e-2, batch_size=8)}  # fmt: skip
    common: dict[str, Any] = dict(vocab_size=64, context=32, steps=30, max_seconds=120,
                                  seed=0, progress=lambda f: None)  # fmt: skip
    lockstep, _ = train_pair(shapes, tokens, **common)
    distilled, stopped = train_pair(shapes, tokens, **common, distill=0.8, device_steps=30)
    assert stopped == "steps"
    assert distilled["hub"].steps_run == 30 and distilled["device"].steps_run == 30
    kl_text, agree_text = _nearness(lockstep, tokens)
    kl_distilled, agree_distilled = _nearness(distilled, tokens)
    assert kl_distilled < 0.6 * kl_text
    assert agree_distilled > agree_text


def test_a_distilled_build_reports_its_agreement(tmp_path: Path) -> None:
    recipe = dataclasses.replace(tiny_recipe(), distill=True, device_steps=6)
    built = build_language_models(tmp_path, recipe=recipe)
    agreement = built.report["agreement"]
    assert 0 < agreement["positions"] <= 8192
    assert 0.0 <= agreement["agreement"] <= 1.0
    assert 1 <= agreement["hub_distinct"] <= recipe.vocab_size
    assert 0.0 < agreement["hub_top_share"] <= 1.0
    assert built.report["training"]["distilled"] == {"weight": recipe.distill_weight}
    assert built.report["training"]["device"]["steps_run"] == 6
    assert built.report["training"]["hub"]["steps_run"] == recipe.steps
    assert all((m / "model.onnx").exists() for m in (built.device_model, built.hub_model))


def test_an_intermediate_size_equal_to_the_vocabulary_is_refused() -> None:
    # ONNX Runtime GenAI's builder exports such a model wrong (its logits are not torch's).
    wide = dataclasses.replace(_HUB, intermediate=320)
    with pytest.raises(ValueError, match="intermediate size 320 equals the vocabulary"):
        dataclasses.replace(tiny_recipe(), hub=wide)
    with pytest.raises(ValueError, match="device shape"):
        dataclasses.replace(tiny_recipe(), device=dataclasses.replace(_DEVICE, intermediate=320))
    assert SPECULATIVE_RECIPE.hub.intermediate != SPECULATIVE_RECIPE.vocab_size
