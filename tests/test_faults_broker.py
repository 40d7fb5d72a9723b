"""Fault injection: the broker goes away in the middle of a stream of requests."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edge_agent import CircuitBreaker, EdgeAgent, OffloadPolicy, Source
from edge_agent.runtimes import load_runtime

from ._brokers import MosquittoProcess
from ._models import linear_classifier_weights
from ._responder import Responder
from .test_edge_agent import cloud_answer

W_EDGE, B_EDGE = linear_classifier_weights(seed=0)


def test_broker_stop_mid_stream_falls_back_then_offloads_again(
    linear_onnx: Path, own_mosquitto: MosquittoProcess
) -> None:
    runtime = load_runtime(linear_onnx, name="linear", version="1")
    agent = EdgeAgent(
        runtime,
        device_id="dev-fault",
        broker=own_mosquitto.url,
        policy=OffloadPolicy.always_cloud(),
        breaker=CircuitBreaker(failure_threshold=2, cooldown_s=0.2, max_cooldown_s=0.5),
    )
    x = np.random.default_rng(5).normal(size=(1, 16)).astype(np.float32)
    local = x @ W_EDGE + B_EDGE
    with Responder(own_mosquitto.url, cloud_answer), agent:
        before = [agent.infer(x, deadline_ms=2000) for _ in range(20)]
        own_mosquitto.stop()
        during = [agent.infer(x, deadline_ms=100) for _ in range(40)]
        own_mosquitto.start()  # same port: clients reconnect by themselves
        after: list[Source] = []
        for _ in range(400):  # bounded: reconnect backoff is about a second here
            result = agent.infer(x, deadline_ms=2000)
            after.append(result.source)
            if result.source is Source.CLOUD:
                break
            time.sleep(0.05)
    assert {r.source for r in before} == {Source.CLOUD}
    # Every call during the outage still got an answer: the local one, marked degraded.
    assert len(during) == 40
    assert {r.source for r in during} == {Source.EDGE_FALLBACK}
    assert {r.reason for r in during} <= {
        "fallback:broker_unavailable",
        "fallback:breaker_open",
        "fallback:timeout",
    }
    for r in during:
        np.testing.assert_allclose(r.output, local, rtol=1e-5)
    assert after[-1] is Source.CLOUD  # offloading again, without any call from the app
    assert agent.uplink is not None and agent.uplink.stats.connects >= 2
