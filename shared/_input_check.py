"""A request's tensors against a model's inputs: the one check the hub and devices share.

Pure: numpy and ``shared`` only, no clock, no lock, no I/O. Two steps,
because a model's declared inputs decide the first and only the values the
second:

- **structure** (``check_inputs``, ``InputChecker``): every declared input
  is present and no other; each is a numpy array of the declared datatype
  and a compatible shape (``None`` dims are free). With ``max_batch_size >
  0`` each array is ``[n, *dims]`` with the same ``n >= 1`` for every input
  and ``n <= max_batch_size`` (the hub's batching); with
  ``max_input_bytes`` the inputs' total size is bounded (a device's
  runtime). The answer is ``(inputs, rows, key)``: ``key`` is the
  non-batch dimensions, what requests that share a batch must agree on.
- **values** (``check_values``): an empty tensor, when refused, and NaN or
  infinity in a floating-point tensor (what a broken sensor or a bad cast
  sends, and a model answers with confident nonsense) unless allowed.

``InputChecker`` remembers the signatures it accepted (each input's name,
dtype and shape, at most ``max_signatures``): an input with a remembered
signature gets the same answer without the structural checks, which depend
on nothing else. Values are never remembered; ``check_values`` runs every
time.

Errors are ``shared.TensorInputError`` (``InputTooLargeError`` for too many
rows or bytes, ``NonFiniteInputError`` with the counts); each package maps
them to its own type at its boundary (``raise InvalidInputError(...) from
e``), so its callers see one exception tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ._errors import InputTooLargeError, NonFiniteInputError, TensorError, TensorInputError
from ._tensor_spec import TensorSpec
from ._tensors import datatype_of

__all__ = ["InputChecker", "ShapeKey", "check_inputs", "check_values"]

ShapeKey = tuple[tuple[int, ...], ...]
Checked = tuple[dict[str, np.ndarray], int, ShapeKey]

_FLOATING = frozenset("fc")  # numpy dtype kinds: float, complex
_isfinite = np.isfinite


def check_inputs(
    inputs: Mapping[str, object],
    specs: Sequence[TensorSpec],
    *,
    max_batch_size: int = 0,
    max_input_bytes: int | None = None,
    model: str = "model",
    shape_names_datatype: bool = True,
) -> Checked:
    """The structural checks (see the module docstring); returns (inputs, rows, shape key).

    ``shape_names_datatype``: a shape error writes the declared shape as
    ``FP32[?, 16]`` (True) or ``[?, 16]`` (the hub's wording, which names the
    datatype in its own error). Raises ``TensorInputError`` naming what is off.
    """
    batched = max_batch_size > 0
    # Plain loops, no generators: this runs before every inference it does not remember.
    for spec in specs:
        if spec.name not in inputs:
            _reject_names(inputs, specs, model, batched)
    if len(inputs) != len(specs):
        _reject_names(inputs, specs, model, batched)
    checked: dict[str, np.ndarray] = {}
    total = 0
    rows: set[int] = set()
    key: list[tuple[int, ...]] = []
    for spec in specs:
        name = spec.name
        array = inputs[name]
        if not isinstance(array, np.ndarray):
            raise TensorInputError(
                f"input {name!r} must be a numpy array, got {type(array).__name__}"
            )
        try:
            datatype = datatype_of(array)
        except TensorError as e:
            raise TensorInputError(f"input {name!r}: {e}") from e
        if datatype != spec.datatype:
            raise TensorInputError(
                f"input {name!r} of model {model!r} must be {spec.datatype}, got {datatype}"
            )
        shape = array.shape
        declared = (None, *spec.shape) if batched else spec.shape
        fits = len(shape) == len(declared) and not (batched and shape[0] < 1)
        if fits:
            for size, want in zip(shape, declared, strict=True):
                if want is not None and want != size:
                    fits = False
                    break
        if not fits:
            written = _shape_text(declared)
            raise TensorInputError(
                f"input {name!r} of model {model!r} must have shape "
                f"{spec.datatype + written if shape_names_datatype else written}, "
                f"got {list(shape)}"
            )
        if batched:
            rows.add(shape[0])
            key.append(tuple(shape[1:]))
        total += array.nbytes
        checked[name] = array
    if max_input_bytes is not None and total > max_input_bytes:
        raise InputTooLargeError(
            f"inputs take {total} bytes; this runtime accepts at most {max_input_bytes}"
        )
    if not batched:
        return checked, 1, ()
    if len(rows) != 1:
        raise TensorInputError(
            f"inputs of one request must have the same number of rows (dim 0), got {sorted(rows)}"
        )
    (n,) = rows
    if n > max_batch_size:
        raise InputTooLargeError(
            f"request has {n} rows; model {model!r} takes at most {max_batch_size} per batch"
        )
    return checked, n, tuple(key)


class InputChecker:
    """``check_inputs`` for one model, remembering the input signatures it accepted.

    ``check`` takes a mapping of name to array and answers as
    ``check_inputs`` does; ``check_array`` the array alone, for a model with
    one input, and answers with the checked inputs only.
    """

    __slots__ = (
        "_accepted",
        "_only",
        "max_batch_size",
        "max_input_bytes",
        "max_signatures",
        "model",
        "shape_names_datatype",
        "specs",
    )

    def __init__(
        self,
        specs: Sequence[TensorSpec],
        *,
        max_batch_size: int = 0,
        max_input_bytes: int | None = None,
        model: str = "model",
        shape_names_datatype: bool = True,
        max_signatures: int = 256,
    ) -> None:
        self.specs = tuple(specs)
        self.max_batch_size = max_batch_size
        self.max_input_bytes = max_input_bytes
        self.model = model
        self.shape_names_datatype = shape_names_datatype
        self.max_signatures = max_signatures
        self._only = self.specs[0].name if len(self.specs) == 1 else None
        # signature (name, dtype, shape, name, dtype, shape, ...) -> (rows, key)
        self._accepted: dict[tuple[Any, ...], tuple[int, ShapeKey]] = {}

    def check(self, inputs: Mapping[str, object]) -> Checked:
        only = self._only
        if only is not None and len(inputs) == 1:  # the common case, without a loop
            array = inputs.get(only)
            if type(array) is np.ndarray:
                known = self._accepted.get((only, array.dtype, array.shape))
                if known is not None:
                    return {only: array}, known[0], known[1]
        signature = _signature(inputs)
        if signature is not None:
            known = self._accepted.get(signature)
            if known is not None:
                return dict(inputs), known[0], known[1]  # type: ignore[arg-type]  # all arrays
        checked = check_inputs(
            inputs,
            self.specs,
            max_batch_size=self.max_batch_size,
            max_input_bytes=self.max_input_bytes,
            model=self.model,
            shape_names_datatype=self.shape_names_datatype,
        )
        if signature is not None and len(self._accepted) < self.max_signatures:
            self._accepted[signature] = (checked[1], checked[2])
        return checked

    def check_array(self, array: object) -> dict[str, np.ndarray]:
        """The checked inputs by name (a device's call, which needs neither rows nor key)."""
        name = self._only
        if type(array) is np.ndarray and (name, array.dtype, array.shape) in self._accepted:
            return {name: array}  # type: ignore[dict-item]  # remembered: name is not None
        if name is None:
            raise TensorInputError(
                f"model {self.model!r} has {len(self.specs)} inputs; pass a mapping of "
                f"name to array ({', '.join(s.name for s in self.specs)})"
            )
        return self.check({name: array})[0]


def check_values(
    named: Mapping[str, np.ndarray], *, allow_non_finite: bool, allow_empty: bool
) -> None:
    """Refuse an empty tensor (unless ``allow_empty``), then NaN or inf (unless allowed).

    Cost: one ``isfinite`` pass per floating-point tensor, about 1.4 µs for a
    784-value image (a sum would be a little cheaper, but warns on ``inf -
    inf`` and overflows on huge finite values); the counts for the message
    are only taken when something is off.
    """
    for name, array in named.items():
        if not allow_empty and array.size == 0:
            raise TensorInputError(
                f"input {name!r} is empty (shape {list(array.shape)}): a request needs at "
                "least one row"
            )
        if allow_non_finite or array.dtype.kind not in _FLOATING:
            continue
        finite = _isfinite(array)
        if finite.all():
            continue
        bad = int(array.size - np.count_nonzero(finite))
        raise NonFiniteInputError(name, bad, int(np.count_nonzero(np.isnan(array))), array.size)


def _signature(inputs: Mapping[str, object]) -> tuple[Any, ...] | None:
    parts: list[Any] = []
    for name, array in inputs.items():
        if type(array) is not np.ndarray:
            return None
        parts += (name, array.dtype, array.shape)
    return tuple(parts)


def _reject_names(
    inputs: Mapping[str, object], specs: Sequence[TensorSpec], model: str, batched: bool
) -> NoReturn:
    declared = {spec.name for spec in specs}
    missing = [spec.name for spec in specs if spec.name not in inputs]
    unknown = [name for name in inputs if name not in declared]
    problems = ([f"missing {missing}"] if missing else []) + (
        [f"unknown {unknown}"] if unknown else []
    )
    raise TensorInputError(
        f"model {model!r} takes inputs ({', '.join(s.describe(batched=batched) for s in specs)}); "
        + "; ".join(problems)
    )


def _shape_text(shape: tuple[int | None, ...]) -> str:
    """``[?, 28, 28]``, as ``describe`` writes a shape (without the name, which may hold ':')."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
