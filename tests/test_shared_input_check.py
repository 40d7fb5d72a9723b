"""One tensor-input check (``shared.InputChecker``) for the hub and devices.

The hub's ``InputChecker``/``check_inputs`` (``cloud_hub/batching/_queue.py``) and a
device's ``ModelRuntime.validate`` both run it and map its errors to their
own types; these tests pin the shared part, the remembered signatures and
the mapping at each boundary.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_hub import InvalidRequestError, RequestTooLargeError
from cloud_hub.batching._queue import InputChecker as HubChecker
from edge_agent import InvalidInputError
from edge_agent.runtimes import ModelRuntime
from shared import (
    InputChecker,
    InputTooLargeError,
    NonFiniteInputError,
    TensorInputError,
    TensorSpec,
    check_inputs,
    check_values,
)

ONE = (TensorSpec("x", "FP32", (None, 4)),)
TWO = (TensorSpec("a", "FP32", (2,)), TensorSpec("b", "INT64", (None,)))


class _Echo(ModelRuntime):
    """A device runtime that returns its inputs: the checks are all there is to it."""

    def __init__(self, specs: tuple[TensorSpec, ...], **kwargs: object) -> None:
        super().__init__(name="echo", version="1", **kwargs)  # type: ignore[arg-type]
        self._specs = specs

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._specs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._specs

    @property
    def accelerator(self) -> str:
        return "none"

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return inputs


def _verdict(call: object, *args: object, **kwargs: object) -> object:
    try:
        checked, rows, key = call(*args, **kwargs)  # type: ignore[operator]
    except TensorInputError as e:
        return type(e), str(e)
    return sorted(checked), rows, key


@settings(max_examples=80, deadline=None)
@given(
    a_shape=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    b_shape=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    a_dtype=st.sampled_from([np.float32, np.float64, np.int64]),
    batch=st.sampled_from([0, 2]),
)
def test_remembered_signatures_answer_as_the_full_check(
    a_shape: list[int], b_shape: list[int], a_dtype: type, batch: int
) -> None:
    """Kills: a signature without the dtype, or one remembered after a refusal."""
    inputs = {"a": np.zeros(a_shape, a_dtype), "b": np.zeros(b_shape, np.int64)}
    checker = InputChecker(TWO, max_batch_size=batch, model="m")
    expected = _verdict(check_inputs, inputs, TWO, max_batch_size=batch, model="m")
    float32 = {"a": np.zeros(a_shape, np.float32), "b": inputs["b"]}
    with contextlib.suppress(TensorInputError):  # remembered if it passes: maybe another dtype
        checker.check(float32)
    for _ in range(2):  # the second call may take the remembered path
        assert _verdict(checker.check, inputs) == expected


def test_a_single_array_is_checked_as_its_mapping_is() -> None:
    """Kills: ``check_array`` remembering by shape alone."""
    checker = InputChecker(ONE, max_input_bytes=64, model="m")
    good = np.zeros((2, 4), np.float32)
    assert checker.check_array(good)["x"] is good
    with pytest.raises(TensorInputError, match="must be FP32, got FP64"):
        checker.check_array(good.astype(np.float64))  # same shape as the remembered one
    with pytest.raises(InputTooLargeError, match="80 bytes; this runtime accepts at most 64"):
        checker.check_array(np.zeros((5, 4), np.float32))
    with pytest.raises(TensorInputError, match="pass a mapping of name to array \\(a, b\\)"):
        InputChecker(TWO, model="m").check_array(good)


def test_it_remembers_at_most_max_signatures() -> None:
    checker = InputChecker(ONE, model="m", max_signatures=2)
    for rows in range(1, 5):
        checker.check({"x": np.zeros((rows, 4), np.float32)})
    assert len(checker._accepted) == 2


def test_values_are_checked_apart_from_the_structure() -> None:
    """Kills: ``allow_empty`` ignored, or NaN counted as infinite."""
    empty = {"x": np.zeros((0, 4), np.float32)}
    check_values(empty, allow_non_finite=False, allow_empty=True)
    with pytest.raises(TensorInputError, match=r"'x' is empty \(shape \[0, 4\]\)"):
        check_values(empty, allow_non_finite=False, allow_empty=False)
    bad = np.array([[np.nan, np.inf, -np.inf, 1.0]], np.float32)
    with pytest.raises(NonFiniteInputError) as caught:
        check_values({"x": bad}, allow_non_finite=False, allow_empty=False)
    assert (caught.value.name, caught.value.count, caught.value.nan, caught.value.size) == (
        "x",
        3,
        1,
        4,
    )
    check_values({"x": bad}, allow_non_finite=True, allow_empty=False)
    check_values({"i": np.array([1, 2], np.int64)}, allow_non_finite=False, allow_empty=False)


def test_the_hub_maps_the_shared_errors_to_its_own() -> None:
    hub = HubChecker((TensorSpec("x", "FP32", (4,)),), max_batch_size=2, model="m")
    with pytest.raises(RequestTooLargeError, match="3 rows") as too_large:
        hub({"x": np.zeros((3, 4), np.float32)})
    assert isinstance(too_large.value.__cause__, InputTooLargeError)
    nan = np.zeros((1, 4), np.float32)
    nan[0, 0] = np.nan
    with pytest.raises(InvalidRequestError, match="1 NaN or infinite value") as non_finite:
        hub({"x": nan})
    assert isinstance(non_finite.value.__cause__, NonFiniteInputError)
    with pytest.raises(InvalidRequestError, match=r"must have shape \[\?, 4\], got \[4\]"):
        hub({"x": np.zeros(4, np.float32)})


def test_a_device_runtime_maps_the_shared_errors_to_its_own() -> None:
    runtime = _Echo(ONE, max_input_bytes=32)
    with pytest.raises(InvalidInputError, match=r"must have shape FP32\[\?, 4\], got \[4\]") as e:
        runtime.validate({"x": np.zeros(4, np.float32)})
    assert isinstance(e.value.__cause__, TensorInputError)
    with pytest.raises(InvalidInputError, match="48 bytes"):
        runtime.validate_array(np.zeros((3, 4), np.float32))


def test_a_runtime_takes_a_new_byte_limit_at_once() -> None:
    """Kills: the remembered signatures outliving a change of ``max_input_bytes``."""
    runtime = _Echo(ONE, max_input_bytes=1024)
    two_rows = np.zeros((2, 4), np.float32)
    assert runtime.validate_array(two_rows)["x"] is two_rows
    runtime.max_input_bytes = 16
    with pytest.raises(InvalidInputError, match="32 bytes; this runtime accepts at most 16"):
        runtime.validate_array(two_rows)
    with pytest.raises(InvalidInputError, match="32 bytes"):
        runtime.validate({"x": two_rows})
