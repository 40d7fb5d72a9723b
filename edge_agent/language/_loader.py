"""Which runtime loads a language model folder: decided by the folder's contents."""

from __future__ import annotations

import os
from pathlib import Path

from ._litert_runtime import LiteRTLanguageRuntime
from ._runtime import LanguageRuntime

__all__ = ["load_language_runtime"]


def load_language_runtime(
    directory: str | os.PathLike[str], *, name: str | None = None, version: str = "0"
) -> LanguageRuntime:
    """Load a language model folder with the runtime its contents name: a ``.litertlm``
    file loads on LiteRT-LM (``LiteRTLanguageRuntime``, ``pip install 'tandem[litert-lm]'``),
    anything else is an ONNX Runtime GenAI folder (``genai_config.json`` and its files).
    Neither runtime's package is imported before its model loads."""
    if any(Path(directory).glob("*.litertlm")):
        return LiteRTLanguageRuntime(directory, name=name, version=version)
    return LanguageRuntime(directory, name=name, version=version)
