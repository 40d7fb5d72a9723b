"""Small real TFLite models built in the test run, without TensorFlow.

The flatbuffer is written with the schema module that ai-edge-litert ships
(``ai_edge_litert.schema_py_generated``) and the ``flatbuffers`` package.
The model is the same ``logits = x @ W + b`` as ``tests/_models.py`` (same
weights for the same seed), as one FULLY_CONNECTED op with a dynamic batch
dim, so tests can compare TFLite with numpy and with ONNX Runtime.

The INT8 variant is fully quantized the way the TFLite converter does it:
INT8 input and output with per-tensor scale and zero point, symmetric INT8
weights, INT32 bias at scale ``input_scale * weight_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._models import linear_classifier_weights

__all__ = [
    "INPUT_TENSOR",
    "OUTPUT_TENSOR",
    "Int8Params",
    "int8_params",
    "linear_classifier_tflite",
    "write_linear_classifier_tflite",
]

# Tensor names as the TFLite converter writes them; the signature maps them
# to the friendly names "x" and "logits".
INPUT_TENSOR = "serving_default_x:0"
OUTPUT_TENSOR = "StatefulPartitionedCall:0"
_ALIGN = 16  # the converter aligns constant buffers; kernels may read them as SIMD


@dataclass(frozen=True)
class Int8Params:
    """Quantization of the INT8 model's tensors: ``real = scale * (q - zero_point)``."""

    input_scale: float
    input_zero_point: int
    weight_scale: float
    output_scale: float
    output_zero_point: int


def int8_params(in_features: int = 16, classes: int = 4, seed: int = 0) -> Int8Params:
    """Scales for inputs in [-4, 4] and the logits those can produce."""
    weight, bias = linear_classifier_weights(in_features, classes, seed)
    input_scale = 8.0 / 255.0
    bound = float(np.max(4.0 * np.abs(weight).sum(axis=0) + np.abs(bias)))
    return Int8Params(
        input_scale=input_scale,
        input_zero_point=-1,  # not 0, so tests notice a dropped zero point
        weight_scale=float(np.abs(weight).max()) / 127.0,
        output_scale=2.0 * bound / 255.0,
        output_zero_point=0,
    )


def linear_classifier_tflite(
    in_features: int = 16,
    classes: int = 4,
    seed: int = 0,
    *,
    quantized: bool = False,
    signature: bool = True,
) -> bytes:
    """The serialized model: x[?, in_features] -> logits[?, classes]."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as tfl

    weight, bias = linear_classifier_weights(in_features, classes, seed)
    # FULLY_CONNECTED keeps weights as [out, in].
    kernel = np.ascontiguousarray(weight.T)
    if quantized:
        q = int8_params(in_features, classes, seed)
        kernel_q = np.clip(np.round(kernel / q.weight_scale), -127, 127).astype(np.int8)
        bias_q = np.round(bias / (q.input_scale * q.weight_scale)).astype(np.int32)
        io_type = tfl.TensorType.INT8
        buffers = [None, kernel_q, bias_q]
        quant: dict[str, Any] = {
            "x": _quantization(tfl, q.input_scale, q.input_zero_point),
            "W": _quantization(tfl, q.weight_scale, 0),
            "b": _quantization(tfl, q.input_scale * q.weight_scale, 0),
            "logits": _quantization(tfl, q.output_scale, q.output_zero_point),
        }
        const_types = (tfl.TensorType.INT8, tfl.TensorType.INT32)
    else:
        io_type = tfl.TensorType.FLOAT32
        buffers = [None, kernel, bias]
        quant = {}
        const_types = (tfl.TensorType.FLOAT32, tfl.TensorType.FLOAT32)

    def tensor(name: str, key: str, shape: list[int], type_: int, buffer: int) -> Any:
        t = tfl.TensorT()
        t.name = name
        t.shape = [1 if d < 0 else d for d in shape]
        t.shapeSignature = shape
        t.type = type_
        t.buffer = buffer
        t.quantization = quant.get(key)
        return t

    # Buffer 0 is the empty sentinel every TFLite model starts with.
    tensors = [
        tensor(INPUT_TENSOR, "x", [-1, in_features], io_type, 0),
        tensor("W", "W", [classes, in_features], const_types[0], 1),
        tensor("b", "b", [classes], const_types[1], 2),
        tensor(OUTPUT_TENSOR, "logits", [-1, classes], io_type, 0),
    ]
    options = tfl.FullyConnectedOptionsT()
    options.fusedActivationFunction = tfl.ActivationFunctionType.NONE
    op = tfl.OperatorT()
    op.opcodeIndex = 0
    op.inputs = [0, 1, 2]
    op.outputs = [3]
    op.builtinOptionsType = tfl.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = options

    subgraph = tfl.SubGraphT()
    subgraph.tensors = tensors
    subgraph.inputs = [0]
    subgraph.outputs = [3]
    subgraph.operators = [op]
    subgraph.name = "main"

    code = tfl.OperatorCodeT()
    code.builtinCode = tfl.BuiltinOperator.FULLY_CONNECTED
    code.deprecatedBuiltinCode = tfl.BuiltinOperator.FULLY_CONNECTED
    # Version 4 of the op is the one with INT8 kernels.
    code.version = 4 if quantized else 1

    model = tfl.ModelT()
    model.version = 3
    model.description = "tandem test linear classifier"
    model.operatorCodes = [code]
    model.subgraphs = [subgraph]
    model.buffers = [_aligned_buffer(tfl, data) for data in buffers]
    if signature:
        sig = tfl.SignatureDefT()
        sig.signatureKey = "serving_default"
        sig.subgraphIndex = 0
        sig.inputs = [_tensor_map(tfl, "x", 0)]
        sig.outputs = [_tensor_map(tfl, "logits", 3)]
        model.signatureDefs = [sig]

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def write_linear_classifier_tflite(path: Path, **kwargs: Any) -> Path:
    """Write ``linear_classifier_tflite(**kwargs)`` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(linear_classifier_tflite(**kwargs))
    return path


def _quantization(tfl: Any, scale: float, zero_point: int) -> Any:
    q = tfl.QuantizationParametersT()
    q.scale = [scale]
    q.zeroPoint = [zero_point]
    return q


def _tensor_map(tfl: Any, name: str, index: int) -> Any:
    m = tfl.TensorMapT()
    m.name = name
    m.tensorIndex = index
    return m


def _aligned_buffer(tfl: Any, data: np.ndarray | None) -> Any:
    """A BufferT whose bytes start on a 16-byte boundary (``BufferT.Pack`` aligns to 1)."""

    class AlignedBuffer(tfl.BufferT):
        def Pack(self, builder: Any) -> Any:
            vector = None
            if data is not None:
                payload = np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<")).tobytes()
                builder.StartVector(1, len(payload), _ALIGN)
                builder.head -= len(payload)
                builder.Bytes[builder.head : builder.head + len(payload)] = payload
                vector = builder.EndVector()
            tfl.BufferStart(builder)
            if vector is not None:
                tfl.BufferAddData(builder, vector)
            return tfl.BufferEnd(builder)

    return AlignedBuffer()
