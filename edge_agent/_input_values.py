"""Checks on what a request's tensors hold, once their names, dtypes and shapes passed.

Two things a model cannot answer sensibly, found before anything runs:

* an **empty** tensor (a batch of zero rows): nothing to answer, and scoring
  it would fail deep inside numpy;
* **NaN or infinity** in a floating-point tensor: an INT8 model quantizes
  NaN to zero and answers "confidently", a float model passes NaN through to
  its output, and the hub would answer NaN logits. Models that take NaN as
  "missing" (tree ensembles exported to ONNX, for instance) are the
  exception; the agent's ``allow_non_finite=True`` lets such values through.

The checks are ``shared.check_values`` (the hub's too); its errors become
``InvalidInputError`` here, with the agent's own hint.
"""

from __future__ import annotations

import numpy as np

from shared import NonFiniteInputError, TensorInputError
from shared import check_values as shared_check_values

from ._errors import InvalidInputError

__all__ = ["check_deadline", "check_values"]


def check_values(named: dict[str, np.ndarray], *, allow_non_finite: bool) -> None:
    """Raise ``InvalidInputError`` for an empty tensor, or a non-finite value unless allowed."""
    try:
        shared_check_values(named, allow_non_finite=allow_non_finite, allow_empty=False)
    except NonFiniteInputError as e:
        raise InvalidInputError(
            f"{e}; clean the input, or pass allow_non_finite=True to the agent if the model "
            "takes them"
        ) from e
    except TensorInputError as e:
        raise InvalidInputError(str(e)) from e


def check_deadline(value: object, name: str = "deadline_ms") -> float:
    """``value`` as a deadline in milliseconds: a positive, finite real number.

    A string (``"50"``), a bool, ``None`` or an array is refused with
    ``InvalidInputError`` naming its type, rather than coerced: ``float("50")``
    would make a typo in a caller's configuration pass silently.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidInputError(
            f"{name} must be a number of milliseconds (int or float), got "
            f"{type(value).__name__} {value!r}"
        )
    deadline = float(value)
    if not 0 < deadline < float("inf"):
        raise InvalidInputError(f"{name} must be positive and finite, got {value!r}")
    return deadline
