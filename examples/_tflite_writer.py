"""Write a one-layer TFLite classifier without TensorFlow (the examples' stand-in for a converter).

A real project converts its trained model (``ai_edge_torch.convert`` or
TensorFlow's ``TFLiteConverter``); neither is installed here, so this writes
the flatbuffer directly with the schema module ai-edge-litert ships: one
``FULLY_CONNECTED`` op (which flattens its input) from ``input`` to
``logits``, float32, with a dynamic batch dimension and a
``serving_default`` signature that names the tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_dense_tflite"]

_ALIGN = 16  # constant buffers start on a 16-byte boundary, as the converter writes them


def write_dense_tflite(
    path: Path,
    weight: np.ndarray,
    bias: np.ndarray,
    *,
    input_name: str = "image",
    input_shape: tuple[int, ...] = (1, 28, 28),
) -> Path:
    """``logits = flatten(input) @ weight + bias``; ``weight`` is [features, classes]."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as tfl

    features, classes = weight.shape
    if int(np.prod(input_shape)) != features:
        raise ValueError(f"input shape {input_shape} has no {features} features")

    def tensor(name: str, shape: list[int], buffer: int) -> Any:
        t = tfl.TensorT()
        t.name = name
        t.shape = [1 if d < 0 else d for d in shape]
        t.shapeSignature = shape
        t.type = tfl.TensorType.FLOAT32
        t.buffer = buffer
        return t

    tensors = [
        tensor(input_name, [-1, *input_shape], 0),
        tensor("weight", [classes, features], 1),  # FULLY_CONNECTED keeps [out, in]
        tensor("bias", [classes], 2),
        tensor("logits", [-1, classes], 0),
    ]
    options = tfl.FullyConnectedOptionsT()
    options.fusedActivationFunction = tfl.ActivationFunctionType.NONE
    op = tfl.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1, 2], [3]
    op.builtinOptionsType = tfl.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = options
    graph = tfl.SubGraphT()
    graph.tensors, graph.inputs, graph.outputs, graph.operators = tensors, [0], [3], [op]
    graph.name = "main"
    code = tfl.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = tfl.BuiltinOperator.FULLY_CONNECTED
    code.version = 1
    signature = tfl.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = "serving_default", 0
    signature.inputs = [_tensor_map(tfl, input_name, 0)]
    signature.outputs = [_tensor_map(tfl, "logits", 3)]
    model = tfl.ModelT()
    model.version, model.description = 3, "tandem example: dense classifier"
    model.operatorCodes, model.subgraphs, model.signatureDefs = [code], [graph], [signature]
    kernel = np.ascontiguousarray(weight.T, dtype=np.float32)
    model.buffers = [_buffer(tfl, None), _buffer(tfl, kernel), _buffer(tfl, bias.astype("<f4"))]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(builder.Output()))
    return path


def _tensor_map(tfl: Any, name: str, index: int) -> Any:
    m = tfl.TensorMapT()
    m.name, m.tensorIndex = name, index
    return m


def _buffer(tfl: Any, data: np.ndarray | None) -> Any:
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
