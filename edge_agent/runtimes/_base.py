"""The runtime interface: one small abstract base, one private method per runtime.

Models describe their tensors with ``shared.TensorSpec`` (re-exported here as
``TensorSpec``): an Open Inference Protocol datatype and a shape whose free
dimensions are ``None``, the one convention every package uses.

``ModelRuntime.run`` is the public entry point and enforces, before the
runtime sees anything: every declared input is present and no unknown one;
each array has the declared datatype and a compatible shape (``None`` dims
are free); the total input size is within ``max_input_bytes``. Errors the
runtime raises on valid input become ``InferenceError``. Subclasses implement
``_run`` (and describe their model through ``inputs``, ``outputs`` and
``accelerator``).

``validate`` remembers the last (name, dtype, shape) it accepted for a
model with one input; an input with the same signature is accepted after
three comparisons instead of the full check (same dtype and shape means the
same datatype, a compatible shape and the same size).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn

import numpy as np

from shared import TensorError, TensorSpec, datatype_of

from .._errors import InferenceError, InvalidInputError

__all__ = ["ModelRuntime", "TensorSpec"]


class ModelRuntime(ABC):
    """A loaded model that runs on this device."""

    kind: ClassVar[str] = "runtime"
    # (name, dtype, shape, nbytes) of the last single input ``validate`` accepted.
    _accepted: tuple[str, np.dtype[Any], tuple[int, ...], int] | None = None

    def __init__(self, *, name: str, version: str, max_input_bytes: int = 16 * 1024 * 1024) -> None:
        self.name = name
        self.version = version
        self.max_input_bytes = max_input_bytes

    @property
    @abstractmethod
    def inputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    @abstractmethod
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    @abstractmethod
    def accelerator(self) -> str:
        """What actually runs the model, e.g. ``CPUExecutionProvider`` or ``XNNPACK``."""

    def validate_array(self, array: np.ndarray) -> dict[str, np.ndarray]:
        """``validate`` for a model with one input, given its array alone."""
        accepted = self._accepted
        if (
            accepted is not None
            and type(array) is np.ndarray
            and array.shape == accepted[2]
            and array.dtype == accepted[1]
            and accepted[3] <= self.max_input_bytes
        ):
            return {accepted[0]: array}
        specs = self.inputs
        if len(specs) != 1:
            raise InvalidInputError(
                f"model {self.name!r} has {len(specs)} inputs; pass a mapping of "
                f"name to array ({', '.join(s.name for s in specs)})"
            )
        return self.validate({specs[0].name: array})

    def validate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check ``inputs`` against the model's specs; raise ``InvalidInputError`` if off."""
        # Plain loops, no generators: this runs before every inference and
        # its cost counts against the runtime's overhead budget.
        accepted = self._accepted
        if accepted is not None and len(inputs) == 1:
            array = inputs.get(accepted[0])
            if (
                type(array) is np.ndarray
                and array.shape == accepted[2]
                and array.dtype == accepted[1]
                and accepted[3] <= self.max_input_bytes
            ):
                return {accepted[0]: array}
        specs = self.inputs
        for spec in specs:
            if spec.name not in inputs:
                self._reject_names(inputs)
        if len(inputs) != len(specs):
            self._reject_names(inputs)
        total = 0
        checked: dict[str, np.ndarray] = {}
        for spec in specs:
            name = spec.name
            array = inputs[name]
            if not isinstance(array, np.ndarray):
                raise InvalidInputError(
                    f"input {name!r} must be a numpy array, got {type(array).__name__}"
                )
            try:
                datatype = datatype_of(array)
            except TensorError as e:
                raise InvalidInputError(f"input {name!r}: {e}") from e
            if datatype != spec.datatype:
                raise InvalidInputError(
                    f"input {name!r} of model {self.name!r} must be {spec.datatype}, got {datatype}"
                )
            shape = array.shape
            declared = spec.shape
            fits = len(shape) == len(declared)
            if fits:
                for size, want in zip(shape, declared, strict=True):
                    if want is not None and want != size:
                        fits = False
                        break
            if not fits:
                raise InvalidInputError(
                    f"input {name!r} of model {self.name!r} must have shape "
                    f"{spec.datatype}{_shape_text(declared)}, got {list(shape)}"
                )
            total += array.nbytes
            checked[name] = array
        if total > self.max_input_bytes:
            raise InvalidInputError(
                f"inputs take {total} bytes; this runtime accepts at most {self.max_input_bytes}"
            )
        if len(checked) == 1 and type(array) is np.ndarray:
            self._accepted = (name, array.dtype, array.shape, total)
        return checked

    def _reject_names(self, inputs: Mapping[str, np.ndarray]) -> NoReturn:
        expected = {spec.name: spec for spec in self.inputs}
        missing = [n for n in expected if n not in inputs]
        unknown = [n for n in inputs if n not in expected]
        raise InvalidInputError(
            f"model {self.name!r} takes inputs "
            f"({', '.join(s.describe() for s in self.inputs)}); "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"unknown {unknown}" if unknown else "")
        )

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate, then run the model. Raises ``InvalidInputError`` or ``InferenceError``."""
        return self.run_validated(self.validate(inputs))

    def run_validated(self, checked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run inputs that ``validate`` returned (the agent checks once, before routing)."""
        try:
            return self._run(checked)
        except InvalidInputError:
            raise
        except Exception as e:  # the runtime's own errors, whatever their type
            raise InferenceError(f"{self.kind} failed on model {self.name!r}: {e}") from e

    @abstractmethod
    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the runtime's resources."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}@{self.version} on {self.accelerator}>"


def _shape_text(shape: tuple[int | None, ...]) -> str:
    """``[?, 28, 28]``, as ``describe`` writes a shape (without the name, which may hold ':')."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
