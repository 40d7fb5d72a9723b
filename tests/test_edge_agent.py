from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from edge_agent import (
    AsyncEdgeAgent,
    CircuitBreaker,
    EdgeAgent,
    InvalidInputError,
    NoAnswerError,
    OffloadPolicy,
    Source,
)
from edge_agent.runtimes import load_runtime
from shared import ErrorCode, Message, ReplyTiming

from ._brokers import MosquittoProcess, free_port
from ._models import linear_classifier_weights
from ._responder import Responder

W_EDGE, B_EDGE = linear_classifier_weights(seed=0)
W_CLOUD, B_CLOUD = linear_classifier_weights(seed=1)  # the "bigger" model answers differently


def cloud_answer(request: Message) -> Message:
    x = request.tensors["x"]
    return request.reply(
        tensors={"logits": x @ W_CLOUD + B_CLOUD},
        model_version="7",
        timing={"queue_ms": 0.5, "compute_ms": 0.25, "hub_ms": 1.0},
    )


def overloaded(request: Message) -> Message:
    return request.reply(error=ErrorCode.OVERLOADED, error_message="queue full")


def silent(_request: Message) -> None:
    return None


def sample(n: int = 1, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


def make_agent(
    linear_onnx: Path, broker: str | None, policy: OffloadPolicy, **kw: object
) -> EdgeAgent:
    runtime = load_runtime(linear_onnx, name="linear", version="3")
    return EdgeAgent(runtime, device_id="dev-1", broker=broker, policy=policy, **kw)  # type: ignore[arg-type]


def test_local_answer_matches_the_model(linear_onnx: Path) -> None:
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        x = sample(4)
        result = agent.infer(x)
    assert result.source is Source.EDGE and not result.degraded
    np.testing.assert_allclose(result.output, x @ W_EDGE + B_EDGE, rtol=1e-5, atol=1e-5)
    assert result.model_versions == {"edge": "linear@3"}
    assert result.latency.local_ms > 0 and result.latency.network_ms == 0


def test_bad_input_is_a_typed_error_naming_the_problem(linear_onnx: Path) -> None:
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        with pytest.raises(InvalidInputError, match="shape"):
            agent.infer(np.zeros((1, 15), np.float32))
        with pytest.raises(InvalidInputError, match="FP32"):
            agent.infer(np.zeros((1, 16), np.float64))
        with pytest.raises(InvalidInputError, match="unknown"):
            agent.infer({"x": sample(), "y": sample()})
        with pytest.raises(InvalidInputError, match="deadline_ms"):
            agent.infer(sample(), deadline_ms=0)
        with pytest.raises(InvalidInputError, match="numpy array"):
            agent.infer([[1.0] * 16])  # type: ignore[arg-type]
        assert agent.stats.requests == 0  # rejected calls are not counted as answered


@pytest.mark.parametrize(
    ("deadline", "words"),
    [
        ("50", "got str '50'"),
        (True, "got bool"),
        (np.array([50.0]), "got ndarray"),
        (float("nan"), "positive and finite"),
        (float("inf"), "positive and finite"),
        (-5, "positive and finite"),
    ],
)
def test_a_deadline_that_is_not_a_positive_number_is_a_typed_error(
    linear_onnx: Path, deadline: object, words: str
) -> None:
    """Issue 21: ``deadline_ms="50"`` was taken as 50 ms without a word."""
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        with pytest.raises(InvalidInputError, match="deadline_ms") as raised:
            agent.infer(sample(), deadline_ms=deadline)  # type: ignore[arg-type]
        assert words in str(raised.value) and "\n" not in str(raised.value)
        assert agent.stats.requests == 0
        for fine in (50, 50.0, np.float32(50), np.int64(50)):
            assert agent.infer(sample(), deadline_ms=fine).source is Source.EDGE  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="default_deadline_ms"):
        make_agent(linear_onnx, None, OffloadPolicy.always_local(), default_deadline_ms=deadline)


def test_cloud_answer_wins_and_reports_where_it_came_from(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    with (
        Responder(mosquitto.url, cloud_answer),
        make_agent(
            linear_onnx, mosquitto.url, OffloadPolicy.always_cloud(), cloud_model="linear"
        ) as agent,
    ):
        x = sample(2)
        result = agent.infer(x, deadline_ms=5000)
    assert result.source is Source.CLOUD, result.reason
    np.testing.assert_allclose(result.output, x @ W_CLOUD + B_CLOUD, rtol=1e-5)
    assert result.model_versions == {"edge": "linear@3", "cloud": "linear@7"}
    assert result.latency.queue_ms == 0.5 and result.latency.cloud_compute_ms == 0.25
    assert result.latency.local_ms == 0  # always_cloud does not run the local model first


@pytest.mark.parametrize(
    ("timing", "hub_ms"),
    [
        # Hub times far below any real round trip, so the network share stays positive.
        (ReplyTiming(queue_ms=0.004, compute_ms=0.003, hub_ms=0.01), 0.01),
        (ReplyTiming(queue_ms=0.004, compute_ms=0.003), 0.007),  # no hub_ms: queue + compute
    ],
)
def test_network_time_is_the_round_trip_less_the_hub_time_the_reply_reports(
    linear_onnx: Path, mosquitto: MosquittoProcess, timing: ReplyTiming, hub_ms: float
) -> None:
    def hub(request: Message) -> Message:
        x = request.tensors["x"]
        return request.reply(tensors={"logits": x @ W_CLOUD + B_CLOUD}, timing=timing)

    with (
        Responder(mosquitto.url, hub),
        make_agent(linear_onnx, mosquitto.url, OffloadPolicy.always_cloud()) as agent,
    ):
        latency = agent.infer(sample(), deadline_ms=5000).latency
    assert (latency.queue_ms, latency.cloud_compute_ms) == (timing.queue_ms, timing.compute_ms)
    expected = max(0.0, latency.total_ms - latency.local_ms - hub_ms)
    assert latency.network_ms == pytest.approx(expected, abs=1e-9)
    assert expected > 0  # the round trip took longer than the hub says it spent


def test_uncertain_requests_go_to_the_cloud(linear_onnx: Path, mosquitto: MosquittoProcess) -> None:
    policy = OffloadPolicy.budget(0.3, score="margin", adapt=False)
    with (
        Responder(mosquitto.url, cloud_answer) as responder,
        make_agent(linear_onnx, mosquitto.url, policy) as agent,
    ):
        agent.calibrate(sample(500, seed=11))
        results = [agent.infer(row[None], deadline_ms=5000) for row in sample(200, seed=12)]
    cloud = [r for r in results if r.source is Source.CLOUD]
    edge = [r for r in results if r.source is Source.EDGE]
    assert 0.15 < len(cloud) / len(results) < 0.45
    assert len(responder.requests) == len(cloud)
    # Every offloaded answer was less sure locally than every answer kept.
    assert min(r.score for r in cloud) >= max(r.score for r in edge)  # type: ignore[type-var]
    assert all(r.latency.local_ms > 0 for r in cloud)  # ran locally first, then offloaded


def test_overloaded_hub_means_local_fallback_then_open_breaker(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=60.0, max_cooldown_s=60.0)
    with (
        Responder(mosquitto.url, overloaded) as responder,
        make_agent(
            linear_onnx, mosquitto.url, OffloadPolicy.always_cloud(), breaker=breaker
        ) as agent,
    ):
        x = sample()
        results = [agent.infer(x, deadline_ms=5000) for _ in range(6)]
    assert [r.reason for r in results] == ["fallback:overloaded"] * 3 + [
        "fallback:breaker_open"
    ] * 3
    assert all(r.source is Source.EDGE_FALLBACK and r.degraded for r in results)
    np.testing.assert_allclose(results[-1].output, x @ W_EDGE + B_EDGE, rtol=1e-5)
    assert len(responder.requests) == 3  # nothing sent while the breaker is open


def test_silent_hub_times_out_into_the_local_answer(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    with (
        Responder(mosquitto.url, silent) as responder,
        make_agent(linear_onnx, mosquitto.url, OffloadPolicy.always_cloud()) as agent,
    ):
        result = agent.infer(sample(), deadline_ms=150)
    assert result.source is Source.EDGE_FALLBACK and result.reason == "fallback:timeout"
    assert len(responder.requests) == 1
    # The request told the hub how long it may take, less the time reserved for the local run.
    assert 0 < (responder.requests[0].timeout_ms or 0) < 150


def test_unreachable_broker_answers_locally(linear_onnx: Path) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there
    with make_agent(linear_onnx, url, OffloadPolicy.always_cloud()) as agent:
        results = [agent.infer(sample(), deadline_ms=200) for _ in range(5)]
    assert {r.source for r in results} == {Source.EDGE_FALLBACK}
    assert results[0].reason == "fallback:broker_unavailable"
    assert results[-1].reason == "fallback:breaker_open"


def test_no_local_model_and_no_cloud_is_a_typed_error(mosquitto: MosquittoProcess) -> None:
    agent = EdgeAgent(
        None, device_id="dev-2", broker=mosquitto.url, cloud_model="linear", input_name="x"
    )
    with (
        Responder(mosquitto.url, silent),
        agent,
        pytest.raises(NoAnswerError, match="not on this device"),
    ):
        agent.infer(sample(), deadline_ms=100)


def test_no_local_model_uses_the_cloud(mosquitto: MosquittoProcess) -> None:
    agent = EdgeAgent(
        None, device_id="dev-3", broker=mosquitto.url, cloud_model="linear", input_name="x"
    )
    with Responder(mosquitto.url, cloud_answer), agent:
        result = agent.infer(sample(), deadline_ms=5000)
    assert result.source is Source.CLOUD and result.reason == "no_local_model"


def test_async_twin_gives_the_same_answers(linear_onnx: Path, mosquitto: MosquittoProcess) -> None:
    x = sample(3)

    async def main() -> list[Source]:
        runtime = load_runtime(linear_onnx, name="linear", version="3")
        async with AsyncEdgeAgent(
            runtime,
            device_id="dev-async",
            broker=mosquitto.url,
            policy=OffloadPolicy.always_cloud(),
        ) as agent:
            results = await asyncio.gather(*(agent.infer(x, deadline_ms=5000) for _ in range(8)))
        for r in results:
            np.testing.assert_allclose(r.output, x @ W_CLOUD + B_CLOUD, rtol=1e-5)
        return [r.source for r in results]

    with Responder(mosquitto.url, cloud_answer):
        assert asyncio.run(main()) == [Source.CLOUD] * 8


def test_async_twin_falls_back_on_silence(linear_onnx: Path, mosquitto: MosquittoProcess) -> None:
    async def main() -> str:
        runtime = load_runtime(linear_onnx, name="linear", version="3")
        async with AsyncEdgeAgent(
            runtime,
            device_id="dev-async2",
            broker=mosquitto.url,
            policy=OffloadPolicy.always_cloud(),
        ) as agent:
            return (await agent.infer(sample(), deadline_ms=100)).reason

    with Responder(mosquitto.url, silent):
        assert asyncio.run(main()) == "fallback:timeout"
