"""Part c's heavier cloud model: a CNN whose big fully connected layer gains from batching.

``heavy_model()`` builds, with ``onnx.helper`` and fixed random weights
(seed ``SEED``), a digits-shaped network: ``image`` [N, 1, 28, 28] FP32 ->
Conv 3x3 (``CHANNELS``) -> ReLU -> MaxPool 2 -> Flatten -> FC ``HIDDEN``
-> ReLU -> FC 10 -> ``logits`` [N, 10]. It is never trained: its answers
mean nothing, and the rows that use it measure throughput only.

Why this shape: a convolution-only net gains little from batching on a CPU,
while a fully connected layer does. At batch 1 the FC layer is a
matrix-vector product that streams all of its ``CHANNELS * 14 * 14 *
HIDDEN`` weights (103 MB) from memory for one sample; at batch 64 the same
weights serve 64 samples in a matrix-matrix product. Part c checks, in the
executor alone, that a sample takes >= 1 ms at batch 1 and that batch 64 is
>= 4x cheaper per sample, and says so when the machine disagrees.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CHANNELS", "HIDDEN", "SEED", "heavy_model"]

CHANNELS = 32
HIDDEN = 4096
SEED = 7
_SIDE = 14  # 28 after a 2x2 max pool


def heavy_model() -> bytes:
    """The serialized ONNX model (opset 17), the same bytes on every call."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED)

    def weight(name: str, shape: tuple[int, ...], fan_in: int) -> onnx.TensorProto:
        values = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))
        return numpy_helper.from_array(values, name)

    flat = CHANNELS * _SIDE * _SIDE
    weights = [
        weight("conv_w", (CHANNELS, 1, 3, 3), 9),
        weight("conv_b", (CHANNELS,), 1),
        weight("fc1_w", (flat, HIDDEN), flat),
        weight("fc1_b", (HIDDEN,), 1),
        weight("fc2_w", (HIDDEN, 10), HIDDEN),
        weight("fc2_b", (10,), 1),
    ]
    node = helper.make_node
    nodes = [
        node("Conv", ["image", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1]),
        node("Relu", ["conv"], ["conv_relu"]),
        node("MaxPool", ["conv_relu"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Flatten", ["pooled"], ["flat"], axis=1),
        node("Gemm", ["flat", "fc1_w", "fc1_b"], ["hidden"]),
        node("Relu", ["hidden"], ["hidden_relu"]),
        node("Gemm", ["hidden_relu", "fc2_w", "fc2_b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bench_heavy_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())
