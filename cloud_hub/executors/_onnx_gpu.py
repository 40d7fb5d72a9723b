"""ONNX Runtime on a GPU: which execution providers, half precision, and IO binding.

``providers_for(device, ...)`` turns the hub's device words into ONNX
Runtime's provider list:

- ``"cpu"``: the CPU provider only;
- ``"cuda:N"`` (or ``"cuda"``, device 0): TensorRT first when this
  onnxruntime build has it, then CUDA, then CPU for the nodes neither runs.
  Asking for CUDA from a build without it is a ``RepositoryError``: a hub
  told to use a GPU must not quietly serve from the CPU;
- ``None``: CUDA (device 0) when the build has it, else the CPU.

TensorRT builds an engine per input-shape profile; the profile given here
spans batch 1 to the model's ``max_batch_size`` (optimised for the largest),
so serving never rebuilds an engine for a new batch size, and engines are
cached on disk (``TANDEM_TRT_CACHE``, default ``~/.cache/tandem/trt``) so a
restart does not pay for them again.

``fp16_model(path)``: the model converted to half precision inside, with
float32 inputs and outputs kept (ONNX Runtime's converter), for CUDA only;
the executor keeps it only when its outputs stay within ``FP16_TOLERANCE`` of
the float32 model's on the warm-up batch ("where the model allows").

``IoBoundRunner``: on CUDA, inputs are copied to the device once per batch
and outputs are bound to device memory and copied back once, instead of
ONNX Runtime allocating and copying through pageable host memory on every
``run``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import RepositoryError

__all__ = [
    "FP16_TOLERANCE",
    "IoBoundRunner",
    "Provider",
    "cuda_index",
    "fp16_agrees",
    "fp16_model",
    "providers_for",
    "trt_profile",
]

log = logging.getLogger(__name__)

FP16_TOLERANCE = 1e-2  # max |fp16 - fp32| / (max |fp32| + 1e-6) on the warm-up batch
Provider = str | tuple[str, dict[str, Any]]


def cuda_index(device: str | None) -> int | None:
    """The GPU index of ``cuda``/``cuda:N``, None for ``cpu``/None."""
    if device is None or device == "cpu":
        return None
    if device == "cuda":
        return 0
    head, _, index = device.partition(":")
    if head != "cuda" or not index.isdecimal():
        raise RepositoryError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
    return int(index)


def providers_for(
    device: str | None,
    *,
    available: Sequence[str],
    trt_shapes: tuple[str, str, str] | None = None,
    fp16: bool = False,
) -> list[Provider]:
    """ONNX Runtime's providers for ``device`` (see the module docstring)."""
    index = cuda_index(device)
    has_cuda = "CUDAExecutionProvider" in available
    if device == "cpu" or (device is None and not has_cuda):
        return ["CPUExecutionProvider"]
    if not has_cuda:
        raise RepositoryError(
            f"device {device} asked for, but this onnxruntime build has no CUDA provider "
            "(install onnxruntime-gpu)"
        )
    index = index or 0
    providers: list[Provider] = []
    if "TensorrtExecutionProvider" in available:
        options: dict[str, Any] = {
            "device_id": index,
            "trt_fp16_enable": fp16,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(_trt_cache()),
        }
        if trt_shapes is not None:
            low, high, best = trt_shapes
            options.update(
                trt_profile_min_shapes=low,
                trt_profile_max_shapes=high,
                trt_profile_opt_shapes=best,
            )
        providers.append(("TensorrtExecutionProvider", options))
    providers.append(("CUDAExecutionProvider", {"device_id": index}))
    providers.append("CPUExecutionProvider")
    return providers


def trt_profile(inputs: Sequence[Any], max_batch_size: int) -> tuple[str, str, str] | None:
    """TensorRT's min/max/opt shapes: batch 1 to ``max_batch_size``; None if not fixed."""
    if max_batch_size <= 0:
        return None
    low, high = [], []
    for spec in inputs:
        rest = spec.shape[1:]
        if any(d is None for d in rest):
            return None  # a free dimension besides the batch: let TensorRT pick
        dims = "x".join(str(d) for d in rest)
        low.append(f"{spec.name}:1x{dims}" if dims else f"{spec.name}:1")
        high.append(
            f"{spec.name}:{max_batch_size}x{dims}" if dims else f"{spec.name}:{max_batch_size}"
        )
    return ",".join(low), ",".join(high), ",".join(high)


def _trt_cache() -> Path:
    path = Path(os.environ.get("TANDEM_TRT_CACHE", Path.home() / ".cache" / "tandem" / "trt"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def fp16_model(path: Path) -> bytes:
    """``path``'s model in half precision, float32 at its inputs and outputs."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(path))
    converted = convert_float_to_float16(model, keep_io_types=True)
    return bytes(converted.SerializeToString())


def fp16_agrees(reference: Mapping[str, np.ndarray], half: Mapping[str, np.ndarray]) -> bool:
    """Whether the half-precision outputs stay within ``FP16_TOLERANCE`` of float32's."""
    for name, want in reference.items():
        got = half.get(name)
        if got is None or got.shape != want.shape:
            return False
        if want.dtype.kind != "f":
            if not np.array_equal(want, got):
                return False
            continue
        scale = float(np.max(np.abs(want))) + 1e-6 if want.size else 1.0
        if (
            not np.all(np.isfinite(got))
            or float(np.max(np.abs(got - want))) / scale > FP16_TOLERANCE
        ):
            return False
    return True


class IoBoundRunner:
    """Runs a CUDA session through an IO binding (inputs up once, outputs down once)."""

    def __init__(self, session: Any, output_names: Sequence[str], index: int) -> None:
        self._session = session
        self._outputs = list(output_names)
        self._index = index

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        import onnxruntime as ort

        binding = self._session.io_binding()
        for name, array in inputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(
                np.ascontiguousarray(array), "cuda", self._index
            )
            binding.bind_ortvalue_input(name, value)
        for name in self._outputs:
            binding.bind_output(name, "cuda", self._index)
        self._session.run_with_iobinding(binding)
        return list(binding.copy_outputs_to_cpu())
