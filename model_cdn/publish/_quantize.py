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
not read. The float model must hold its weights (``_onnx_file`` inlines
external data first) and so does the result: one file, what devices load.
Foreign errors become ``QuantizationError``, naming the user's model rather
than the temporary copies ONNX Runtime's tools work on.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shared import quiet_loggers

from .._errors import PublishError, QuantizationError
from ._onnx_file import external_locations, require_self_contained
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
    label: str = "the model",
) -> bytes:
    """The quantized, shrunk model file: one file, with every weight inside.

    ``label`` names the model in errors (the user's file), where ONNX Runtime's
    tools would name the temporary copies they work on.
    """
    import onnx

    if method not in METHODS:
        raise QuantizationError(f"unknown quantization {method!r}; use one of {', '.join(METHODS)}")
    try:
        require_self_contained(float_model, label)
    except PublishError as e:
        raise QuantizationError(str(e)) from e
    with tempfile.TemporaryDirectory(prefix="tandem-quantize-") as tmp:
        try:
            if method == "int8-static":
                if calibration is None or len(calibration) == 0:
                    raise QuantizationError("int8-static needs calibration inputs")
                model = _static(float_model, Path(tmp), input_name, calibration, fixed_batch, label)
            elif method == "int8-dynamic":
                model = _dynamic(float_model, Path(tmp), label)
            elif method == "fp16":
                model = _fp16(float_model)
            else:
                model = onnx.load_model_from_string(float_model)
            shrunk = shrink_model(model)
            onnx.checker.check_model(shrunk)
        except QuantizationError:
            raise
        except Exception as e:  # ORT's tools raise ValueError, RuntimeError, onnx errors, ...
            why = _without_temporary_paths(str(e), tmp, label)
            raise QuantizationError(f"{label}: {method} quantization failed: {why}") from e
    if external_locations(shrunk):  # the tools inline below 2 GiB; a blob must be whole
        raise QuantizationError(f"{label}: {method} quantization left weights outside the file")
    return bytes(shrunk.SerializeToString())


def _without_temporary_paths(message: str, tmp: str, label: str) -> str:
    """``message`` with each path into the temporary folder replaced by ``label``."""
    pattern = re.escape(os.path.realpath(tmp)) + "|" + re.escape(tmp)
    return re.sub(rf"(?:{pattern})(?:[/\\][\w.-]*)*", label, message)


def _static(
    float_model: bytes,
    tmp: Path,
    input_name: str,
    calibration: np.ndarray,
    fixed_batch: int | None,
    label: str,
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
    prepared, quantized = _prepare(float_model, tmp, label), tmp / "q.onnx"
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


def _prepare(float_model: bytes, directory: Path, label: str) -> Path:
    """The float model after ORT's pre-processing (shape inference), as a file."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, prepared = directory / "f.onnx", directory / "p.onnx"
    source.write_bytes(float_model)
    try:
        with quiet_loggers("onnxruntime.quantization"):  # its INFO chatter is not the user's
            quant_pre_process(str(source), str(prepared), skip_optimization=True)
    except Exception as e:  # symbolic shape inference gives up on some graphs
        why = _without_temporary_paths(str(e), str(directory), label)
        _log.warning("quant_pre_process failed on %s (%s); quantizing without it", label, why)
        return source
    return prepared


def _dynamic(float_model: bytes, tmp: Path, label: str) -> Any:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    prepared, quantized = _prepare(float_model, tmp, label), tmp / "q.onnx"
    quantize_dynamic(str(prepared), str(quantized), weight_type=QuantType.QInt8, reduce_range=True)
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
