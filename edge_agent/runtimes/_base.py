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

The checks are ``shared.InputChecker``'s, the hub's too: it remembers the
input signatures (names, dtypes, shapes) it accepted, so an input with a
remembered signature is accepted after one dictionary lookup instead of the
full check (same dtype and shape means the same datatype, a compatible shape
and the same size). Its errors become ``InvalidInputError`` here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from shared import InputChecker, TensorInputError, TensorSpec

from .._errors import InferenceError, InvalidInputError

__all__ = ["ModelRuntime", "TensorSpec"]


class ModelRuntime(ABC):
    """A loaded model that runs on this device."""

    kind: ClassVar[str] = "runtime"
    _checker: InputChecker | None = None  # ``shared.InputChecker`` for this model

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

    @property
    def max_input_bytes(self) -> int:
        return self._max_input_bytes

    @max_input_bytes.setter
    def max_input_bytes(self, value: int) -> None:
        self._max_input_bytes = value
        self._checker = None  # the next check builds one with the new limit

    def validate_array(self, array: np.ndarray) -> dict[str, np.ndarray]:
        """``validate`` for a model with one input, given its array alone."""
        try:
            return (self._checker or self._new_checker()).check_array(array)
        except TensorInputError as e:
            raise InvalidInputError(str(e)) from e

    def validate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check ``inputs`` against the model's specs; raise ``InvalidInputError`` if off."""
        try:
            return (self._checker or self._new_checker()).check(inputs)[0]
        except TensorInputError as e:
            raise InvalidInputError(str(e)) from e

    def _new_checker(self) -> InputChecker:
        """Built at the first check: a subclass knows its ``inputs`` once its model loaded."""
        self._checker = InputChecker(
            self.inputs, max_input_bytes=self.max_input_bytes, model=self.name
        )
        return self._checker

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
