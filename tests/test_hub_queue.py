"""The batcher's pure rules: argument checks, batch formation with explicit times, split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_hub import InvalidRequestError, OverloadedError, RequestTooLargeError, TensorSpec
from cloud_hub.batching._queue import (
    InputChecker,
    PendingRequest,
    RequestQueue,
    check_inputs,
    split_outputs,
    stack_inputs,
)

SPECS = (TensorSpec("x", "FP32", (16,)),)


def pending(rows: int = 1, *, at: float = 0.0, deadline: float | None = None, width: int = 16):
    x = np.full((rows, width), at, dtype=np.float32)
    return PendingRequest({"x": x}, rows, ((width,),), at, deadline)


def make_queue(batch: int = 8, delay_s: float = 1.0, size: int = 100) -> RequestQueue:
    return RequestQueue(max_batch_size=batch, max_queue_delay_s=delay_s, max_queue_size=size)


# -- check_inputs ----------------------------------------------------------------------------


def test_check_inputs_accepts_a_batch_and_reports_rows_and_key():
    x = np.zeros((3, 16), np.float32)
    checked, rows, key = check_inputs({"x": x}, SPECS, max_batch_size=8)
    assert checked["x"] is x and rows == 3 and key == ((16,),)


@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        ({"x": np.zeros((2, 16), np.float64)}, "must be FP32, got FP64"),
        ({"x": np.zeros((2, 15), np.float32)}, "must have shape [?, 16], got [2, 15]"),
        ({"x": np.zeros((16,), np.float32)}, "must have shape"),
        ({"x": np.zeros((0, 16), np.float32)}, "must have shape"),
        ({"y": np.zeros((1, 16), np.float32)}, "missing ['x']; unknown ['y']"),
        ({"x": [[0.0] * 16]}, "must be a numpy array"),
    ],
)
def test_check_inputs_names_what_is_wrong(inputs, fragment):
    with pytest.raises(InvalidRequestError) as caught:
        check_inputs(inputs, SPECS, max_batch_size=8, model="linear")
    assert fragment in str(caught.value)


def test_check_inputs_refuses_more_rows_than_a_batch_holds():
    with pytest.raises(RequestTooLargeError, match="9 rows"):
        check_inputs({"x": np.zeros((9, 16), np.float32)}, SPECS, max_batch_size=8)


def test_check_inputs_needs_equal_rows_across_inputs():
    specs = (TensorSpec("a", "FP32", (2,)), TensorSpec("b", "INT64", (None,)))
    inputs = {"a": np.zeros((2, 2), np.float32), "b": np.zeros((3, 5), np.int64)}
    with pytest.raises(InvalidRequestError, match="same number of rows"):
        check_inputs(inputs, specs, max_batch_size=8)


def test_check_inputs_free_dims_go_into_the_key():
    specs = (TensorSpec("tokens", "INT64", (None,)),)
    _, _, key = check_inputs({"tokens": np.zeros((2, 7), np.int64)}, specs, max_batch_size=8)
    assert key == ((7,),)


def test_check_inputs_without_batching_takes_the_full_shape():
    specs = (TensorSpec("image", "UINT8", (4, 4)),)
    _, rows, key = check_inputs({"image": np.zeros((4, 4), np.uint8)}, specs, max_batch_size=0)
    assert (rows, key) == (1, ())


# -- RequestQueue.take -----------------------------------------------------------------------


def test_a_batch_waits_for_its_window_then_leaves_with_everything_that_came():
    q = make_queue(batch=8, delay_s=1.0)
    a, b, c = pending(at=0.0), pending(at=0.2), pending(2, at=0.5)
    for r in (a, b, c):
        q.push(r)
    early = q.take(0.9)
    assert early.batch == [] and early.wake_at == pytest.approx(1.0)
    due = q.take(1.0)
    assert due.batch == [a, b, c] and len(q) == 0


def test_a_full_batch_leaves_before_its_window():
    q = make_queue(batch=4, delay_s=10.0)
    first = [pending(2, at=0.0), pending(2, at=0.1)]
    rest = pending(1, at=0.2)
    for r in [*first, rest]:
        q.push(r)
    assert q.take(0.3).batch == first
    assert q.take(0.3).batch == []  # the rest waits for its own window
    assert q.take(10.2).batch == [rest]


def test_a_batch_leaves_when_the_next_request_does_not_fit():
    q = make_queue(batch=4, delay_s=10.0)
    a, big = pending(3, at=0.0), pending(2, at=0.1)
    q.push(a)
    q.push(big)
    assert q.take(0.2).batch == [a]  # 3 + 2 > 4: waiting cannot make it fuller
    assert q.take(0.2).batch == []


def test_requests_of_another_shape_wait_for_their_own_batch():
    q = make_queue(batch=8, delay_s=1.0)
    a, odd, b = pending(at=0.0), pending(at=0.1, width=3), pending(at=0.2)
    for r in (a, odd, b):
        q.push(r)
    assert q.take(1.0).batch == [a, b]
    assert q.take(1.1).batch == [odd]


def test_expired_requests_leave_as_expired_never_in_a_batch():
    q = make_queue(batch=8, delay_s=1.0)
    late, ok = pending(at=0.0, deadline=0.5), pending(at=0.1, deadline=5.0)
    q.push(late)
    q.push(ok)
    waiting = q.take(0.2)
    assert waiting.batch == [] and waiting.wake_at == pytest.approx(0.5)  # the first deadline
    at_deadline = q.take(0.5)
    assert at_deadline.expired == [late] and at_deadline.batch == []
    assert q.take(1.1).batch == [ok]  # the window now runs from the oldest left


def test_flush_sends_a_partial_batch_at_once():
    q = make_queue(batch=8, delay_s=100.0)
    a = pending()
    q.push(a)
    assert q.take(0.0, flush=True).batch == [a]


def test_a_lone_request_for_an_idle_executor_leaves_without_its_window():
    q = make_queue(batch=8, delay_s=100.0)
    a = pending(at=0.0)
    q.push(a)
    assert q.take(0.0).batch == []  # the executor is busy: it waits for company
    assert q.take(0.0, idle=True).batch == [a]


def test_an_idle_executor_still_waits_the_window_for_requests_that_came_together():
    q = make_queue(batch=8, delay_s=1.0)
    a, b = pending(at=0.0), pending(at=0.1)
    q.push(a)
    q.push(b)
    waiting = q.take(0.2, idle=True)
    assert waiting.batch == [] and waiting.wake_at == pytest.approx(1.0)
    assert q.take(1.0, idle=True).batch == [a, b]


def test_a_request_left_alone_by_expiries_leaves_at_once_when_idle():
    q = make_queue(batch=8, delay_s=100.0)
    late, ok = pending(at=0.0, deadline=0.5), pending(at=0.1)
    q.push(late)
    q.push(ok)
    taken = q.take(0.5, idle=True)
    assert taken.expired == [late] and taken.batch == [ok]


def test_without_batching_each_request_is_its_own_batch_at_once():
    q = make_queue(batch=0, delay_s=100.0)
    a, b = pending(at=0.0), pending(at=0.0)
    q.push(a)
    q.push(b)
    assert q.take(0.0).batch == [a]
    assert q.take(0.0).batch == [b]


def test_a_full_queue_refuses_at_once():
    q = make_queue(size=2)
    q.push(pending())
    q.push(pending())
    with pytest.raises(OverloadedError, match="queue full"):
        q.push(pending())
    assert len(q.drain()) == 2 and len(q) == 0


# -- stacking and splitting ------------------------------------------------------------------


def test_stack_then_split_gives_each_request_its_own_rows():
    batch = [pending(1, at=1.0), pending(3, at=2.0), pending(2, at=3.0)]
    stacked = stack_inputs(batch)
    assert stacked["x"].shape == (6, 16)
    parts = split_outputs({"y": stacked["x"][:, :1] * 10}, [r.rows for r in batch])
    assert [p["y"][:, 0].tolist() for p in parts] == [[10.0], [20.0] * 3, [30.0] * 2]


def test_stacking_one_request_copies_nothing():
    only = pending(2)
    assert stack_inputs([only])["x"] is only.inputs["x"]


def test_the_checker_remembers_shapes_never_values() -> None:
    specs = (TensorSpec("x", "FP32", (16,)),)
    checker = InputChecker(specs, max_batch_size=8, model="m")
    good = np.zeros((2, 16), np.float32)
    assert checker({"x": good})[1:] == check_inputs({"x": good}, specs, max_batch_size=8)[1:]
    bad = good.copy()
    bad[1, 3] = np.nan
    with pytest.raises(InvalidRequestError, match="1 NaN"):  # same signature, checked values
        checker({"x": bad})
    huge = np.full((2, 16), 3e38, np.float32)  # finite, however large
    assert checker({"x": huge})[1] == 2
    with pytest.raises(InvalidRequestError):  # another signature: the full checks again
        checker({"x": np.zeros((2, 15), np.float32)})
    allowing = InputChecker(specs, max_batch_size=8, model="m", allow_non_finite=True)
    assert allowing({"x": bad})[1] == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.sampled_from([np.float32, np.float64, np.int64]),
    st.booleans(),
)
def test_the_checker_answers_as_check_inputs_does(shape: list[int], dtype: type, nan: bool) -> None:
    specs = (TensorSpec("x", "FP32", (None, 2)),)
    array = np.ones(shape, dtype)
    if nan and array.dtype.kind == "f" and array.size:
        array.flat[0] = np.nan
    checker = InputChecker(specs, max_batch_size=2, model="m")
    for _ in range(2):  # the second call may take the remembered path
        try:
            expected: object = check_inputs({"x": array}, specs, max_batch_size=2, model="m")[1:]
        except Exception as e:  # the same error, or none
            expected = (type(e), str(e))
        try:
            got: object = checker({"x": array})[1:]
        except Exception as e:
            got = (type(e), str(e))
        assert got == expected


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    widths=st.lists(st.sampled_from([16, 3]), min_size=30, max_size=30),
    batch=st.integers(4, 9),
)
def test_requests_leave_in_arrival_order_among_those_that_share_a_batch(
    rows: list[int], widths: list[int], batch: int
) -> None:
    """The invariant the module states first: within a key, batches keep arrival order."""
    q = make_queue(batch=batch, delay_s=0.5, size=100)
    arrived = [
        pending(n, at=i * 0.01, width=w) for i, (n, w) in enumerate(zip(rows, widths, strict=False))
    ]
    for r in arrived:
        q.push(r)
    left: list[PendingRequest] = []
    while len(q):
        taken = q.take(100.0, flush=True).batch
        assert taken and sum(r.rows for r in taken) <= batch
        left += taken
    for width in (16, 3):
        assert [r for r in left if r.key == ((width,),)] == [
            r for r in arrived if r.key == ((width,),)
        ]
