"""Convert a saved Hugging Face Llama directory into a ``.litertlm`` for LiteRT-LM.

``litert-torch``'s Hugging Face exporter (``python -m
litert_torch.generative.export_hf --model=DIR --output_dir=OUT``) traces the
model with its KV cache into a TFLite prefill/decode model, quantizes it
(``quantization``: one of ``ai_edge_quantizer``'s recipes, e.g.
``dynamic_wi8_afp32``, its default; ``"none"`` keeps FP32 weights) and packs
it with the tokenizer into ``model.litertlm``; the checkpoint's
``tokenizer.json`` and ``tokenizer_config.json`` are copied beside it (the
agent's runtime tokenizes with them). It runs in a child interpreter
(the same Python: ``pip install 'tandem[litert-lm-build]'``) with
``HF_HUB_OFFLINE=1``, so it reads the local directory only and its imports
(torch, jax, the converter) stay out of this process.

litert-torch 0.10.0 imports ``tensorflow.lite.python.schema_py_generated`` at
the top of two modules (a LoRA helper and one model extension) without
depending on TensorFlow; that module is the TFLite flatbuffer schema, which
``ai_edge_litert`` (a dependency) ships as ``ai_edge_litert.schema_py_generated``.
Where TensorFlow is absent the child gets a one-module stand-in that re-exports
it, on its ``PYTHONPATH`` only.

:func:`build_litert_device_model` converts a built pair's device checkpoint
once and keeps the result in the pair's cache entry (``litert-<quantization>/``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .._cache import build_into_cache
from ._errors import LanguageBuildError

__all__ = ["LITERT_FILE", "build_litert_device_model", "export_litert_lm", "litert_build_available"]

LITERT_FILE = "model.litertlm"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_SCHEMA_SHIM = "from ai_edge_litert.schema_py_generated import *  # noqa: F403\n"


def litert_build_available() -> bool:
    """True when this Python can convert (``litert_torch``) and run (``litert_lm``)."""
    return all(importlib.util.find_spec(m) is not None for m in ("litert_torch", "litert_lm"))


def export_litert_lm(
    hf_dir: Path,
    out_dir: Path,
    *,
    quantization: str = "dynamic_wi8_afp32",
    cache_length: int | None = None,
    timeout_s: float = 900.0,
) -> Path:
    """Write ``out_dir/model.litertlm`` from ``hf_dir``; its KV cache holds ``cache_length``
    tokens (the checkpoint's ``max_position_embeddings`` when None). Returns the file."""
    if not litert_build_available():
        raise LanguageBuildError(
            "converting to LiteRT-LM needs litert-torch and litert-lm-api: "
            "pip install 'tandem[litert-lm-build]'"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".litert-", dir=out_dir) as tmp:
        work = Path(tmp)
        args = [
            sys.executable, "-m", "litert_torch.generative.export_hf",
            f"--model={hf_dir}", f"--output_dir={work / 'out'}",
            f"--quantization_recipe={quantization}",
        ]  # fmt: skip
        if cache_length is not None:
            args.append(f"--cache_length={int(cache_length)}")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
        if importlib.util.find_spec("tensorflow") is None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (_schema_shim(work / "shim"), env.get("PYTHONPATH")) if p
            )
        try:
            done = subprocess.run(
                args, env=env, cwd=work, capture_output=True, text=True, timeout=timeout_s,
                check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise LanguageBuildError(
                f"the LiteRT-LM export of {hf_dir} ran past {timeout_s} s"
            ) from e
        produced = work / "out" / LITERT_FILE
        if done.returncode != 0 or not produced.exists():
            tail = (done.stdout + done.stderr)[-2000:]
            raise LanguageBuildError(
                f"the LiteRT-LM export of {hf_dir} failed (exit {done.returncode}):\n{tail}"
            )
        final = out_dir / LITERT_FILE
        os.replace(produced, final)
    for name in _TOKENIZER_FILES:  # the agent tokenizes with these (see _litert_runtime)
        shutil.copyfile(hf_dir / name, out_dir / name)
    return final


def build_litert_device_model(
    entry: Path, device_hf: Path, *, context: int, quantization: str = "dynamic_wi8_afp32"
) -> Path:
    """The device checkpoint of the pair cached at ``entry`` as a LiteRT-LM model folder,
    converted once into ``entry/litert-<quantization>/`` (``load_language_runtime`` loads it)."""
    final = entry / f"litert-{quantization}"
    if not _complete(final):
        build_into_cache(
            final,
            f"litert-{quantization}",
            lambda tmp: _convert_into(tmp, device_hf, quantization, context),
            _complete,
            rebuild=False,
            error=LanguageBuildError,
            stale=".tmp-litert-*",
        )
    return final


def _complete(folder: Path) -> bool:
    return all((folder / f).exists() for f in (LITERT_FILE, *_TOKENIZER_FILES))


def _convert_into(tmp: Path, device_hf: Path, quantization: str, context: int) -> None:
    export_litert_lm(device_hf, tmp, quantization=quantization, cache_length=context)


def _schema_shim(root: Path) -> str:
    """A ``tensorflow`` package holding only ``lite/python/schema_py_generated``."""
    module = root / "tensorflow" / "lite" / "python"
    module.mkdir(parents=True)
    for folder in (root / "tensorflow", root / "tensorflow" / "lite", module):
        (folder / "__init__.py").write_text("")
    (module / "schema_py_generated.py").write_text(_SCHEMA_SHIM)
    return str(root)
