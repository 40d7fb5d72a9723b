"""Running ONNX models in ONNX Runtime for the pipeline: sessions, specs, batched runs.

The publish pipeline feeds one input tensor (images, feature vectors), so a
model with several inputs is refused here with a clear error rather than fed
guesses. Batches follow the model: a dynamic first dimension takes up to
:data:`BATCH` samples per run, a fixed one takes exactly that many (and the
samples that do not fill a last batch are left out, which the sample count in
the report shows).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import TensorSpec, numpy_dtype

from .._errors import PublishError

__all__ = ["BATCH", "OnnxModel", "batches", "onnx_datatype"]

BATCH = 256  # samples per run for a dynamic batch dimension: small models, modest memory

_ORT_TYPES = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def onnx_datatype(ort_type: str) -> str:
    try:
        return _ORT_TYPES[ort_type]
    except KeyError:
        raise PublishError(f"unsupported tensor type {ort_type} in the model") from None


def _dimension(value: object) -> int | None:
    """ONNX Runtime reports a dynamic dimension as a name, None or a negative number."""
    return value if isinstance(value, int) and value >= 0 else None


@dataclass(frozen=True, eq=False)
class OnnxModel:
    """One model in an ONNX Runtime session on the CPU, with its tensor specs."""

    session: Any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def load(cls, model: bytes, what: str, *, optimize: bool = True) -> OnnxModel:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: warnings about unused initializers are noise
        if not optimize:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(
                model, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise PublishError(f"the {what} model does not load in ONNX Runtime: {e}") from e
        return cls(
            session,
            tuple(
                TensorSpec(t.name, onnx_datatype(t.type), tuple(_dimension(d) for d in t.shape))
                for t in session.get_inputs()
            ),
            tuple(
                TensorSpec(t.name, onnx_datatype(t.type), tuple(_dimension(d) for d in t.shape))
                for t in session.get_outputs()
            ),
        )

    @property
    def input(self) -> TensorSpec:
        """The single input the pipeline feeds."""
        if len(self.inputs) != 1:
            names = ", ".join(t.name for t in self.inputs)
            raise PublishError(f"the pipeline feeds models with one input; this one has: {names}")
        return self.inputs[0]

    @property
    def fixed_batch(self) -> int | None:
        shape = self.input.shape
        return shape[0] if shape and shape[0] is not None else None

    def run(self, inputs: np.ndarray) -> dict[str, np.ndarray]:
        """All outputs for ``inputs`` (batched to fit the model), by output name."""
        if len(self.input.shape) != inputs.ndim:
            raise PublishError(
                f"samples of shape {list(inputs.shape)} do not fit input {self.input.name!r} "
                f"{list(self.input.shape)}"
            )
        if self.input.datatype != "BYTES":
            inputs = inputs.astype(numpy_dtype(self.input.datatype), copy=False)
        names = [t.name for t in self.outputs]
        parts: list[list[np.ndarray]] = [[] for _ in names]
        for chunk in batches(inputs, self.fixed_batch):
            try:
                results = self.session.run(names, {self.input.name: chunk})
            except Exception as e:
                raise PublishError(f"running the model on samples failed: {e}") from e
            for part, result in zip(parts, results, strict=True):
                part.append(np.asarray(result))
        if not parts[0]:
            raise PublishError(f"{len(inputs)} samples do not fill one batch of {self.fixed_batch}")
        return {name: np.concatenate(part) for name, part in zip(names, parts, strict=True)}

    def first_output(self, inputs: np.ndarray) -> np.ndarray:
        return self.run(inputs)[self.outputs[0].name]


def batches(inputs: np.ndarray, fixed: int | None, size: int = BATCH) -> Iterator[np.ndarray]:
    """Runs of exactly ``fixed`` samples (a remainder is left out), else of up to ``size``."""
    size = fixed or size
    stop = len(inputs) - len(inputs) % size if fixed else len(inputs)
    for start in range(0, stop, size):
        yield np.ascontiguousarray(inputs[start : start + size])
