"""Quantize a float ONNX model with ONNX Runtime's tools, then shrink the file.

Methods:

- ``int8-static``: QDQ (QuantizeLinear/DequantizeLinear pairs around each
  op), the form NPU compilers and ONNX Runtime's fused INT8 kernels both
  read. QUInt8 activations, QInt8 per-channel weights (ONNX Runtime's
  recommended CPU setting; per-channel keeps few-channel convolutions
  accurate), MinMax ranges from the publisher's calibration inputs.
  Weights use a 7-bit range (``reduce_range``): x86 CPUs without VNNI
  multiply u8 x s8 pairs into saturating 16-bit sums (``VPMADDUBSW``), so
  full-range weights make one file compute different logits there than on
  ARM, VNNI or an NPU (on the demo's models up to 4.1 apart, agreement with
  the float model 0.991 instead of 0.999). With 7-bit weights no sum
  saturates, fused and reference kernels agree, and the file compresses
  better. ``quant_pre_process`` runs first, as ONNX Runtime advises, for shape
  inference only (``skip_optimization``): ORT's optimizer pass would stamp
  custom-domain opset imports that other runtimes refuse.
- ``int8-dynamic``: INT8 weights (7-bit range, as above), activation ranges
  computed per run; no calibration data needed, larger speed-up for
  MatMul-heavy models.
- ``fp16``: weights and compute in half precision with FP32 inputs and
  outputs (``keep_io_types``), so callers feed the same arrays.
- ``none``: the float model as is.

Whatever the method, :func:`shrink_model` then removes what inference does
not read. Foreign errors become ``QuantizationError``.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .._errors import QuantizationError
from ._runner import batches
from ._shrink import shrink_model

__all__ = ["METHODS", "Method", "quantize_model", "scheme_of"]

Method = Literal["int8-static", "int8-dynamic", "fp16", "none"]
METHODS: tuple[str, ...] = ("int8-static", "int8-dynamic", "fp16", "none")
_log = logging.getLogger(__name__)
_CALIBRATION_BATCH = 100  # samples per calibration run: bounded memory for large inputs


def scheme_of(method: str) -> dict[str, Any]:
    """How ``method`` quantizes, for the manifest's report."""
    if method == "int8-static":
        return {
            "format": "QDQ",
            "activations": "QUInt8",
            "weights": "QInt8",
            "reduce_range": True,
            "per_channel": True,
            "calibration": "MinMax",
        }
    if method == "int8-dynamic":
        return {
            "format": "QOperator",
            "activations": "dynamic QUInt8",
            "weights": "QInt8",
            "reduce_range": True,
        }
    if method == "fp16":
        return {"weights": "FP16", "io": "FP32"}
    return {}


def quantize_model(
    float_model: bytes,
    method: str,
    *,
    input_name: str,
    calibration: np.ndarray | None = None,
    fixed_batch: int | None = None,
) -> bytes:
    """The quantized, shrunk model file."""
    import onnx

    if method not in METHODS:
        raise QuantizationError(f"unknown quantization {method!r}; use one of {', '.join(METHODS)}")
    try:
        if method == "int8-static":
            if calibration is None or len(calibration) == 0:
                raise QuantizationError("int8-static needs calibration inputs")
            model = _static(float_model, input_name, calibration, fixed_batch)
        elif method == "int8-dynamic":
            model = _dynamic(float_model)
        elif method == "fp16":
            model = _fp16(float_model)
        else:
            model = onnx.load_model_from_string(float_model)
        shrunk = shrink_model(model)
        onnx.checker.check_model(shrunk)
        return bytes(shrunk.SerializeToString())
    except QuantizationError:
        raise
    except Exception as e:  # ORT's tools raise ValueError, RuntimeError, onnx errors, ...
        raise QuantizationError(f"{method} quantization failed: {e}") from e


def _static(
    float_model: bytes, input_name: str, calibration: np.ndarray, fixed_batch: int | None
) -> Any:
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Calibration(CalibrationDataReader):
        """The calibration inputs in model-sized batches; ORT may rewind and read them again."""

        def __init__(self) -> None:
            self.rewind()

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self.batches, None)
            return None if batch is None else {input_name: batch}

        def rewind(self) -> None:
            self.batches = batches(calibration, fixed_batch, _CALIBRATION_BATCH)

    reader = Calibration()
    with tempfile.TemporaryDirectory(prefix="tandem-quantize-") as tmp:
        prepared, quantized = _prepare(float_model, Path(tmp)), Path(tmp) / "q.onnx"
        quantize_static(
            str(prepared),
            str(quantized),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
        return onnx.load_model(str(quantized))


def _prepare(float_model: bytes, directory: Path) -> Path:
    """The float model after ORT's pre-processing (shape inference), as a file."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, prepared = directory / "f.onnx", directory / "p.onnx"
    source.write_bytes(float_model)
    try:
        quant_pre_process(str(source), str(prepared), skip_optimization=True)
    except Exception as e:  # symbolic shape inference gives up on some graphs
        _log.warning("quant_pre_process failed (%s); quantizing without it", e)
        return source
    return prepared


def _dynamic(float_model: bytes) -> Any:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="tandem-quantize-") as tmp:
        prepared, quantized = _prepare(float_model, Path(tmp)), Path(tmp) / "q.onnx"
        quantize_dynamic(
            str(prepared), str(quantized), weight_type=QuantType.QInt8, reduce_range=True
        )
        return onnx.load_model(str(quantized))


def _fp16(float_model: bytes) -> Any:
    import onnx

    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError:
        try:
            from onnxconverter_common.float16 import convert_float_to_float16
        except ImportError as e:
            raise QuantizationError(
                "fp16 needs onnxruntime's transformers tools or onnxconverter-common"
            ) from e
    return convert_float_to_float16(onnx.load_model_from_string(float_model), keep_io_types=True)
