"""The executor interface: one small abstract base, one private method per runtime.

``Executor.run_batch`` is what the batcher calls. It enforces, around the
runtime's ``_run``: every result is a numpy array with exactly one row per
input row (so results can be split back to the requests of a batch), and any
error the runtime raises becomes ``ExecutorError`` (``raise … from e``), so a
broken model fails its batch, never the hub. ``run`` is the same without the
row check, for models served with ``max_batch_size = 0``.

Subclasses implement ``_run`` and may describe their model through
``inputs``/``outputs`` (full shapes, batch dimension included, -1 for a
free dimension) and ``device``. ``warm_up`` runs one all-zeros batch at load
time, so the first real request does not pay for lazy initialisation
(CUDA context, kernel selection, memory arenas) and a model that cannot run
is refused at load rather than on traffic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from shared import TensorSpec, numpy_dtype

from .._errors import ExecutorError, HubError

__all__ = ["CallableExecutor", "Executor"]


class Executor(ABC):
    """A loaded model that computes a batch of inputs into a batch of outputs."""

    platform: ClassVar[str] = "custom"

    @property
    def device(self) -> str:
        """What computes, e.g. ``cuda:0``, ``cpu`` or ``CUDAExecutionProvider``."""
        return "cpu"

    @property
    def inputs(self) -> tuple[TensorSpec, ...] | None:
        """The inputs the model file declares (full shapes), or ``None`` if it does not say."""
        return None

    @property
    def outputs(self) -> tuple[TensorSpec, ...] | None:
        """The outputs the model file declares (full shapes), or ``None`` if it does not say."""
        return None

    def run_batch(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a batch stacked along dim 0; every output has one row per input row."""
        rows = {a.shape[0] if a.ndim else -1 for a in inputs.values()}
        if len(rows) != 1 or -1 in rows:
            raise ExecutorError(
                f"a batch needs inputs of rank >= 1 that share dim 0, got shapes "
                f"{ {k: list(a.shape) for k, a in inputs.items()} }"
            )
        (n,) = rows
        outputs = self.run(inputs)
        bad = {k: list(a.shape) for k, a in outputs.items() if a.ndim == 0 or a.shape[0] != n}
        if bad:
            raise ExecutorError(
                f"{self.platform} model returned outputs {bad} for a batch of {n} rows; "
                "every output needs one row per input row"
            )
        return outputs

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once; foreign errors become ``ExecutorError``."""
        try:
            raw = self._run(dict(inputs))
        except HubError:
            raise
        except Exception as e:  # the runtime's own errors, whatever their type
            raise ExecutorError(f"{self.platform} model failed on {self.device}: {e}") from e
        if not isinstance(raw, Mapping) or not raw:
            raise ExecutorError(
                f"{self.platform} model returned {type(raw).__name__}; expected a non-empty "
                "mapping of output name to array"
            )
        outputs: dict[str, np.ndarray] = {}
        for name, value in raw.items():
            if not isinstance(name, str) or not isinstance(value, np.ndarray):
                raise ExecutorError(
                    f"{self.platform} model returned {name!r}: {type(value).__name__}; "
                    "outputs must be numpy arrays keyed by name"
                )
            outputs[name] = value
        return outputs

    def warm_up(self, inputs: Sequence[TensorSpec], *, batched: bool) -> None:
        """Run one all-zeros batch (one row; free dims of size 1)."""
        batch: dict[str, np.ndarray] = {}
        for spec in inputs:
            shape = tuple(1 if d is None else d for d in spec.shape)
            if batched:
                shape = (1, *shape)
            dtype = numpy_dtype(spec.datatype)
            batch[spec.name] = (
                np.full(shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)
            )
        if batched:
            self.run_batch(batch)
        else:
            self.run(batch)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model's resources (device memory, sessions)."""

    @abstractmethod
    def _run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        """Compute ``inputs``; return a mapping of output name to numpy array."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.platform} on {self.device}>"


class CallableExecutor(Executor):
    """A plain Python function as a model, for tests, benchmarks and glue code.

    ``fn`` takes a dict of input arrays and returns a dict of output arrays.
    """

    def __init__(
        self, fn: Callable[[dict[str, np.ndarray]], Mapping[str, Any]], *, device: str = "cpu"
    ) -> None:
        self._fn = fn
        self._device = device

    @property
    def device(self) -> str:
        return self._device

    def _run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        return self._fn(inputs)
