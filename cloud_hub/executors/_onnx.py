"""ONNX Runtime executor: on a GPU when asked or available, else on the CPU.

``device`` picks the providers (``_onnx_gpu.providers_for``): ``None`` runs on
CUDA when this build has it, else the CPU; ``"cpu"``; ``"cuda:N"`` (TensorRT
first when installed, then CUDA, with the CPU for nodes neither runs). On
CUDA, batches go through an IO binding, and ``fp16=True`` serves a
half-precision copy of the model when its outputs agree with float32's on the
warm-up batch. ``device`` (the property) reports what actually leads, with
its GPU index, because ONNX Runtime silently drops CUDA when its libraries
fail to load.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared import ONNX_DATATYPES, TensorSpec, numpy_dtype

from .._errors import RepositoryError
from ._base import Executor
from ._onnx_gpu import (
    IoBoundRunner,
    Provider,
    cuda_index,
    fp16_agrees,
    fp16_model,
    providers_for,
    trt_profile,
)

log = logging.getLogger(__name__)
_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")

__all__ = ["OnnxExecutor", "onnx_providers"]


def onnx_providers(device: str | None = None) -> list[Provider]:
    """The execution providers to ask for ``device`` (CUDA first when this build offers it)."""
    import onnxruntime as ort

    return providers_for(device, available=ort.get_available_providers())


class OnnxExecutor(Executor):
    """Runs an ``.onnx`` file with ONNX Runtime."""

    platform = "onnxruntime"

    def __init__(
        self,
        path: str | Path,
        *,
        providers: Sequence[Provider] | None = None,
        intra_op_threads: int | None = None,
        device: str | None = None,
        fp16: bool = False,
        max_batch_size: int = 0,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: ORT's warnings go to stderr, not logging
        if intra_op_threads is not None:
            options.intra_op_num_threads = intra_op_threads
        # ORT's pool threads spin between runs by default. The hub's MQTT and batching
        # threads share these cores; spinning workers starved them (p50 x4 on 2 cores).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.path = Path(path)
        self._options = options
        self._gpu = cuda_index(device)
        try:
            if providers is None:
                available = ort.get_available_providers()
                shapes = None
                if "TensorrtExecutionProvider" in available and device != "cpu":
                    # TensorRT's shape profile needs the inputs before the real session.
                    probe = ort.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
                    shapes = trt_profile([_spec(a) for a in probe.get_inputs()], max_batch_size)
                    del probe
                providers = providers_for(device, available=available, trt_shapes=shapes, fp16=fp16)
            self._providers = list(providers)
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=self._providers
            )
            self._inputs = tuple(_spec(arg) for arg in self._session.get_inputs())
            self._outputs = tuple(_spec(arg) for arg in self._session.get_outputs())
        except RepositoryError:
            raise
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/… types
            raise RepositoryError(f"{self.path}: ONNX Runtime cannot load it: {e}") from e
        self._output_names = [spec.name for spec in self._outputs]
        self._on_cuda = self._session.get_providers()[0] in _GPU_PROVIDERS
        self._runner = (
            IoBoundRunner(self._session, self._output_names, self._gpu or 0)
            if self._on_cuda
            else None
        )
        self.fp16 = False
        self._want_fp16 = fp16

    @property
    def device(self) -> str:
        leader = str(self._session.get_providers()[0])
        return f"{leader}:{self._gpu or 0}" if leader in _GPU_PROVIDERS else leader

    def warm_up(self, inputs: Sequence[TensorSpec], *, batched: bool) -> None:
        """Warm up; with ``fp16`` on a GPU, switch to half precision if it agrees."""
        super().warm_up(inputs, batched=batched)
        if self._want_fp16 and not self.fp16:
            self._try_fp16(inputs, batched)

    def _try_fp16(self, inputs: Sequence[TensorSpec], batched: bool) -> None:
        import onnxruntime as ort

        if not self._on_cuda:
            log.warning(
                "%s: fp16 asked for, but the model runs on the CPU; serving float32", self.path
            )
            return
        batch = _random_batch(inputs, batched)
        reference = self.run(batch)
        try:
            half = ort.InferenceSession(
                fp16_model(self.path), sess_options=self._options, providers=self._providers
            )
            runner = IoBoundRunner(half, self._output_names, self._gpu or 0)
            names = self._output_names
            outputs = dict(zip(names, runner.run(batch), strict=True))
        except Exception as e:  # a model the converter or a provider cannot take
            log.warning("%s: no fp16 version (%s); serving float32", self.path, e)
            return
        if not fp16_agrees(reference, outputs):
            log.warning("%s: fp16 outputs differ from float32's; serving float32", self.path)
            return
        self._session, self._runner, self.fp16 = half, runner, True
        log.info("%s: serving in fp16 on %s", self.path, self.device)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def _run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        if self._runner is not None:
            results = self._runner.run(inputs)
        else:
            results = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, (np.asarray(r) for r in results), strict=True))


def _random_batch(inputs: Sequence[TensorSpec], batched: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    batch: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = tuple(1 if d is None else d for d in spec.shape)
        shape = (8, *shape) if batched else shape
        dtype = numpy_dtype(spec.datatype)
        batch[spec.name] = (
            rng.standard_normal(shape).astype(dtype)
            if dtype.kind == "f"
            else np.zeros(shape, dtype)
        )
    return batch


def _spec(arg: Any) -> TensorSpec:
    datatype = ONNX_DATATYPES.get(arg.type)
    if datatype is None:
        raise RepositoryError(
            f"tensor {arg.name!r} has type {arg.type}, which the hub cannot serve"
        )
    # Symbolic ("batch"), unknown (None) and negative dims are all free.
    shape = tuple(d if isinstance(d, int) and d > 0 else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, datatype, shape)
