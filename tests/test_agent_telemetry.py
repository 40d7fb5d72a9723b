from __future__ import annotations

import asyncio
import dataclasses
import json
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent import (
    AgentMetrics,
    AsyncEdgeAgent,
    BreakerState,
    CircuitBreaker,
    EdgeAgent,
    InferenceError,
    InvalidInputError,
    LatencyWindow,
    NoAnswerError,
    OffloadPolicy,
    Source,
    TelemetryReporter,
)
from edge_agent.runtimes import load_runtime
from shared import DeviceReport, ErrorCode, Message, MqttSettings, Topics, create_client

from ._brokers import MosquittoProcess, free_port
from ._models import linear_classifier_weights, write_linear_classifier
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


def test_metrics_are_built_from_the_agents_public_snapshot(linear_onnx: Path) -> None:
    with make_agent(linear_onnx, None, OffloadPolicy.always_local(), labels={"site": "a"}) as agent:
        results = [agent.infer(row[None]) for row in sample(9)]
        snap = agent.snapshot()
        metrics = agent.metrics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.local_inflight = 1  # type: ignore[misc]
    assert snap.device_id == "dev-tel" and snap.labels == {"site": "a"}
    assert snap.stats.requests == snap.serving.requests == len(results)
    assert (snap.edge_model, snap.edge_version, snap.edge_runtime) == ("linear", "3", "onnxruntime")
    assert snap.breaker_state is BreakerState.CLOSED and snap.local_inflight == 0
    assert snap.local_p50_ms == nearest_rank([r.latency.local_ms for r in results], 50)
    # Nothing ran between the two reads: the telemetry is the snapshot, field for field.
    rebuilt = AgentMetrics.from_snapshot(snap)
    assert dataclasses.replace(rebuilt, timestamp=metrics.timestamp) == metrics


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
    assert decoded["schema"] == 2 and decoded["requests"] == 1
    assert decoded["agent_requests"] == 1 and decoded["by_source"] == {"edge": 1}
    assert AgentMetrics.from_dict(decoded) == metrics


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


# -- the fleet's view: every snapshot is a shared.DeviceReport ---------------------------------


def write_failing_model(path: Path) -> Path:
    """x FP32[?, 16] -> Reshape to [16]: valid for a batch of 1, a runtime failure otherwise."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["flat"])],
        "fails-on-batches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("flat", TensorProto.FLOAT, [16])],
        initializer=[numpy_helper.from_array(np.array([16], dtype=np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def report_of(agent: EdgeAgent | AsyncEdgeAgent) -> DeviceReport:
    return DeviceReport.from_json(agent.metrics().to_json())


def test_snapshot_is_a_device_report(linear_onnx: Path) -> None:
    labels = {"site": "factory-a", "hw": "npu"}
    with make_agent(linear_onnx, None, OffloadPolicy.always_local(), labels=labels) as agent:
        results = [agent.infer(row[None]) for row in sample(9)]
        metrics = agent.metrics()
    report = DeviceReport.from_json(metrics.to_json())
    assert report == metrics.device_report()
    assert report.device == "dev-tel" and report.at == metrics.timestamp
    assert report.labels == labels
    assert report.capabilities == {"runtime": "onnxruntime", "provider": "CPUExecutionProvider"}
    assert (report.model, report.version) == ("linear", 3)
    assert (report.requests, report.errors, report.offloads) == (9, 0, 0)
    assert report.agreement_samples == report.agreed == 0 and report.agreement is None
    total = [r.latency.total_ms for r in results]
    assert report.p50_ms == nearest_rank(total, 50)
    assert report.p99_ms == nearest_rank(total, 99)
    assert report.error_rate == 0.0 and report.offload_rate == 0.0


def test_swap_resets_the_per_version_counters(linear_onnx: Path, tmp_path: Path) -> None:
    newer = write_linear_classifier(tmp_path / "linear-v4.onnx", seed=1)
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        for row in sample(5):
            agent.infer(row[None])
        with pytest.raises(InvalidInputError):
            agent.infer(np.zeros((1, 3), np.float32))
        before = report_of(agent)
        old = agent.swap_model(load_runtime(newer, name="linear", version="4"))
        assert old is not None
        old.close()
        swapped = report_of(agent)
        answers = [agent.infer(row[None]) for row in sample(2, seed=9)]
        after = report_of(agent)
        metrics = agent.metrics()
    assert (before.version, before.requests, before.errors) == (3, 6, 1)
    assert before.error_rate == pytest.approx(1 / 6)
    assert (swapped.version, swapped.requests, swapped.errors) == (4, 0, 0)
    assert swapped.p50_ms is None and swapped.p99_ms is None
    assert (after.model, after.version, after.requests, after.errors) == ("linear", 4, 2, 0)
    assert after.p99_ms == nearest_rank([r.latency.total_ms for r in answers], 99)
    assert all(r.model_versions == {"edge": "linear@4"} for r in answers)
    # The whole-agent figures keep counting across the swap.
    assert metrics.requests == 7 and metrics.by_source == {"edge": 7}
    assert metrics.serving.requests == 2 and metrics.model_versions == {"edge": "linear@4"}
    assert metrics.serving.since is not None and metrics.serving.since >= metrics.timestamp - 60


def test_assigning_the_runtime_also_starts_new_counters(linear_onnx: Path) -> None:
    # The updater puts the old model back this way when a commit fails.
    with make_agent(linear_onnx, None, OffloadPolicy.always_local()) as agent:
        agent.infer(sample())
        agent.runtime = load_runtime(linear_onnx, name="linear", version="2")
        report = report_of(agent)
    assert (report.version, report.requests) == (2, 0)


def test_local_runtime_failures_count_as_errors(tmp_path: Path) -> None:
    runtime = load_runtime(write_failing_model(tmp_path / "fails.onnx"), name="fails", version="1")
    with EdgeAgent(runtime, device_id="dev-err", policy=OffloadPolicy.always_local()) as agent:
        agent.infer(sample(1))
        for _ in range(3):
            with pytest.raises(InferenceError):
                agent.infer(sample(2))
        with pytest.raises(InvalidInputError):
            agent.infer(sample(1), deadline_ms=-1)
        report = report_of(agent)
        metrics = agent.metrics()
    assert (report.model, report.version) == ("fails", 1)
    assert (report.requests, report.errors) == (5, 4)
    assert metrics.requests == 1  # the whole-agent count is of answered calls, as before


def test_offloads_and_agreement_are_counted_per_version(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    policy = OffloadPolicy.threshold(-1.0, score="margin")  # every request goes to the cloud
    xs = sample(12, seed=5)
    with (
        Responder(mosquitto.url, agrees_when_first_feature_positive),
        make_agent(linear_onnx, mosquitto.url, policy, cloud_model="linear") as agent,
    ):
        for row in xs:
            agent.infer(row[None], deadline_ms=5000)
        report = report_of(agent)
        agent.swap_model(load_runtime(linear_onnx, name="linear", version="4"))
        agent.infer(xs[:1], deadline_ms=5000)
        after = report_of(agent)
    agreed = int((xs[:, 0] > 0).sum())
    assert (report.requests, report.offloads, report.errors) == (12, 12, 0)
    assert (report.agreement_samples, report.agreed) == (12, agreed)
    assert report.agreement == pytest.approx(agreed / 12)
    assert (after.version, after.requests, after.offloads, after.agreement_samples) == (4, 1, 1, 1)


def test_no_answer_counts_as_an_error_of_a_device_without_a_model() -> None:
    broker = f"mqtt://127.0.0.1:{free_port()}"  # never started: the cloud cannot answer
    agent = EdgeAgent(None, device_id="dev-cloud", broker=broker, cloud_model="linear")
    try:
        with pytest.raises(NoAnswerError):
            agent.infer({"x": sample()})
        report = report_of(agent)
    finally:
        agent.close()
    assert report.model is None and report.version is None and report.capabilities == {}
    # The offload was attempted (and failed at once: no connection).
    assert (report.requests, report.errors, report.offloads) == (1, 1, 1)


def test_async_agent_reports_per_version_counters(linear_onnx: Path, tmp_path: Path) -> None:
    newer = write_linear_classifier(tmp_path / "linear-v5.onnx", seed=2)

    async def main() -> tuple[DeviceReport, DeviceReport]:
        runtime = load_runtime(linear_onnx, name="linear", version="3")
        async with AsyncEdgeAgent(
            runtime, device_id="dev-async-tel", labels={"site": "lab"}
        ) as agent:
            await asyncio.gather(*(agent.infer(row[None]) for row in sample(4)))
            with pytest.raises(InvalidInputError):
                await agent.infer(np.zeros((1, 2), np.float32))
            first = report_of(agent)
            agent.swap_model(load_runtime(newer, name="linear", version="5"))
            await agent.infer(sample())
            return first, report_of(agent)

    first, second = asyncio.run(main())
    assert (first.version, first.requests, first.errors) == (3, 5, 1)
    assert first.labels == {"site": "lab"}
    assert (second.version, second.requests, second.errors) == (5, 1, 0)


def test_unusual_runtime_names_and_versions_are_left_out(linear_onnx: Path) -> None:
    runtime = load_runtime(linear_onnx, name="not a name", version="v3")
    with EdgeAgent(runtime, device_id="dev-odd", policy=OffloadPolicy.always_local()) as agent:
        agent.infer(sample())
        report = report_of(agent)
    assert report.model is None and report.version is None and report.requests == 1
    runtime = load_runtime(linear_onnx, name="linear", version="0")
    with EdgeAgent(runtime, device_id="dev-odd", policy=OffloadPolicy.always_local()) as agent:
        report = report_of(agent)
    assert report.model == "linear" and report.version is None


@pytest.mark.parametrize(
    "labels",
    [
        {f"k{i}": "v" for i in range(33)},
        {"": "v"},
        {"k" * 129: "v"},
        {"site": "v" * 129},
        {"site": 3},
        {3: "v"},
        ["site"],
        {f"k{i}": "é" * 128 for i in range(32)},  # fits the counts, not the report's size
    ],
    ids=[
        "too-many",
        "empty-name",
        "long-name",
        "long-value",
        "int-value",
        "int-name",
        "list",
        "big",
    ],
)
def test_bad_labels_are_refused(linear_onnx: Path, labels: Any) -> None:
    with pytest.raises(ValueError, match="label"):
        make_agent(linear_onnx, None, OffloadPolicy.always_local(), labels=labels)


def test_largest_labels_still_fit_the_report(linear_onnx: Path) -> None:
    labels = {f"label-{i:02d}".ljust(128, "n"): "v" * 100 for i in range(32)}
    with make_agent(linear_onnx, None, OffloadPolicy.always_local(), labels=labels) as agent:
        agent.infer(sample())
        raw = agent.metrics().to_json()
    assert len(raw.encode()) <= DeviceReport.MAX_BYTES
    assert DeviceReport.from_json(raw).labels == labels


def test_reporter_payload_is_a_device_report_across_a_swap(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    topic = Topics().telemetry("dev-fleet")
    listener = TelemetryListener(mosquitto.url, topic)
    try:
        runtime = load_runtime(linear_onnx, name="linear", version="3")
        with EdgeAgent(
            runtime,
            device_id="dev-fleet",
            broker=mosquitto.url,
            policy=OffloadPolicy.always_local(),
            labels={"site": "factory-a"},
        ) as agent:
            for row in sample(3):
                agent.infer(row[None])
            reporter = TelemetryReporter(agent, interval_s=60, qos=1)
            assert reporter.report() is not None
            _, first = listener.messages.get(timeout=10)
            agent.swap_model(load_runtime(linear_onnx, name="linear", version="4"))
            agent.infer(sample())
            assert reporter.report() is not None
            _, second = listener.messages.get(timeout=10)
    finally:
        listener.close()
    before = DeviceReport.from_json(json.dumps(first).encode())
    after = DeviceReport.from_json(json.dumps(second).encode())
    assert (before.device, before.labels) == ("dev-fleet", {"site": "factory-a"})
    assert (before.version, before.requests) == (3, 3)
    assert (after.version, after.requests) == (4, 1)
    assert second["agent_requests"] == 4  # the whole-agent count goes on
