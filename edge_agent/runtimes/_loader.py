"""Pick the runtime for a model file from its suffix.

The suffix is the contract: the model CDN names blobs ``model.onnx`` or
``model.tflite`` after decompression, and sniffing file contents would turn
a truncated download into a confusing "wrong runtime" error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import ModelLoadError
from ._base import ModelRuntime
from ._onnx import OnnxRuntime
from ._tflite import TFLiteRuntime

__all__ = ["load_runtime"]

_BY_SUFFIX: dict[str, Callable[..., ModelRuntime]] = {
    ".onnx": OnnxRuntime,
    ".tflite": TFLiteRuntime,
}


def load_runtime(
    path: str | os.PathLike[str], *, name: str | None = None, version: str = "0", **options: Any
) -> ModelRuntime:
    """Load ``path`` with the runtime its suffix calls for (``.onnx`` or ``.tflite``).

    ``name`` defaults to the file's stem; ``options`` go to the runtime's
    constructor (``providers``/``intra_op_threads`` for ONNX,
    ``num_threads``/``delegates`` for TFLite, ``max_input_bytes`` for both).
    """
    model_path = Path(path)
    runtime = _BY_SUFFIX.get(model_path.suffix.lower())
    if runtime is None:
        raise ModelLoadError(
            f"cannot load {model_path}: unsupported model format "
            f"{model_path.suffix or '(no suffix)'!r}; expected one of {', '.join(_BY_SUFFIX)}"
        )
    return runtime(model_path, name=name or model_path.stem, version=version, **options)
