"""Checks on what a request's tensors hold, once their names, dtypes and shapes passed.

Two things a model cannot answer sensibly, found before anything runs:

* an **empty** tensor (a batch of zero rows): nothing to answer, and scoring
  it would fail deep inside numpy;
* **NaN or infinity** in a floating-point tensor: an INT8 model quantizes
  NaN to zero and answers "confidently", a float model passes NaN through to
  its output, and the hub would answer NaN logits. Models that take NaN as
  "missing" (tree ensembles exported to ONNX, for instance) are the
  exception; the agent's ``allow_non_finite=True`` lets such values through.

Cost: one ``isfinite`` pass per floating-point tensor, about 1.4 µs for a
784-value image (a sum would be a little cheaper, but warns on ``inf - inf``
and overflows on huge finite values); the count for the message is only
taken when something is off.
"""

from __future__ import annotations

import numpy as np

from ._errors import InvalidInputError

__all__ = ["check_values"]

_FLOATING = frozenset("fc")  # numpy dtype kinds: float, complex
_isfinite = np.isfinite


def check_values(named: dict[str, np.ndarray], *, allow_non_finite: bool) -> None:
    """Raise ``InvalidInputError`` for an empty tensor, or a non-finite value unless allowed."""
    for name, array in named.items():
        if array.size == 0:
            raise InvalidInputError(
                f"input {name!r} is empty (shape {list(array.shape)}): a request needs at "
                "least one row"
            )
        if allow_non_finite or array.dtype.kind not in _FLOATING:
            continue
        finite = _isfinite(array)
        if finite.all():
            continue
        bad = int(array.size - np.count_nonzero(finite))
        nan = int(np.count_nonzero(np.isnan(array)))
        raise InvalidInputError(
            f"input {name!r} holds {bad} non-finite value{'s' if bad != 1 else ''} "
            f"({nan} NaN, {bad - nan} infinite) of {array.size}; clean the input, or "
            "pass allow_non_finite=True to the agent if the model takes them"
        )
