"""Small real ONNX models built in the test run (no downloads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["linear_classifier_weights", "write_linear_classifier"]


def linear_classifier_weights(
    in_features: int = 16, classes: int = 4, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(in_features, classes)).astype(np.float32)
    bias = rng.normal(size=(classes,)).astype(np.float32)
    return weight, bias


def write_linear_classifier(
    path: Path, in_features: int = 16, classes: int = 4, seed: int = 0, opset: int = 17
) -> Path:
    """Write ``logits = x @ W + b`` as ONNX: input ``x`` [batch, in], output ``logits``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight, bias = linear_classifier_weights(in_features, classes, seed)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["logits"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", in_features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
