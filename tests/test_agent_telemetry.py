from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent import (
    AgentMetrics,
    CircuitBreaker,
    EdgeAgent,
    LatencyWindow,
    OffloadPolicy,
    Source,
    TelemetryReporter,
)
from edge_agent.runtimes import load_runtime
from shared import ErrorCode, Message, MqttSettings, Topics, create_client

from ._brokers import MosquittoProcess, free_port
from ._models import linear_classifier_weights
from ._responder import Responder

W_EDGE, B_EDGE = linear_classifier_weights(seed=0)


def sample(n: int = 1, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


def make_agent(
    linear_onnx: Path, broker: str | None, policy: OffloadPolicy, **kw: Any
) -> EdgeAgent:
    runtime = load_runtime(linear_onnx, name="linear", version="3")
    return EdgeAgent(runtime, device_id="dev-tel", broker=broker, policy=policy, **kw)


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, int(np.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def agrees_when_first_feature_positive(request: Message) -> Message:
    """The edge model's answer where x[0] > 0, else logits whose argmax is off by one."""
    x = request.tensors["x"]
    logits = x @ W_EDGE + B_EDGE
    wrong = np.zeros_like(logits)
    wrong[np.arange(len(x)), (logits.argmax(axis=1) + 1) % logits.shape[1]] = 1.0
    answer = np.where((x[:, :1] > 0), logits, wrong).astype(np.float32)
    return request.reply(tensors={"logits": answer}, model_version="9")


def overloaded(request: Message) -> Message:
    return request.reply(error=ErrorCode.OVERLOADED, error_message="queue full")


# -- pure pieces ---------------------------------------------------------------------------


def test_latency_window_is_bounded_and_uses_nearest_rank() -> None:
    window = LatencyWindow(size=100)
    for ms in range(1, 251):  # only 151..250 stay
        window.record(float(ms))
    assert len(window) == 100
    assert window.values()[0] == 151.0
    assert window.percentile(50) == 200.0
    assert window.percentile(99) == 249.0
    assert window.percentile(100) == 250.0
    assert LatencyWindow().percentile(50) is None
    with pytest.raises(ValueError):
        window.percentile(101)
    with pytest.raises(ValueError):
        LatencyWindow(size=0)


def test_latency_window_survives_concurrent_writers_and_readers() -> None:
    window = LatencyWindow(size=64)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                window.percentile(99)
        except BaseException as e:  # "deque mutated during iteration" would land here
            errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()

    def write() -> None:
        for i in range(20_000):
            window.record(float(i))

    writers = [threading.Thread(target=write) for _ in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert errors == [] and len(window) == 64


# -- snapshots from real calls --------------------------------------------------------------


def test_local_snapshot_counts_and_percentiles_match_the_calls(linear_onnx: Path) -> None:
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        assert agent.metrics().requests == 0 and agent.metrics().local_p50_ms is None
        results = [agent.infer(row[None]) for row in sample(37)]
        metrics = agent.metrics()
    local = [r.latency.local_ms for r in results]
    total = [r.latency.total_ms for r in results]
    assert metrics.requests == 37
    assert metrics.by_source == {"edge": 37}
    assert metrics.offload_rate == 0.0 and metrics.fallbacks == {}
    assert metrics.local_p50_ms == nearest_rank(local, 50)
    assert metrics.local_p99_ms == nearest_rank(local, 99)
    assert metrics.total_p50_ms == nearest_rank(total, 50)
    assert metrics.offloaded_p50_ms is None and metrics.offloaded_p99_ms is None
    assert metrics.agreement_rate is None and metrics.agreement_samples == 0
    assert metrics.model_versions == {"edge": "linear@3"}
    assert metrics.breaker_state == "closed" and metrics.uplink_connected is False
    assert metrics.device_id == "dev-tel"


def test_latency_window_keeps_only_the_last_requests(linear_onnx: Path) -> None:
    policy = OffloadPolicy.always_local()
    with make_agent(linear_onnx, None, policy, latency_window=8) as agent:
        results = [agent.infer(row[None]) for row in sample(20)]
        values = agent.telemetry.windows["local"].values()
    assert values == [r.latency.local_ms for r in results[-8:]]


def test_agreement_rate_counts_edge_vs_cloud_argmax(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    # Every request runs locally, is judged uncertain (score > -1), and is offloaded.
    policy = OffloadPolicy.threshold(-1.0, score="margin")
    xs = sample(30, seed=5)
    with (
        Responder(mosquitto.url, agrees_when_first_feature_positive),
        make_agent(linear_onnx, mosquitto.url, policy, cloud_model="linear") as agent,
    ):
        results = [agent.infer(row[None], deadline_ms=5000) for row in xs]
        # A batch of 4 counts as 4 samples.
        batch = sample(4, seed=6)
        batch_result = agent.infer(batch, deadline_ms=5000)
        metrics = agent.metrics()
    assert all(r.source is Source.CLOUD for r in [*results, batch_result])
    expected_agree = int((xs[:, 0] > 0).sum()) + int((batch[:, 0] > 0).sum())
    assert 0 < expected_agree < 34  # the staged hub agrees on some, not all
    assert metrics.agreement_samples == 34
    assert metrics.agreement_rate == pytest.approx(expected_agree / 34)
    assert metrics.by_source == {"cloud": 31}
    assert metrics.offload_rate == 1.0
    offloaded = [r.latency.total_ms for r in [*results, batch_result]]
    assert metrics.offloaded_p50_ms == nearest_rank(offloaded, 50)
    assert metrics.offloaded_p99_ms == nearest_rank(offloaded, 99)
    assert metrics.local_p50_ms is not None  # the local model ran first on every request
    assert metrics.model_versions == {"edge": "linear@3", "cloud": "linear@9"}
    assert metrics.uplink_connected is True


def test_straight_to_cloud_requests_are_not_compared(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    with (
        Responder(mosquitto.url, agrees_when_first_feature_positive),
        make_agent(linear_onnx, mosquitto.url, OffloadPolicy.always_cloud()) as agent,
    ):
        for row in sample(5):
            agent.infer(row[None], deadline_ms=5000)
        metrics = agent.metrics()
    assert metrics.by_source == {"cloud": 5}
    assert metrics.agreement_rate is None and metrics.agreement_samples == 0
    assert metrics.local_p50_ms is None


def test_fallbacks_are_counted_by_reason_with_the_breaker_state(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=60.0, max_cooldown_s=60.0)
    with (
        Responder(mosquitto.url, overloaded),
        make_agent(
            linear_onnx, mosquitto.url, OffloadPolicy.always_cloud(), breaker=breaker
        ) as agent,
    ):
        for _ in range(5):
            agent.infer(sample(), deadline_ms=5000)
        metrics = agent.metrics()
    assert metrics.by_source == {"edge-fallback": 5}
    assert metrics.fallbacks == {"overloaded": 3, "breaker_open": 2}
    assert metrics.breaker_state == "open"
    assert metrics.offload_rate == pytest.approx(3 / 5)


def test_metrics_serialise_to_strict_json(linear_onnx: Path) -> None:
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        agent.infer(sample())
        metrics = agent.metrics()
    decoded = json.loads(metrics.to_json())
    assert decoded == metrics.to_dict()
    assert decoded["schema"] == 1 and decoded["requests"] == 1
    assert AgentMetrics(**decoded) == metrics


# -- telemetry on the real broker -------------------------------------------------------------


class TelemetryListener:
    def __init__(self, broker: str, topic: str) -> None:
        self.messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        settings = MqttSettings.from_url(broker)
        self._subscribed = threading.Event()
        self._client = create_client(settings, f"listener-{id(self):x}", protocol="5")
        self._client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        self._client.on_message = lambda _c, _u, msg: self.messages.put(
            (msg.topic, json.loads(msg.payload))
        )
        self._client.connect(settings.host, settings.port)
        self._client.loop_start()
        assert self._subscribed.wait(10), "listener did not subscribe"

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def test_reporter_publishes_snapshots_on_the_telemetry_topic(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    topic = Topics().telemetry("dev-tel")
    listener = TelemetryListener(mosquitto.url, topic)
    try:
        with make_agent(linear_onnx, mosquitto.url, OffloadPolicy.always_local()) as agent:
            for row in sample(3):
                agent.infer(row[None])
            reporter = TelemetryReporter(agent, interval_s=0.05, qos=1)
            sent = reporter.report()
            assert sent is not None
            got_topic, first = listener.messages.get(timeout=10)
            assert got_topic == topic
            assert first == sent.to_dict()
            assert first["requests"] == 3 and first["by_source"] == {"edge": 3}
            assert first["uplink_connected"] is True and first["device_id"] == "dev-tel"

            agent.infer(sample())
            with reporter:  # the background thread keeps reporting
                while True:
                    _, periodic = listener.messages.get(timeout=10)
                    if periodic["requests"] == 4:
                        break
            assert reporter.stats.sent >= 2
    finally:
        listener.close()


def test_reporter_skips_reports_while_the_broker_is_away(linear_onnx: Path) -> None:
    # Not started: the uplink has no connection, as while the broker is away.
    agent = make_agent(linear_onnx, f"mqtt://127.0.0.1:{free_port()}", OffloadPolicy.always_local())
    try:
        agent.infer(sample())
        reporter = TelemetryReporter(agent, interval_s=60)
        assert reporter.report() is None
        assert reporter.stats.skipped == 1 and reporter.stats.sent == 0
        assert agent.metrics().uplink_connected is False
    finally:
        agent.close()


def test_reporter_rejects_bad_configuration(linear_onnx: Path) -> None:
    agent = make_agent(linear_onnx, None, OffloadPolicy.always_local())
    with pytest.raises(ValueError, match="broker"):
        TelemetryReporter(agent)
    agent.close()
    agent = make_agent(linear_onnx, f"mqtt://127.0.0.1:{free_port()}", OffloadPolicy.always_local())
    try:
        with pytest.raises(ValueError, match="interval_s"):
            TelemetryReporter(agent, interval_s=0)
        with pytest.raises(ValueError, match="QoS"):
            TelemetryReporter(agent, qos=2)
    finally:
        agent.close()
