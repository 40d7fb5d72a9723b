"""The smoke test a device runs after an update, before it swaps the new model in.

A few real inputs and the outputs the published model gave on them here. The
device loads the downloaded model, runs these inputs and compares with
``atol``: a broken download, a runtime that cannot execute the model's ops or
a wrong input layout fails before the model serves anything.

Tolerance: a device's runtime is not the publisher's. Its kernels (fused
INT8 ones on one CPU, reference QDQ on another, an NPU) round differently,
so an exact comparison would fail good models. ``atol`` is the larger of

- a floor per method, relative to the largest output magnitude (INT8 output
  steps are about 1% of the output range, FP16 keeps 3 decimal digits), and
- four times what two ONNX Runtime execution paths already disagree by here:
  the graph optimized (fused kernels) versus not optimized at all.

Samples stay few and small: a device fetches the signed manifest with every
update (and manifests are capped at 1 MiB). Up to :data:`SAMPLES` inputs,
fewer when they would exceed :data:`MAX_SAMPLE_BYTES`; every tensor is
stored zstd-compressed when that is smaller (images with a plain background
shrink several times), then base64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shared import TensorSpec, encode_sample, numpy_dtype

__all__ = [
    "MAX_SAMPLE_BYTES",
    "SAMPLES",
    "pick_smoke_inputs",
    "smoke_test",
    "synthetic_inputs",
    "tolerance",
]

SAMPLES = 3
MAX_SAMPLE_BYTES = 192 * 1024  # raw input bytes, before zstd; base64 adds a third
_RELATIVE_FLOOR = {"none": 1e-4, "fp16": 1e-2, "int8-static": 2e-2, "int8-dynamic": 2e-2}
_INTEGER_STEPS = 2.0  # raw INT8 outputs (TFLite): two quantization steps


def pick_smoke_inputs(
    candidates: list[np.ndarray | None], fixed_batch: int | None
) -> np.ndarray | None:
    """The first few samples of the first non-empty candidate that fit the size cap."""
    for inputs in candidates:
        if inputs is None or len(inputs) == 0:
            continue
        count = fixed_batch or min(SAMPLES, len(inputs))
        if len(inputs) < count:
            continue
        while count > 1 and inputs[:count].nbytes > MAX_SAMPLE_BYTES:
            count -= 1
        if inputs[:count].nbytes > MAX_SAMPLE_BYTES or (fixed_batch and count != fixed_batch):
            return None
        return np.ascontiguousarray(inputs[:count])
    return None


def synthetic_inputs(record: TensorSpec, fixed_batch: int | None) -> np.ndarray | None:
    """Seeded noise in the input's shape, when the publisher gave no samples at all.

    Still a real check on the device (the model loads, runs and computes what
    it computed here), just not on meaningful data. None for non-float
    inputs or unknown dimensions beyond the batch.
    """
    floating = record.datatype in ("FP16", "FP32", "FP64")
    if not floating or not record.shape or any(d is None for d in record.shape[1:]):
        return None
    shape = (fixed_batch or SAMPLES, *(int(d) for d in record.shape[1:] if d is not None))
    noise = np.random.default_rng(0).standard_normal(shape)
    inputs = noise.astype(numpy_dtype(record.datatype))
    return inputs if inputs.nbytes <= MAX_SAMPLE_BYTES else None


def tolerance(method: str, outputs: dict[str, np.ndarray], path_diff: float = 0.0) -> float:
    """``atol`` for ``outputs`` of a model quantized with ``method`` (see the module doc)."""
    arrays = [np.asarray(a) for a in outputs.values()]
    if all(a.dtype.kind in "iu" for a in arrays):
        return _INTEGER_STEPS
    peak = max((float(np.max(np.abs(a))) for a in arrays if a.size), default=1.0)
    floor = _RELATIVE_FLOOR.get(method, 2e-2) * max(1.0, peak)
    return float(f"{max(floor, 4.0 * path_diff):.3g}")


def smoke_test(
    input_name: str,
    inputs: np.ndarray,
    outputs: dict[str, np.ndarray],
    method: str,
    path_diff: float = 0.0,
) -> dict[str, Any]:
    """The manifest's ``smoke_test`` object: ``inputs`` and what the model gave for them."""
    return {
        "inputs": {input_name: encode_sample(inputs, compress=True)},
        "outputs": {name: encode_sample(value, compress=True) for name, value in outputs.items()},
        "atol": tolerance(method, outputs, path_diff),
    }
