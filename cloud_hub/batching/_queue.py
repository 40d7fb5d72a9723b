"""The dynamic batcher's pure logic: argument checks, batch formation, stacking, splitting.

Nothing here touches a clock, a thread or a lock: times come in as
arguments, so every rule below is tested with plain numbers.

Invariants of ``RequestQueue.take(now)``:

- requests leave in arrival order among those that can share a batch;
  requests share a batch only if their non-batch dimensions are equal (their
  ``key``), because stacking along dim 0 needs equal trailing shapes;
- a batch never holds more than ``max_batch_size`` rows (a request of n rows
  counts n); a request larger than that never enters (``check_inputs``);
- a request whose deadline is at or before ``now`` is returned as expired,
  never in a batch (the device has given up on it: computing is waste);
- a batch leaves when it is full (``max_batch_size`` rows, or the next
  request of its key does not fit), when ``max_queue_delay`` has passed since
  its oldest request arrived, when the caller flushes, or when the caller's
  executor is idle (``idle``) and the request is alone in the queue;
  otherwise ``take`` says when to look again: the end of that window or the
  next deadline, whichever is first. The window is there to let company
  arrive while a batch computes or while requests keep coming; a lone
  request for an idle executor would only wait it out;
- with ``max_batch_size == 0`` (a model without a batch dimension) every
  request is its own batch, at once;
- ``push`` refuses beyond ``max_queue_size`` requests (``OverloadedError``):
  a bounded queue answers "overloaded" at once instead of growing latency.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from shared import InputChecker as SharedInputChecker
from shared import (
    InputTooLargeError,
    NonFiniteInputError,
    ShapeKey,
    TensorInputError,
    TensorSpec,
    check_values,
)
from shared import check_inputs as check_structure

from .._errors import InvalidRequestError, OverloadedError, RequestTooLargeError

__all__ = [
    "InputChecker",
    "PendingRequest",
    "RequestQueue",
    "Take",
    "check_inputs",
    "split_outputs",
    "stack_inputs",
]


@dataclass(eq=False)
class PendingRequest:
    """One queued request; ``ticket`` is the caller's handle (a future), opaque here."""

    inputs: dict[str, np.ndarray]
    rows: int
    key: ShapeKey
    arrival: float
    deadline: float | None = None
    ticket: Any = None


@dataclass
class Take:
    """What ``RequestQueue.take`` decided: a batch to run, requests to expire, when to look."""

    batch: list[PendingRequest] = field(default_factory=list)
    expired: list[PendingRequest] = field(default_factory=list)
    wake_at: float | None = None  # None: nothing to wait for but the next push


class RequestQueue:
    """A bounded FIFO of pending requests that forms batches (see module docstring)."""

    def __init__(
        self, *, max_batch_size: int, max_queue_delay_s: float, max_queue_size: int
    ) -> None:
        if max_batch_size < 0 or max_queue_delay_s < 0 or max_queue_size < 1:
            raise ValueError(
                "need max_batch_size >= 0, max_queue_delay_s >= 0, max_queue_size >= 1"
            )
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_size = max_queue_size
        self._items: deque[PendingRequest] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[PendingRequest]:
        return iter(self._items)

    def push(self, request: PendingRequest) -> None:
        if len(self._items) >= self.max_queue_size:
            raise OverloadedError(
                f"queue full ({self.max_queue_size} requests waiting); try again later"
            )
        self._items.append(request)

    def drain(self) -> list[PendingRequest]:
        """Remove and return everything queued."""
        items = list(self._items)
        self._items.clear()
        return items

    def discard(self, doomed: Callable[[PendingRequest], bool]) -> list[PendingRequest]:
        """Remove and return the requests ``doomed`` picks (the others keep their order)."""
        removed = [r for r in self._items if doomed(r)]
        if removed:
            self._items = deque(r for r in self._items if not doomed(r))
        return removed

    def take(self, now: float, *, flush: bool = False, idle: bool = False) -> Take:
        result = Take()
        if any(r.deadline is not None and r.deadline <= now for r in self._items):
            kept: deque[PendingRequest] = deque()
            for r in self._items:
                (result.expired if r.deadline is not None and r.deadline <= now else kept).append(r)
            self._items = kept
        if not self._items:
            return result
        head = self._items[0]
        if self.max_batch_size == 0 or (idle and len(self._items) == 1):
            result.batch.append(self._items.popleft())
            return result
        rows = 0
        full = False
        for r in self._items:
            if r.key != head.key:
                continue
            if rows + r.rows > self.max_batch_size:
                full = True
                break
            result.batch.append(r)
            rows += r.rows
        full = full or rows == self.max_batch_size
        window_end = head.arrival + self.max_queue_delay_s
        if full or flush or now >= window_end:
            taken = {id(r) for r in result.batch}
            self._items = deque(r for r in self._items if id(r) not in taken)
            return result
        result.batch = []
        deadlines = [r.deadline for r in self._items if r.deadline is not None]
        result.wake_at = min([window_end, *deadlines])
        return result


class InputChecker:
    """``check_inputs`` for one model, remembering the input signatures it accepted.

    ``shared.InputChecker`` does the structural checks and remembers (at most
    ``max_signatures``) signatures; the values (NaN and inf) are checked
    every time.
    """

    def __init__(
        self,
        specs: Sequence[TensorSpec],
        *,
        max_batch_size: int,
        model: str = "model",
        allow_non_finite: bool = False,
        max_signatures: int = 256,
    ) -> None:
        self.specs = tuple(specs)
        self.max_batch_size = max_batch_size
        self.model = model
        self.allow_non_finite = allow_non_finite
        self._check = SharedInputChecker(
            self.specs,
            max_batch_size=max_batch_size,
            model=model,
            shape_names_datatype=False,  # the datatype has its own error
            max_signatures=max_signatures,
        )

    def __call__(self, inputs: Mapping[str, object]) -> tuple[dict[str, np.ndarray], int, ShapeKey]:
        try:
            checked = self._check.check(inputs)
            check_values(checked[0], allow_non_finite=self.allow_non_finite, allow_empty=True)
        except TensorInputError as e:
            _refuse(e, self.model)
        return checked


def check_inputs(
    inputs: Mapping[str, object],
    specs: Sequence[TensorSpec],
    *,
    max_batch_size: int,
    model: str = "model",
    allow_non_finite: bool = False,
) -> tuple[dict[str, np.ndarray], int, ShapeKey]:
    """Check a request against the model's inputs; return (inputs, rows, shape key).

    With ``max_batch_size > 0`` each array is ``[n, *dims]`` with the same
    n >= 1 for all inputs, and n <= ``max_batch_size``. Floating-point inputs
    must be finite (NaN and inf are what a broken sensor or a bad cast send, and
    a model answers them with confident nonsense) unless ``allow_non_finite``.
    Raises ``InvalidRequestError`` (or ``RequestTooLargeError``) naming what is off.
    The checks are ``shared.check_inputs`` and ``shared.check_values``.
    """
    try:
        checked = check_structure(
            inputs, specs, max_batch_size=max_batch_size, model=model, shape_names_datatype=False
        )
        check_values(checked[0], allow_non_finite=allow_non_finite, allow_empty=True)
    except TensorInputError as e:
        _refuse(e, model)
    return checked


def _refuse(e: TensorInputError, model: str) -> NoReturn:
    """``shared``'s input error as the hub's own."""
    if isinstance(e, NonFiniteInputError):
        raise InvalidRequestError(
            f"input {e.name!r} of model {model!r} holds {e.count} NaN or infinite value(s); the "
            "model allows finite numbers only (config: allow_non_finite)"
        ) from e
    if isinstance(e, InputTooLargeError):
        raise RequestTooLargeError(str(e)) from e
    raise InvalidRequestError(str(e)) from e


def stack_inputs(batch: Sequence[PendingRequest]) -> dict[str, np.ndarray]:
    """Concatenate the batch's inputs along dim 0 (no copy for a batch of one)."""
    if len(batch) == 1:
        return dict(batch[0].inputs)
    return {name: np.concatenate([r.inputs[name] for r in batch]) for name in batch[0].inputs}


def split_outputs(
    outputs: Mapping[str, np.ndarray], rows: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """Cut batch outputs back into per-request outputs of ``rows[i]`` rows each."""
    parts: list[dict[str, np.ndarray]] = []
    start = 0
    for n in rows:
        parts.append({name: value[start : start + n] for name, value in outputs.items()})
        start += n
    return parts
