"""Run a ready-made TFLite model on the publisher's machine, to validate and describe it.

The pipeline does not convert to TFLite (that needs TensorFlow); it publishes
a file the publisher converted, and checks it against the float ONNX model
when it can. The interpreter comes from ``ai_edge_litert`` or
``tflite_runtime``; without either, :func:`load_tflite` says why and the
pipeline records that instead of validating.

Tensors are named as the device's ``TFLiteRuntime`` names them: by the single
signature's names (``x``) when the signature covers the graph's inputs and
outputs, else by tensor names. Quantized INT8/UINT8 inputs and outputs keep
their real types in the specs and the smoke test (a device feeds them as
they are); ``run_float`` quantizes inputs and dequantizes outputs so the
model can be compared with the float one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared import TensorSpec, datatype_of

from .._errors import PublishError

__all__ = ["TFLiteModel", "load_tflite"]


def _interpreter_module() -> Any | None:
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter
        except ImportError:
            return None
    return interpreter


@dataclass(eq=False)
class TFLiteModel:
    interpreter: Any
    inputs: list[tuple[str, dict[str, Any]]]
    outputs: list[tuple[str, dict[str, Any]]]
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def input_records(self) -> tuple[TensorSpec, ...]:
        return tuple(_record(name, d) for name, d in self.inputs)

    @property
    def output_records(self) -> tuple[TensorSpec, ...]:
        return tuple(_record(name, d) for name, d in self.outputs)

    def run(self, inputs: np.ndarray) -> dict[str, np.ndarray]:
        """Raw outputs (in the model's own types) for a batch of raw inputs."""
        if len(self.inputs) != 1:
            raise PublishError("the pipeline feeds TFLite models with one input")
        details = self.inputs[0][1]
        with self._lock:
            try:
                self.interpreter.resize_tensor_input(details["index"], list(inputs.shape))
                self.interpreter.allocate_tensors()
                self.interpreter.set_tensor(details["index"], inputs.astype(details["dtype"]))
                self.interpreter.invoke()
                return {
                    name: np.array(self.interpreter.get_tensor(d["index"]))
                    for name, d in self.outputs
                }
            except (ValueError, RuntimeError) as e:
                raise PublishError(f"running the TFLite model failed: {e}") from e

    def quantize_input(self, inputs: np.ndarray) -> np.ndarray:
        """Float samples in the input's type (quantized with its scale and zero point)."""
        details = self.inputs[0][1]
        dtype = np.dtype(details["dtype"])
        scale, zero_point = details["quantization"]
        if dtype.kind not in "iu" or not scale:
            return inputs.astype(dtype)
        info = np.iinfo(dtype)
        q = np.round(inputs / scale) + zero_point
        return np.clip(q, info.min, info.max).astype(dtype)

    def run_float(self, inputs: np.ndarray) -> np.ndarray:
        """The first output, dequantized, for float inputs: comparable with the ONNX model."""
        raw = self.run(self.quantize_input(inputs))[self.outputs[0][0]]
        scale, zero_point = self.outputs[0][1]["quantization"]
        if np.dtype(raw.dtype).kind in "iu" and scale:
            return (raw.astype(np.float32) - zero_point) * np.float32(scale)
        return raw.astype(np.float32)


def load_tflite(model: bytes) -> TFLiteModel | str:
    """The model in an interpreter, or the reason it cannot be run here."""
    module = _interpreter_module()
    if module is None:
        return "no TFLite interpreter here (pip install ai-edge-litert)"
    try:
        interpreter = module.Interpreter(model_content=model)
        interpreter.allocate_tensors()
    except (ValueError, RuntimeError) as e:
        raise PublishError(f"the TFLite file does not load: {e}") from e
    inputs, outputs = _named_details(interpreter)
    return TFLiteModel(interpreter, inputs, outputs)


def _named_details(interpreter: Any) -> tuple[list[Any], list[Any]]:
    """(name, details) pairs, by the single signature's names when it covers the graph."""
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    by_tensor = [(d["name"], d) for d in inputs], [(d["name"], d) for d in outputs]
    if len(interpreter.get_signature_list()) != 1:
        return by_tensor
    runner = interpreter.get_signature_runner()
    sig_in, sig_out = runner.get_input_details(), runner.get_output_details()
    if {d["index"] for d in sig_in.values()} != {d["index"] for d in inputs} or {
        d["index"] for d in sig_out.values()
    } != {d["index"] for d in outputs}:
        return by_tensor
    by_index = {d["index"]: d for d in (*inputs, *outputs)}  # full details, with signatures
    return (
        [(name, by_index[d["index"]]) for name, d in sig_in.items()],
        [(name, by_index[d["index"]]) for name, d in sig_out.items()],
    )


def _record(name: str, details: dict[str, Any]) -> TensorSpec:
    signature = details.get("shape_signature", details["shape"])
    shape = tuple(int(s) if s >= 0 else None for s in signature)
    return TensorSpec(name, datatype_of(np.empty(0, dtype=details["dtype"])), shape)
