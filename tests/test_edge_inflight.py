"""The count of calls running the local model, under concurrent calls.

The agent reads it as the queue depth that scales its local-latency
prediction, and reports it in ``agent.snapshot().local_inflight``. Calls are
held inside a real ONNX Runtime model by a gate, so the test knows exactly
how many are in flight; it waits on the count itself, never on a sleep.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from edge_agent import (
    AsyncEdgeAgent,
    EdgeAgent,
    HeavyCheck,
    InferenceError,
    InferenceResult,
    LatencyEstimator,
    ModelRuntime,
    NetworkEstimator,
    OffloadPolicy,
    Source,
    TensorSpec,
)
from edge_agent._inflight import InflightCounter
from edge_agent.runtimes import load_runtime

CALLS = 6
X = np.random.default_rng(3).normal(size=(1, 16)).astype(np.float32)


class GatedRuntime(ModelRuntime):
    """A real ONNX Runtime model whose runs wait until ``gate`` opens (then fail, if told)."""

    kind: ClassVar[str] = "gated-onnxruntime"

    def __init__(self, inner: ModelRuntime, *, fail: bool = False) -> None:
        super().__init__(name=inner.name, version=inner.version)
        self.inner = inner
        self.gate = threading.Event()
        self.fail = fail

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.inner.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.inner.outputs

    @property
    def accelerator(self) -> str:
        return self.inner.accelerator

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        if self.fail:
            raise RuntimeError("staged runtime failure")
        return self.inner.run_validated(inputs)


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads as often as the interpreter allows, to interleave them finely."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def gated(linear_onnx: Path, *, fail: bool = False) -> GatedRuntime:
    return GatedRuntime(load_runtime(linear_onnx, name="linear", version="3"), fail=fail)


def in_threads(n: int, call: Callable[[], object]) -> tuple[list[threading.Thread], list[object]]:
    """Start ``n`` threads running ``call``; each appends its result or its exception."""
    outcomes: list[object] = []

    def run() -> None:
        try:
            outcomes.append(call())
        except Exception as e:
            outcomes.append(e)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, outcomes


def test_counter_counts_every_entry_and_exit_across_threads(fast_switching: None) -> None:
    counter = InflightCounter()
    threads_n, rounds = 8, 20_000
    readings: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            readings.append(counter.value)

    def work() -> None:
        for _ in range(rounds):
            counter.enter()
            counter.leave()

    reader = threading.Thread(target=read)
    reader.start()
    workers = [threading.Thread(target=work) for _ in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    reader.join()
    assert counter.value == 0
    # A reading is the count at one moment: never more than the threads that can be inside.
    assert readings and all(0 <= r <= threads_n for r in readings)
    with pytest.raises(IndexError):
        counter.leave()  # a leave without its enter is a bug, not a negative count


def test_calls_inside_the_local_model_are_counted_and_seen_by_the_policy(
    linear_onnx: Path,
) -> None:
    runtime = gated(linear_onnx)
    # Local: 10 ms per call ahead in the queue; the cloud looks cheap (2 ms), so a request
    # whose deadline the queue would miss is heavy; there is no uplink, so it falls back.
    agent = EdgeAgent(
        runtime,
        device_id="dev-inflight",
        policy=OffloadPolicy(heavy=HeavyCheck()),
        local_estimator=LatencyEstimator(prior_ms=10.0),
        network_estimator=NetworkEstimator(prior_rtt_ms=1.0, prior_hub_ms=1.0),
    )
    with agent:
        assert agent.snapshot().local_inflight == 0
        threads, results = in_threads(CALLS, lambda: agent.infer(X, deadline_ms=10_000))
        wait_until(lambda: agent.snapshot().local_inflight == CALLS, f"{CALLS} calls in flight")
        # 10 ms x (1 + 6 queued) misses 50 ms: the policy saw the queue, so it wanted the cloud.
        probe_threads, probe = in_threads(1, lambda: agent.infer(X, deadline_ms=50))
        wait_until(lambda: agent.snapshot().local_inflight == CALLS + 1, "the probe in flight")
        runtime.gate.set()
        for t in [*threads, *probe_threads]:
            t.join()
        assert agent.snapshot().local_inflight == 0
        # With nothing queued, the same request stays local.
        alone = agent.infer(X, deadline_ms=50)
    assert all(isinstance(r, InferenceResult) and r.source is Source.EDGE for r in results)
    assert len(results) == CALLS
    assert isinstance(probe[0], InferenceResult)
    assert probe[0].source is Source.EDGE_FALLBACK and probe[0].reason == "fallback:no_uplink"
    assert alone.source is Source.EDGE


def test_calls_that_fail_in_the_model_leave_the_count(linear_onnx: Path) -> None:
    runtime = gated(linear_onnx, fail=True)
    with EdgeAgent(runtime, device_id="dev-inflight-fail") as agent:
        threads, outcomes = in_threads(CALLS, lambda: agent.infer(X))
        wait_until(lambda: agent.snapshot().local_inflight == CALLS, f"{CALLS} calls in flight")
        runtime.gate.set()
        for t in threads:
            t.join()
        assert agent.snapshot().local_inflight == 0
        assert agent.snapshot().serving.errors == CALLS
    assert len(outcomes) == CALLS and all(isinstance(o, InferenceError) for o in outcomes)


def test_async_calls_are_counted_while_their_worker_threads_run(linear_onnx: Path) -> None:
    runtime = gated(linear_onnx)

    async def main() -> list[InferenceResult]:
        async with AsyncEdgeAgent(runtime, device_id="dev-inflight-async") as agent:
            calls = [asyncio.ensure_future(agent.infer(X)) for _ in range(CALLS)]
            deadline = time.monotonic() + 30
            while agent.snapshot().local_inflight != CALLS:
                assert time.monotonic() < deadline, "timed out waiting for the calls in flight"
                await asyncio.sleep(0.005)
            runtime.gate.set()
            results = await asyncio.gather(*calls)
            assert agent.snapshot().local_inflight == 0
            return results

    results = asyncio.run(main())
    assert [r.source for r in results] == [Source.EDGE] * CALLS
