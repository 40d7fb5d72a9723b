"""The hub over a real Mosquitto: replies, typed errors, shared subscriptions, crashes.

A raw paho client plays the device: it publishes encoded frames on the
request topics and collects the replies on its own reply topic. Every test
uses its own topic prefix, so tests sharing the session's broker never see
each other's traffic.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cloud_hub import CallableExecutor, Hub, ModelConfig
from shared import (
    FORMAT_MAJOR,
    MAGIC,
    ErrorCode,
    Limits,
    Message,
    MqttSettings,
    Topics,
    encode_message,
)

from ._brokers import free_port
from ._models import linear_classifier_weights, write_linear_classifier
from ._mqtt_device import WAIT_S, Device

ROOT = Path(__file__).resolve().parents[1]


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """A frame with a hand-written header, for requests the encoder would refuse."""
    raw = json.dumps(header).encode()
    return struct.pack("<4sBBHI", MAGIC, FORMAT_MAJOR, 0, 0, len(raw)) + raw + payload


def x_rows(n: int = 2) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, 16)).astype(np.float32)


def logits(x: np.ndarray) -> np.ndarray:
    weight, bias = linear_classifier_weights()
    return x @ weight + bias


@pytest.fixture
def topics() -> Topics:
    return Topics(f"t-{uuid.uuid4().hex[:8]}/v1")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    return tmp_path / "repo"


@pytest.fixture
def make_hub(mosquitto, repo, topics) -> Iterator:
    hubs: list[Hub] = []

    def make(**options: Any) -> Hub:
        options.setdefault("mqtt", MqttSettings.from_url(mosquitto.url))
        options.setdefault("topics", topics)
        hub = Hub(repo, **options)
        hubs.append(hub)
        return hub.start()

    yield make
    for hub in hubs:
        hub.stop()


@pytest.fixture
def make_device(mosquitto, topics) -> Iterator:
    devices: list[Device] = []

    def make(**options: Any) -> Device:
        device = Device(mosquitto.url, topics, **options)
        devices.append(device)
        return device

    yield make
    for device in devices:
        device.close()


@pytest.mark.parametrize("protocol", [mqtt.MQTTv5, mqtt.MQTTv311], ids=["mqtt5", "mqtt311"])
def test_a_request_gets_the_models_answer(make_hub, make_device, protocol):
    make_hub()
    device = make_device(protocol=protocol)
    x = x_rows(3)
    request_id = device.request("linear", {"x": x}, timeout_ms=5000.0)
    reply, properties = device.reply_with_properties(request_id)
    assert reply.ok and reply.kind == "reply" and reply.model_version == "1"
    assert reply.device_id == device.device_id
    np.testing.assert_allclose(reply.tensors["logits"], logits(x), rtol=1e-5, atol=1e-5)
    assert set(reply.timing) == {"queue_ms", "compute_ms", "hub_ms"}
    if protocol == mqtt.MQTTv5:  # the hub speaks 5 to a 5 broker and sets the reply properties
        assert 1 <= properties.MessageExpiryInterval <= 5
        # Correlation travels in the envelope; correlation data only echoes a request's own.
        assert not hasattr(properties, "CorrelationData")


def test_an_mqtt5_response_topic_and_correlation_data_are_honoured(make_hub, make_device, topics):
    make_hub()
    device = make_device()
    message = Message(kind="request", request_id="r-1", model="linear", tensors={"x": x_rows(1)})
    properties = Properties(PacketTypes.PUBLISH)
    properties.ResponseTopic = device.reply_topic
    properties.CorrelationData = b"opaque-42"
    device.client.publish(
        topics.device_infer(device.device_id, "linear"),
        encode_message(message),
        qos=1,
        properties=properties,
    ).wait_for_publish(WAIT_S)
    reply, reply_properties = device.reply_with_properties("r-1")
    assert reply.ok
    assert reply_properties.CorrelationData == b"opaque-42"


def test_every_bad_request_gets_a_typed_error_and_the_hub_keeps_serving(
    make_hub, make_device, topics
):
    hub = make_hub(limits=Limits(max_tensor_bytes=8192))

    def flaky(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if np.isnan(inputs["x"]).any():
            raise ValueError("model exploded")
        return {"y": inputs["x"]}

    hub.add_model(
        "flaky",
        CallableExecutor(flaky),
        config=ModelConfig.from_json(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "dims": [16]}],
                "outputs": [{"name": "y", "datatype": "FP32", "dims": [16]}],
                "allow_non_finite": True,  # NaN reaches this model (which then fails)
            }
        ),
    )
    device = make_device()
    reply_to = device.reply_topic

    def expect(code: ErrorCode, fragment: str, request_id: str | None = None) -> None:
        reply = device.reply(request_id)
        assert (reply.error, reply.kind) == (code, "reply"), reply.error_message
        assert fragment in reply.error_message
        assert "hub_ms" in reply.timing

    # Garbage without a readable header has no one to answer: dropped, nothing sent.
    device.publish(topics.device_infer(device.device_id, "linear"), b"\x00garbage\xff" * 10)
    # A readable header with broken tensors: answered.
    device.publish(
        topics.device_infer(device.device_id, "linear"),
        frame(
            {
                "kind": "request",
                "id": "broken-tensors",
                "model": "linear",
                "reply_to": reply_to,
                "tensors": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 16],
                        "nbytes": 64,
                        "raw_nbytes": 64,
                    }
                ],
            },
            b"short",
        ),
    )
    expect(ErrorCode.BAD_REQUEST, "truncated", "broken-tensors")
    device.publish(
        topics.device_infer(device.device_id, "linear"),
        frame(
            {
                "kind": "request",
                "id": "bad-header",
                "model": "linear",
                "reply_to": reply_to,
                "timeout_ms": -5,
                "tensors": [],
            }
        ),
    )
    expect(ErrorCode.BAD_REQUEST, "timeout_ms", "bad-header")
    device.publish(
        topics.device_infer(device.device_id, "linear"),
        frame(
            {
                "kind": "request",
                "id": "other-model",
                "model": "resnet",
                "reply_to": reply_to,
                "tensors": [],
            }
        ),
    )
    expect(ErrorCode.BAD_REQUEST, "came on topic", "other-model")
    expect(ErrorCode.UNKNOWN_MODEL, "no model 'resnet'", device.request("resnet", {"x": x_rows()}))
    expect(
        ErrorCode.INVALID_INPUT,
        "must be FP32, got FP64",
        device.request("linear", {"x": x_rows().astype(np.float64)}),
    )
    expect(
        ErrorCode.INVALID_INPUT,
        "must have shape [?, 16]",
        device.request("linear", {"x": np.zeros((2, 15), np.float32)}),
    )
    expect(
        ErrorCode.TOO_LARGE,
        "limit is 8192",
        device.request("linear", {"x": np.zeros((200, 16), np.float32)}),
    )
    expect(
        ErrorCode.TOO_LARGE,
        "at most 64 per batch",
        device.request("linear", {"x": np.zeros((65, 16), np.float32)}),
    )
    expect(
        ErrorCode.DEADLINE_EXCEEDED,
        "deadline",
        device.request("linear", {"x": x_rows()}, timeout_ms=0.0),
    )
    nan = np.full((1, 16), np.nan, np.float32)
    expect(ErrorCode.INTERNAL, "model exploded", device.request("flaky", {"x": nan}))
    inf = x_rows(1)
    inf[0, 3] = np.inf
    expect(ErrorCode.INVALID_INPUT, "1 NaN or infinite", device.request("linear", {"x": inf}))

    x = x_rows(2)
    good = device.reply(device.request("linear", {"x": x}))
    assert good.ok
    np.testing.assert_allclose(good.tensors["logits"], logits(x), rtol=1e-5, atol=1e-5)
    assert device.replies.empty()  # the garbage got no reply
    assert hub.mqtt_front is not None and hub.mqtt_front.stats()["dropped"] == 1


def test_a_full_queue_answers_overloaded_at_once(make_hub, make_device):
    hub = make_hub()
    entered, gate = threading.Event(), threading.Event()

    def slow(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if inputs["x"][0, 0] == 1.0:  # the warm-up batch is all zeros and passes straight
            entered.set()
            assert gate.wait(WAIT_S)
        return {"y": inputs["x"]}

    hub.add_model(
        "slow",
        CallableExecutor(slow),
        config=ModelConfig.from_json(
            {
                "max_batch_size": 1,
                "max_queue_size": 1,
                "max_queue_delay_ms": 0,
                "inputs": [{"name": "x", "datatype": "FP32", "dims": [1]}],
                "outputs": [{"name": "y", "datatype": "FP32", "dims": [1]}],
            }
        ),
    )
    device = make_device()
    try:
        first = device.request("slow", {"x": np.ones((1, 1), np.float32)})
        assert entered.wait(WAIT_S)
        queued = device.request("slow", {"x": np.full((1, 1), 2, np.float32)})
        refused = device.request("slow", {"x": np.full((1, 1), 3, np.float32)})
        reply = device.reply(refused)
        assert reply.error is ErrorCode.OVERLOADED and "queue full" in reply.error_message
    finally:
        gate.set()
    answers = {device.reply().request_id: True for _ in range(2)}
    assert set(answers) == {first, queued}


def test_two_replicas_share_the_load_and_answer_each_request_once(make_hub, make_device):
    group = f"g{uuid.uuid4().hex[:6]}"
    hubs = [make_hub(share_group=group), make_hub(share_group=group)]
    device = make_device()
    sent = [device.request("linear", {"x": x_rows(1)}) for _ in range(40)]
    received = [device.reply().request_id for _ in sent]
    assert sorted(received) == sorted(sent)
    served = [sum(s.submitted for s in hub.metrics().values()) for hub in hubs]
    assert sum(served) == len(sent) and min(served) > 0


def test_the_hub_resubscribes_after_the_broker_restarts(own_mosquitto, repo, topics):
    settings = MqttSettings.from_url(own_mosquitto.url, reconnect_max_delay_s=1.0)
    with Hub(repo, mqtt=settings, topics=topics):
        device = Device(own_mosquitto.url, topics)
        try:
            assert device.reply(device.request("linear", {"x": x_rows()})).ok
            own_mosquitto.stop()
            own_mosquitto.start()
            assert answered_eventually(device)
        finally:
            device.close()


def answered_eventually(device: Device, within_s: float = 30.0) -> bool:
    """Send requests until one is answered: nothing answers before the hub has subscribed."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            request_id = device.request("linear", {"x": x_rows()}, timeout_ms=250.0)
        except RuntimeError:  # the device itself is not connected (yet)
            time.sleep(0.25)
            continue
        try:
            while True:
                reply = device.replies.get(timeout=0.25)[0]
                if reply.request_id == request_id:
                    return reply.ok
        except queue.Empty:
            continue
    return False


@pytest.mark.slow
def test_a_hub_process_killed_with_sigkill_is_replaced_by_a_new_one(
    mosquitto, repo, topics, make_device, tmp_path
):
    device = make_device()
    command = [
        sys.executable,
        "-m",
        "cloud_hub",
        "--repo",
        str(repo),
        "--broker",
        mosquitto.url,
        "--prefix",
        topics.prefix,
        "--share-group",
        f"g{uuid.uuid4().hex[:6]}",
        "--log-level",
        "warning",
        "--http-port",
        "0",
    ]

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / "hub.log").open("ab")
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return process

    first = start()
    try:
        assert answered_eventually(device), (tmp_path / "hub.log").read_text()
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(WAIT_S) == -signal.SIGKILL
        second = start()
        try:
            assert answered_eventually(device), (tmp_path / "hub.log").read_text()
            second.send_signal(signal.SIGTERM)  # a clean stop: exit status 0
            assert second.wait(WAIT_S) == 0
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def child_pids(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def wait_http_ready(port: int) -> None:
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"the hub's HTTP API on {port} never became ready")


def mqtt_answers_counted(port: int) -> float:
    """Requests the hub answered over MQTT, from its /metrics (every process's)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tandem_inference_request_success_total{") and "mqtt" in line
    )


@pytest.mark.slow
def test_hub_processes_share_the_requests_count_them_all_and_never_outlive_the_hub(
    mosquitto, repo, topics, make_device, tmp_path
):
    device = make_device()
    port = free_port()
    command = [
        sys.executable, "-m", "cloud_hub", "--repo", str(repo), "--broker", mosquitto.url,
        "--prefix", topics.prefix, "--share-group", f"g{uuid.uuid4().hex[:6]}",
        "--log-level", "warning", "--http-port", str(port), "--workers", "2",
    ]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / "hub.log").open("ab")
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return process

    def gone(pid: int) -> bool:
        end = time.monotonic() + WAIT_S
        while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
            time.sleep(0.05)
        return not Path(f"/proc/{pid}").exists()

    def processes_of(hub: subprocess.Popen[bytes]) -> list[int]:
        end = time.monotonic() + WAIT_S  # the executor, 2 MQTT and 1 HTTP ingress
        while len(child_pids(hub.pid)) < 4 and time.monotonic() < end:
            time.sleep(0.05)
        pids = child_pids(hub.pid)
        assert len(pids) == 4, pids
        return pids

    hub = start()
    try:
        assert answered_eventually(device), (tmp_path / "hub.log").read_text()
        children = processes_of(hub)
        wait_http_ready(port)  # the HTTP ingress starts last
        before = mqtt_answers_counted(port)
        for _ in range(40):
            assert device.reply(device.request("linear", {"x": x_rows()})).ok
        end = time.monotonic() + WAIT_S  # /metrics sums every process's count (dumped ~1/s)
        while mqtt_answers_counted(port) - before < 40 and time.monotonic() < end:
            time.sleep(0.1)
        assert mqtt_answers_counted(port) - before == 40
        hub.send_signal(signal.SIGTERM)  # a clean stop takes every process down with it
        assert hub.wait(WAIT_S) == 0
        assert all(gone(pid) for pid in children)

        hub = start()
        assert answered_eventually(device), (tmp_path / "hub.log").read_text()
        children = processes_of(hub)
        hub.kill()  # no goodbye: the kernel tells each child its parent is gone
        hub.wait(WAIT_S)
        assert all(gone(pid) for pid in children), "an orphaned hub process kept running"
    finally:
        if hub.poll() is None:
            hub.kill()
            hub.wait()


def test_a_flood_of_junk_frames_is_counted_but_logged_at_a_bounded_rate(
    make_hub, make_device, topics, caplog
):
    """One warning line per junk frame let a device fill the hub's log at will."""
    hub = make_hub()
    device = make_device()
    own = topics.device_infer(device.device_id, "linear")
    with caplog.at_level("WARNING", logger="cloud_hub"):
        for _ in range(100):  # no readable header: nobody to answer, dropped
            device.client.publish(own, b"\x00junk\xff", qos=1)
        request_id = device.request("linear", {"x": x_rows(1)})
        assert device.reply(request_id).ok  # after the junk, in order: the hub kept serving
        assert hub.mqtt_front.stats()["dropped"] == 100  # every one counted
        lines = [r for r in caplog.records if r.getMessage().startswith("dropped ")]
        assert 1 <= len(lines) <= 10
        hub.stop()  # the count of what was not logged comes out once
    summary = [r.getMessage() for r in caplog.records if "not logged one by one" in r.getMessage()]
    assert len(summary) == 1 and summary[0].startswith(f"{100 - len(lines)} more dropped frames")
