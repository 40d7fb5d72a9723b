"""DynamicBatcher against real threads: grouping, deadlines, overload, errors, shutdown.

No test asserts a duration: grouping is made deterministic by submitting
before ``start`` or while a gated executor holds the worker in compute.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from cloud_hub import (
    CallableExecutor,
    DeadlineExceededError,
    DynamicBatcher,
    ExecutorError,
    HubStoppingError,
    InvalidRequestError,
    OverloadedError,
    RequestTooLargeError,
    TensorSpec,
)

WAIT_S = 10.0


class GatedModel:
    """y = 2x. Records every batch; while ``gate`` is clear, compute blocks."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.entered: queue.Queue[int] = queue.Queue()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next: Exception | None = None

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        self.batches.append(x.copy())
        self.entered.put(len(x))
        assert self.gate.wait(WAIT_S)
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return {"y": x * 2}

    @property
    def batch_rows(self) -> list[int]:
        return [len(b) for b in self.batches]


@pytest.fixture
def model() -> Iterator[GatedModel]:
    m = GatedModel()
    yield m
    m.gate.set()


@pytest.fixture
def make_batcher(model: GatedModel) -> Iterator:
    made: list[DynamicBatcher] = []

    def make(**options) -> DynamicBatcher:
        options.setdefault("max_batch_size", 8)
        options.setdefault("max_queue_delay_ms", 0.0)
        batcher = DynamicBatcher(
            CallableExecutor(model), inputs=[TensorSpec("x", "FP32", (4,))], **options
        )
        made.append(batcher)
        return batcher

    yield make
    model.gate.set()
    for batcher in made:
        batcher.stop()


def rows(n: int, value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((n, 4), value, dtype=np.float32)}


def test_requests_waiting_together_run_as_one_batch_and_split_back(make_batcher, model):
    batcher = make_batcher(max_batch_size=8, max_queue_delay_ms=60_000)
    sizes = [1, 2, 1, 3, 1]  # 8 rows: a full batch leaves without waiting for the delay
    futures = [batcher.submit(rows(n, i)) for i, n in enumerate(sizes)]
    batcher.start()
    for i, (n, future) in enumerate(zip(sizes, futures, strict=True)):
        result = future.result(WAIT_S)
        np.testing.assert_array_equal(result.outputs["y"], np.full((n, 4), 2.0 * i))
        assert (result.batch_rows, result.batch_requests) == (8, 5)
        assert result.model_version == "1"
    assert model.batch_rows == [8]
    stats = batcher.metrics.snapshot()
    assert stats.batch_rows == {8: 1} and stats.batch_requests == {5: 1}
    assert (stats.submitted, stats.completed, stats.batches, stats.rows) == (5, 5, 1, 8)


def test_requests_arriving_during_compute_form_the_next_batch(make_batcher, model):
    batcher = make_batcher(max_batch_size=4).start()
    model.gate.clear()
    first = batcher.submit(rows(1, 0))
    assert model.entered.get(timeout=WAIT_S) == 1  # the worker is now inside compute
    during = [batcher.submit(rows(1, v)) for v in (1, 2, 3, 4, 5)]
    model.gate.set()
    for f in [first, *during]:
        f.result(WAIT_S)
    # Queueing went on during compute; then batches of at most 4 rows, in arrival order.
    assert model.batch_rows == [1, 4, 1]
    assert model.batches[1][:, 0].tolist() == [1, 2, 3, 4]


def test_a_partial_batch_leaves_after_the_queue_delay(make_batcher, model):
    batcher = make_batcher(max_batch_size=64, max_queue_delay_ms=5)
    futures = [batcher.submit(rows(1, v)) for v in range(3)]
    batcher.start()
    assert [f.result(WAIT_S).batch_rows for f in futures] == [3, 3, 3]
    assert model.batch_rows == [3]


# A window no test could wait out: a request that waited for it would fail its result(WAIT_S).
FOREVER_MS = 3_600_000.0


def test_a_lone_request_for_an_idle_worker_is_computed_without_waiting_for_the_window(
    make_batcher, model
):
    batcher = make_batcher(max_batch_size=8, max_queue_delay_ms=FOREVER_MS).start()
    for v in range(3):  # one after another: each finds the worker idle and the queue empty
        result = batcher.submit(rows(1, v)).result(WAIT_S)
        assert (result.batch_rows, result.batch_requests) == (1, 1)
    assert model.batch_rows == [1, 1, 1]
    assert batcher.metrics.snapshot().batch_requests == {1: 3}


def test_company_that_arrives_during_compute_still_batches_under_a_long_window(make_batcher, model):
    batcher = make_batcher(max_batch_size=2, max_queue_delay_ms=FOREVER_MS).start()
    model.gate.clear()
    first = batcher.submit(rows(1, 0))
    assert model.entered.get(timeout=WAIT_S) == 1  # computed at once, alone
    pair = [batcher.submit(rows(1, v)) for v in (1, 2)]  # queued during compute: a full batch
    model.gate.set()
    for f in [first, *pair]:
        f.result(WAIT_S)
    assert batcher.submit(rows(1, 3)).result(WAIT_S).batch_requests == 1  # alone again
    assert model.batch_rows == [1, 2, 1]


def test_a_request_queued_alone_during_compute_runs_as_soon_as_compute_ends(make_batcher, model):
    batcher = make_batcher(max_batch_size=8, max_queue_delay_ms=FOREVER_MS).start()
    model.gate.clear()
    first = batcher.submit(rows(1, 0))
    model.entered.get(timeout=WAIT_S)
    second = batcher.submit(rows(1, 1))
    model.gate.set()
    assert first.result(WAIT_S).batch_requests == 1
    assert second.result(WAIT_S).batch_requests == 1
    assert model.batch_rows == [1, 1]


def test_requests_expired_in_the_queue_are_answered_without_compute(make_batcher, model):
    batcher = make_batcher().start()
    model.gate.clear()
    running = batcher.submit(rows(1, 0))
    model.entered.get(timeout=WAIT_S)
    deadline = time.monotonic() + 0.05
    doomed = batcher.submit(rows(1, 9), deadline=deadline)
    while time.monotonic() <= deadline:
        time.sleep(0.01)
    model.gate.set()
    running.result(WAIT_S)
    with pytest.raises(DeadlineExceededError, match="queue"):
        doomed.result(WAIT_S)
    assert model.batch_rows == [1]  # the expired request never reached the model
    assert batcher.metrics.snapshot().expired == 1


def test_a_request_already_past_its_deadline_is_refused_at_submit(make_batcher, model):
    batcher = make_batcher().start()
    with pytest.raises(DeadlineExceededError):
        batcher.submit(rows(1, 0), deadline=time.monotonic() - 1)
    assert model.batches == []


def test_a_full_queue_answers_overloaded_at_once(make_batcher):
    batcher = make_batcher(max_queue_size=2)  # not started: nothing drains the queue
    queued = [batcher.submit(rows(1, 0)), batcher.submit(rows(1, 1))]
    with pytest.raises(OverloadedError, match="queue full"):
        batcher.submit(rows(1, 2))
    assert batcher.metrics.snapshot().rejected_overloaded == 1
    batcher.stop()
    for f in queued:
        with pytest.raises(HubStoppingError):
            f.result(WAIT_S)


def test_an_executor_error_reaches_every_future_of_its_batch_and_serving_goes_on(
    make_batcher, model
):
    batcher = make_batcher(max_batch_size=8)
    model.fail_next = RuntimeError("CUDA out of memory")
    doomed = [batcher.submit(rows(1, v)) for v in range(3)]
    batcher.start()
    for f in doomed:
        with pytest.raises(ExecutorError, match="CUDA out of memory") as caught:
            f.result(WAIT_S)
        assert isinstance(caught.value.__cause__, RuntimeError)
    after = batcher.submit(rows(2, 7)).result(WAIT_S)
    np.testing.assert_array_equal(after.outputs["y"], np.full((2, 4), 14.0))
    stats = batcher.metrics.snapshot()
    assert (stats.failed, stats.completed) == (3, 1)


def test_a_result_without_one_row_per_input_row_fails_the_batch():
    executor = CallableExecutor(lambda inputs: {"y": inputs["x"][:1]})
    batcher = DynamicBatcher(executor, inputs=[TensorSpec("x", "FP32", (4,))])
    with batcher, pytest.raises(ExecutorError, match="one row per input row"):
        batcher.submit(rows(3, 1)).result(WAIT_S)


def test_bad_arguments_fail_at_submit_and_never_reach_the_queue(make_batcher, model):
    batcher = make_batcher(max_batch_size=4).start()
    with pytest.raises(InvalidRequestError, match="FP32"):
        batcher.submit({"x": np.zeros((1, 4), np.float64)})
    with pytest.raises(RequestTooLargeError):
        batcher.submit(rows(5, 0))
    assert batcher.queue_depth == 0 and model.batches == []
    assert batcher.metrics.snapshot().rejected_invalid == 2


def test_a_cancelled_request_is_not_computed(make_batcher, model):
    batcher = make_batcher()
    cancelled, kept = batcher.submit(rows(1, 1)), batcher.submit(rows(1, 2))
    assert cancelled.cancel()
    batcher.start()
    kept.result(WAIT_S)
    assert model.batches[0][:, 0].tolist() == [2]


def test_stop_answers_queued_requests_and_finishes_the_batch_in_flight(make_batcher, model):
    batcher = make_batcher(max_batch_size=1).start()
    model.gate.clear()
    in_flight = batcher.submit(rows(1, 1))
    model.entered.get(timeout=WAIT_S)
    queued = batcher.submit(rows(1, 2))
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    with pytest.raises(HubStoppingError):
        queued.result(WAIT_S)
    model.gate.set()
    stopper.join(WAIT_S)
    assert in_flight.result(WAIT_S).outputs["y"][0, 0] == 2.0
    assert not batcher.running
    with pytest.raises(HubStoppingError):
        batcher.submit(rows(1, 3))


def test_the_future_is_awaitable_in_an_event_loop(make_batcher):
    batcher = make_batcher().start()

    async def infer() -> np.ndarray:
        result = await batcher.submit(rows(2, 3))
        return result.outputs["y"]

    np.testing.assert_array_equal(asyncio.run(infer()), np.full((2, 4), 6.0))


def test_a_model_without_a_batch_dimension_runs_each_request_alone():
    seen: list[tuple[int, ...]] = []

    def whole(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(inputs["image"].shape)
        return {"mean": np.asarray(inputs["image"].mean(), dtype=np.float32)}

    batcher = DynamicBatcher(
        CallableExecutor(whole),
        inputs=[TensorSpec("image", "UINT8", (2, 2))],
        max_batch_size=0,
        max_queue_delay_ms=50,
    )
    futures = [batcher.submit({"image": np.full((2, 2), v, np.uint8)}) for v in (1, 3)]
    with batcher:
        assert [float(f.result(WAIT_S).outputs["mean"]) for f in futures] == [1.0, 3.0]
    assert seen == [(2, 2), (2, 2)]
