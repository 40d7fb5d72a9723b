"""PyTorch executor: a TorchScript file, or an ``nn.Module`` built in Python.

torch is imported inside this module's functions only, so a hub that serves
ONNX models never pays for importing it (seconds, and hundreds of MiB).

Files are loaded with ``torch.jit.load`` (``model.pt``, TorchScript), whose
archive holds a graph and tensors read by TorchScript's restricted unpickler.
``torch.load`` of a pickled module is not offered, and neither are
``torch.export`` archives (``.pt2``): ``torch.export.load`` falls back to
``torch.load(weights_only=False)``, i.e. to unpickling arbitrary objects,
when a file's constants do not load safely. ``torch.jit.load`` is deprecated
upstream (torch 2.10+); its ``DeprecationWarning`` is silenced for that one
call, since TorchScript files are what most model zoos still ship.

The module takes its inputs positionally, in the order the config lists
them, and returns a tensor (one output), a tuple/list of tensors (in the
config's output order) or a dict of tensors keyed by output name. It runs
under ``torch.inference_mode()`` on CUDA when ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ExecutorError, RepositoryError
from ._base import Executor

if TYPE_CHECKING:
    import torch

__all__ = ["TorchExecutor"]


def default_torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class TorchExecutor(Executor):
    """Runs a PyTorch module; inputs positionally in ``input_names`` order."""

    platform = "torch"

    def __init__(
        self,
        module: torch.nn.Module | Any,
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        device: str | None = None,
    ) -> None:
        import torch

        if not input_names or not output_names:
            raise RepositoryError("a torch model needs input and output names (from the config)")
        self._torch = torch
        self._device = torch.device(device or default_torch_device())
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        try:
            module = module.to(self._device)
            with contextlib.suppress(NotImplementedError):  # torch.export modules have no
                module.eval()  # train mode to leave, and say so by raising
        except Exception as e:
            raise RepositoryError(f"cannot move the torch model to {self._device}: {e}") from e
        self._module = module

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        device: str | None = None,
    ) -> TorchExecutor:
        """Load a TorchScript file (``model.pt``) onto ``device`` (default: CUDA if available)."""
        import torch

        path = Path(path)
        target = device or default_torch_device()
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore",
                    message=r".*torch\.jit\.load.*deprecated",
                    category=DeprecationWarning,
                )
                module = torch.jit.load(str(path), map_location=target)
        except Exception as e:  # torch raises RuntimeError, ValueError, zipfile errors, …
            raise RepositoryError(f"{path}: torch cannot load it: {e}") from e
        return cls(module, input_names=input_names, output_names=output_names, device=target)

    @property
    def device(self) -> str:
        return str(self._device)

    def _run(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        torch = self._torch
        with torch.inference_mode():
            args = [
                torch.from_numpy(np.ascontiguousarray(inputs[name])).to(
                    self._device, non_blocking=True
                )
                for name in self.input_names
            ]
            result = self._module(*args)
            return self._outputs(result)

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        torch = self._torch
        if isinstance(result, torch.Tensor):
            values: Sequence[Any] = [result]
        elif isinstance(result, Mapping):
            missing = [n for n in self.output_names if n not in result]
            if missing:
                raise ExecutorError(f"torch model's result lacks outputs {missing}")
            values = [result[n] for n in self.output_names]
        elif isinstance(result, tuple | list):
            values = result
        else:
            raise ExecutorError(f"torch model returned {type(result).__name__}, not tensors")
        if len(values) != len(self.output_names):
            raise ExecutorError(
                f"torch model returned {len(values)} tensors for outputs {list(self.output_names)}"
            )
        return {
            name: value.detach().to("cpu").numpy()
            for name, value in zip(self.output_names, values, strict=True)
        }
