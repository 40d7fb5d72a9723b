"""A torch module to float ONNX, the way the demo's models are exported.

torch's ``torch.export``-based exporter (``dynamo=True``, torch 2.13's
default; the TorchScript one is deprecated) with its optimizer on, which
folds constants and eval-mode BatchNorm into the convolutions, so the graph
is plain Conv/Gemm/Relu that quantizes well. The first dimension is
exported dynamic (``batch``), so one file serves a device's single requests
and a hub's batches. torch is imported here only, so the rest of the
pipeline works without it.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from shared import quiet_loggers

from .._errors import PublishError

__all__ = ["DEFAULT_OPSET", "export_torch"]

DEFAULT_OPSET = 18  # the exporter's lowest; ONNX Runtime 1.18+ runs it everywhere


def export_torch(
    module: Any,
    example_input: np.ndarray,
    *,
    input_name: str = "input",
    output_name: str = "output",
    opset: int = DEFAULT_OPSET,
) -> bytes:
    """The module in eval mode as an ONNX file with a dynamic batch dimension."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise PublishError(f"expected a torch.nn.Module, got {type(module).__name__}")
    example = np.ascontiguousarray(example_input)
    if example.ndim == 0 or len(example) == 0:
        raise PublishError("the example input needs a batch dimension with samples")
    if len(example) == 1:  # a batch of one lets torch.export fix the batch dimension to 1
        example = np.concatenate([example, example])
    module = module.eval()
    with tempfile.TemporaryDirectory(prefix="tandem-export-") as tmp:
        path = Path(tmp) / "model.onnx"
        try:
            with (
                warnings.catch_warnings(),
                quiet_loggers("torch.onnx", "torch.export", "torch._dynamo", "onnxscript"),
                torch.no_grad(),
            ):
                # torch's own pytree deprecation, raised from inside the exporter.
                warnings.filterwarnings(
                    "ignore",
                    message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                    category=FutureWarning,
                )
                torch.onnx.export(
                    module,
                    (torch.from_numpy(example),),
                    str(path),
                    input_names=[input_name],
                    output_names=[output_name],
                    opset_version=opset,
                    dynamo=True,
                    dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
                    optimize=True,
                    external_data=False,
                    verbose=False,
                )
        except Exception as e:  # torch.export raises many kinds of errors
            raise PublishError(f"exporting the torch module to ONNX failed: {e}") from e
        return path.read_bytes()
