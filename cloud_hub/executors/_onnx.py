"""ONNX Runtime executor: CUDA when this onnxruntime build and machine have it, else CPU.

The session's provider list is ``["CUDAExecutionProvider", "CPUExecutionProvider"]``
when CUDA is available, so nodes CUDA cannot run fall back to CPU inside one
session; ``device`` reports the provider that actually leads, because ONNX
Runtime silently drops CUDA when its libraries fail to load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared import ONNX_DATATYPES, TensorSpec

from .._errors import RepositoryError
from ._base import Executor

__all__ = ["OnnxExecutor", "onnx_providers"]


def onnx_providers() -> list[str]:
    """The execution providers to ask for: CUDA first when this build offers it."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxExecutor(Executor):
    """Runs an ``.onnx`` file with ONNX Runtime."""

    platform = "onnxruntime"

    def __init__(
        self,
        path: str | Path,
        *,
        providers: Sequence[str] | None = None,
        intra_op_threads: int | None = None,
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
        try:
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=list(providers or onnx_providers())
            )
            self._inputs = tuple(_spec(arg) for arg in self._session.get_inputs())
            self._outputs = tuple(_spec(arg) for arg in self._session.get_outputs())
        except RepositoryError:
            raise
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/… types
            raise RepositoryError(f"{self.path}: ONNX Runtime cannot load it: {e}") from e
        self._output_names = [spec.name for spec in self._outputs]

    @property
    def device(self) -> str:
        return str(self._session.get_providers()[0])

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def _run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        results = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, (np.asarray(r) for r in results), strict=True))


def _spec(arg: Any) -> TensorSpec:
    datatype = ONNX_DATATYPES.get(arg.type)
    if datatype is None:
        raise RepositoryError(
            f"tensor {arg.name!r} has type {arg.type}, which the hub cannot serve"
        )
    # Symbolic ("batch"), unknown (None) and negative dims are all free.
    shape = tuple(d if isinstance(d, int) and d > 0 else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, datatype, shape)
