"""Fallback reasons are a ``str`` enum whose values are a contract.

Results carry them in ``reason``, ``agent.stats.by_reason`` counts them and
telemetry reports them (``fallbacks``, keyed without the ``fallback:`` prefix);
dashboards and rollout gates key on those strings, so the enum must not change
one. Every reason is staged for real here: a hub stand-in on a real broker
answers with each error code, stays silent, or is not there at all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_agent import (
    CircuitBreaker,
    EdgeAgent,
    FallbackReason,
    InferenceResult,
    OffloadPolicy,
    Source,
)
from edge_agent.runtimes import load_runtime
from shared import ErrorCode, Message

from ._brokers import MosquittoProcess, free_port
from ._responder import Responder

PREFIX = "fallback:"
# The strings results and telemetry carried before the enum existed: the device's own reasons.
DEVICE_SIDE = {
    "fallback:no_uplink",
    "fallback:breaker_open",
    "fallback:no_time",
    "fallback:timeout",
    "fallback:broker_unavailable",
}
HUB_ERRORS = [code for code in ErrorCode if code is not ErrorCode.OK]


def sample() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(1, 16)).astype(np.float32)


def make_agent(linear_onnx: Path, broker: str | None, device: str, **kw: object) -> EdgeAgent:
    runtime = load_runtime(linear_onnx, name="linear", version="3")
    return EdgeAgent(
        runtime,
        device_id=device,
        broker=broker,
        policy=OffloadPolicy.always_cloud(),
        **kw,  # type: ignore[arg-type]
    )


def assert_reported(agent: EdgeAgent, results: list[InferenceResult]) -> None:
    """Each result's reason reaches stats and telemetry as exactly the same string."""
    reasons = [r.reason for r in results]
    assert all(r.source is Source.EDGE_FALLBACK and r.degraded for r in results)
    assert all(isinstance(reason, FallbackReason) for reason in reasons)
    expected = Counter(str(reason) for reason in reasons)
    by_reason = agent.stats.by_reason
    assert by_reason == expected
    assert all(type(key) is str for key in by_reason)  # plain strings for whoever reads them
    causes = {reason.removeprefix(PREFIX): n for reason, n in expected.items()}
    metrics = agent.metrics()
    assert metrics.fallbacks == causes
    assert json.loads(metrics.to_json())["fallbacks"] == causes  # what goes on the wire


# -- the contract --------------------------------------------------------------------------


def test_values_are_the_strings_results_and_telemetry_carried() -> None:
    hub_side = {PREFIX + code.value for code in HUB_ERRORS}
    assert {reason.value for reason in FallbackReason} == DEVICE_SIDE | hub_side
    for reason in FallbackReason:
        assert reason == reason.value and hash(reason) == hash(reason.value)
        assert str(reason) == f"{reason}" == reason.value
        assert json.dumps({reason: reason}) == json.dumps({reason.value: reason.value})
        assert reason.cause == reason.value.removeprefix(PREFIX)


def test_every_hub_error_code_has_its_reason() -> None:
    for code in HUB_ERRORS:
        assert FallbackReason.for_error(code).value == PREFIX + code.value
    with pytest.raises(ValueError, match="no reason"):
        FallbackReason.for_error(ErrorCode.OK)


# -- staged for real ------------------------------------------------------------------------


def test_each_hub_error_reply_falls_back_with_its_reason(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    answer_with = {"code": ErrorCode.OK}

    def hub(request: Message) -> Message:
        return request.reply(error=answer_with["code"], error_message="staged")

    breaker = CircuitBreaker(failure_threshold=len(HUB_ERRORS) + 1)  # stays closed throughout
    results = []
    with (
        Responder(mosquitto.url, hub),
        make_agent(linear_onnx, mosquitto.url, "dev-reasons-hub", breaker=breaker) as agent,
    ):
        for code in HUB_ERRORS:
            answer_with["code"] = code
            result = agent.infer(sample(), deadline_ms=5000)
            assert result.reason == PREFIX + code.value
            results.append(result)
        assert_reported(agent, results)


@pytest.fixture
def silent_hub(mosquitto: MosquittoProcess) -> Iterator[Responder]:
    with Responder(mosquitto.url, lambda _request: None) as responder:
        yield responder


def test_device_side_reasons_each_reach_results_stats_and_telemetry(
    linear_onnx: Path, mosquitto: MosquittoProcess, silent_hub: Responder
) -> None:
    seen: set[str] = set()

    # No broker at all.
    with make_agent(linear_onnx, None, "dev-reasons-1") as agent:
        results = [agent.infer(sample())]
        assert results[0].reason == "fallback:no_uplink"
        assert_reported(agent, results)
        seen.update(r.reason for r in results)

    # A deadline too short to wait for anything.
    with make_agent(linear_onnx, mosquitto.url, "dev-reasons-2") as agent:
        results = [agent.infer(sample(), deadline_ms=1e-3)]
        assert results[0].reason == "fallback:no_time"
        assert_reported(agent, results)
        seen.update(r.reason for r in results)

    # A silent hub times out, and then the breaker opens.
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=60.0, max_cooldown_s=60.0)
    with make_agent(linear_onnx, mosquitto.url, "dev-reasons-3", breaker=breaker) as agent:
        results = [agent.infer(sample(), deadline_ms=150) for _ in range(2)]
        assert [r.reason for r in results] == ["fallback:timeout", "fallback:breaker_open"]
        assert_reported(agent, results)
        seen.update(r.reason for r in results)

    # A broker that is not there.
    url = f"mqtt://127.0.0.1:{free_port()}"
    with make_agent(linear_onnx, url, "dev-reasons-4") as agent:
        results = [agent.infer(sample(), deadline_ms=200)]
        assert results[0].reason == "fallback:broker_unavailable"
        assert_reported(agent, results)
        seen.update(r.reason for r in results)

    assert seen == DEVICE_SIDE
