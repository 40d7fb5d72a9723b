"""A float ONNX model back into a torch module, for fine-tuning: chains of common layers only.

The default trainer of ``tandem models refine`` starts from the float model
of the version in service, which is an ONNX file (what ``tandem models
publish`` took). ``torch_from_onnx`` rebuilds it as an ``nn.Sequential``
when its graph is a single chain, input to output, of these nodes with
constant weights: ``Conv``, ``Relu``, ``MaxPool``, ``AveragePool``,
``Flatten``, ``Reshape`` (to ``[batch, -1]``), ``Gemm`` and ``MatMul``
followed by ``Add`` of a constant (a linear layer). The exporter folds
BatchNorm into the convolutions, so the demo's models are such chains. Any
other graph raises ``RefineError`` naming the node: such a model needs a
trainer of its own (``--trainer MODULE:FUNC``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import RefineError

if TYPE_CHECKING:
    import torch

__all__ = ["OnnxChain", "torch_from_onnx"]


@dataclass(frozen=True)
class OnnxChain:
    """The rebuilt module and the names of the graph's input and output."""

    module: torch.nn.Module
    input_name: str
    output_name: str


def torch_from_onnx(model_bytes: bytes) -> OnnxChain:
    """An ``nn.Sequential`` computing what the ONNX chain computes (float32)."""
    import onnx
    from onnx import numpy_helper

    try:
        graph = onnx.load_model_from_string(model_bytes).graph
    except Exception as e:  # onnx raises DecodeError and friends
        raise RefineError(f"the base model is not an ONNX file: {e}") from e
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in weights]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise RefineError("the default trainer takes models with one input and one output")
    layers: list[Any] = []
    current = inputs[0]
    nodes = list(graph.node)
    i = 0
    while i < len(nodes):
        node = nodes[i]
        data = [name for name in node.input if name not in weights and name]
        if data != [current]:
            raise RefineError(f"node {node.op_type} {node.name!r} does not continue one chain")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMul" and i + 1 < len(nodes) and nodes[i + 1].op_type == "Add":
            layers.append(_matmul_add(node, nodes[i + 1], weights))
            current = nodes[i + 1].output[0]
            i += 2
            continue
        layers.append(_layer(node.op_type, node, attrs, weights))
        current = node.output[0]
        i += 1
    if current != graph.output[0].name:
        raise RefineError("the chain of nodes does not end at the model's output")
    import torch

    module = torch.nn.Sequential(*layers)
    return OnnxChain(module.float(), inputs[0], graph.output[0].name)


def _layer(op: str, node: Any, attrs: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> Any:
    from torch import nn

    if op == "Relu":
        return nn.ReLU()
    if op == "Conv":
        return _conv(node, attrs, weights)
    if op in ("MaxPool", "AveragePool"):
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        if attrs.get("ceil_mode", 0) or list(attrs.get("dilations", [1, 1])) != [1, 1]:
            raise RefineError(f"{op} {node.name!r}: ceil_mode and dilations are not rebuilt")
        if pads[:2] != pads[2:]:
            raise RefineError(f"{op} {node.name!r}: asymmetric padding is not rebuilt")
        kernel, stride = tuple(attrs["kernel_shape"]), tuple(attrs.get("strides", [1, 1]))
        if op == "MaxPool":
            return nn.MaxPool2d(kernel, stride, tuple(pads[:2]))
        return nn.AvgPool2d(kernel, stride, tuple(pads[:2]), count_include_pad=False)
    if op == "Flatten":
        if attrs.get("axis", 1) != 1:
            raise RefineError(f"Flatten {node.name!r}: only axis 1 is rebuilt")
        return nn.Flatten()
    if op == "Reshape":
        shape = weights.get(node.input[1])
        dims = shape.tolist() if shape is not None and shape.ndim == 1 else []
        if len(dims) != 2 or not (
            (dims[0] in (0, -1) and dims[1] == -1) or (dims[0] == -1 and dims[1] > 0)
        ):
            raise RefineError(f"Reshape {node.name!r}: only a flatten to [batch, -1] is rebuilt")
        return nn.Flatten()
    if op == "Gemm":
        return _gemm(node, attrs, weights)
    raise RefineError(
        f"node {op} {node.name!r} is not rebuilt by the default trainer; pass --trainer"
    )


def _tensor(array: np.ndarray) -> Any:
    import torch

    return torch.nn.Parameter(torch.from_numpy(np.array(array, dtype=np.float32)))


def _conv(node: Any, attrs: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> Any:
    from torch import nn

    weight = weights.get(node.input[1])
    if weight is None or weight.ndim != 4:
        raise RefineError(f"Conv {node.name!r}: a 2-D convolution with constant weights only")
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if pads[:2] != pads[2:] or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise RefineError(f"Conv {node.name!r}: asymmetric or automatic padding is not rebuilt")
    groups = int(attrs.get("group", 1))
    bias = weights.get(node.input[2]) if len(node.input) > 2 else None
    conv = nn.Conv2d(
        weight.shape[1] * groups,
        weight.shape[0],
        tuple(weight.shape[2:]),
        stride=tuple(attrs.get("strides", [1, 1])),
        padding=tuple(pads[:2]),
        dilation=tuple(attrs.get("dilations", [1, 1])),
        groups=groups,
        bias=bias is not None,
    )
    conv.weight = _tensor(weight)
    if bias is not None:
        conv.bias = _tensor(bias)
    return conv


def _linear(weight: np.ndarray, bias: np.ndarray | None) -> Any:
    """``x @ weight.T + bias`` as ``nn.Linear`` (``weight``: [out, in])."""
    from torch import nn

    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = _tensor(weight)
    if bias is not None:
        linear.bias = _tensor(np.broadcast_to(bias, (weight.shape[0],)))
    return linear


def _gemm(node: Any, attrs: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> Any:
    weight = weights.get(node.input[1])
    if weight is None or weight.ndim != 2 or attrs.get("transA", 0):
        raise RefineError(f"Gemm {node.name!r}: constant weights, untransposed input only")
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    bias = weights.get(node.input[2]) if len(node.input) > 2 else None
    matrix = weight if attrs.get("transB", 0) else weight.T
    return _linear(alpha * matrix, None if bias is None else beta * bias)


def _matmul_add(matmul: Any, add: Any, weights: Mapping[str, np.ndarray]) -> Any:
    weight = weights.get(matmul.input[1])
    constants = [weights.get(name) for name in add.input if name != matmul.output[0]]
    if weight is None or weight.ndim != 2 or len(constants) != 1 or constants[0] is None:
        raise RefineError(f"MatMul {matmul.name!r} + Add: constant weight and bias only")
    return _linear(weight.T, constants[0])
