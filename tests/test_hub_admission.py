"""What the hub does not compute: requests held up past their budget, and a request seen twice.

On a real Mosquitto that the test freezes (SIGSTOP to its PID) while a device
keeps sending, then thaws (SIGCONT): the backlog arrives at once, later than
every request's budget, and is answered ``deadline_exceeded`` without a
computation; the device's next request is computed as usual. A request
published twice with the same id is computed and answered once.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud_hub import Hub
from cloud_hub.mqtt._admission import RecentRequests, TransitBaseline
from shared import ErrorCode, Message, MqttSettings, Topics, encode_message

from ._brokers import MosquittoProcess
from ._models import write_linear_classifier
from ._mqtt_device import Device
from ._plane import wait_until


def x_rows(n: int = 1) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, 16)).astype(np.float32)


@pytest.fixture
def topics() -> Topics:
    return Topics(f"t-{uuid.uuid4().hex[:8]}/v1")


@pytest.fixture
def hub(own_mosquitto: MosquittoProcess, tmp_path: Path, topics: Topics) -> Iterator[Hub]:
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    settings = MqttSettings.from_url(own_mosquitto.url)
    with Hub(tmp_path / "repo", mqtt=settings, topics=topics) as h:
        yield h


def computed(hub: Hub) -> int:
    return sum(b.metrics.snapshot().submitted for b in hub.batchers())


def timed(device: Device, budget_ms: float, *, wait: bool = True) -> str:
    """A request with its budget and send time; ``wait=False`` does not wait for the PUBACK
    (a frozen broker sends none)."""
    message = Message(
        kind="request",
        request_id=uuid.uuid4().hex,
        model="linear",
        device_id=device.device_id,
        timeout_ms=budget_ms,
        sent_at_ms=time.time() * 1000.0,
        tensors={"x": x_rows()},
    )
    topic = device.topics.device_infer(device.device_id, "linear")
    info = device.client.publish(topic, encode_message(message), qos=1)
    if wait:
        info.wait_for_publish(15.0)
    return message.request_id


def test_requests_held_up_by_a_frozen_broker_are_answered_expired_not_computed(
    hub: Hub, own_mosquitto: MosquittoProcess, topics: Topics
) -> None:
    device = Device(own_mosquitto.url, topics)
    assert own_mosquitto.process is not None
    pid = own_mosquitto.process.pid
    try:
        for _ in range(3):  # on time: computed, and the device's transit is learnt
            assert device.reply(timed(device, 1000.0)).ok
        before = computed(hub)
        os.kill(pid, signal.SIGSTOP)
        try:
            held = [timed(device, 300.0, wait=False) for _ in range(10)]  # into its socket
            sent = time.time()
            # The budget of the last one runs out while the broker is still frozen.
            wait_until(lambda: time.time() > sent + 0.6, 10.0, "the held requests' budget")
        finally:
            os.kill(pid, signal.SIGCONT)
        answers = [device.reply() for _ in held]
        assert {a.request_id for a in answers} == set(held)
        assert {a.error for a in answers} == {ErrorCode.DEADLINE_EXCEEDED}
        fresh = timed(device, 1000.0)
        assert device.reply(fresh).ok  # the device's next request is computed as usual
        assert computed(hub) == before + 1  # only the fresh one
        assert hub.mqtt_front is not None and hub.mqtt_front.stats()["expired_in_transit"] == 10
    finally:
        device.close()


def test_the_held_requests_are_told_deadline_exceeded(
    hub: Hub, own_mosquitto: MosquittoProcess, topics: Topics
) -> None:
    device = Device(own_mosquitto.url, topics)
    assert own_mosquitto.process is not None
    pid = own_mosquitto.process.pid
    try:
        assert device.reply(timed(device, 1000.0)).ok
        os.kill(pid, signal.SIGSTOP)
        try:
            held = timed(device, 200.0, wait=False)
            sent = time.time()
            wait_until(lambda: time.time() > sent + 0.5, 10.0, "the held request's budget")
        finally:
            os.kill(pid, signal.SIGCONT)
        reply = device.reply(held)
        assert reply.error is ErrorCode.DEADLINE_EXCEEDED and "not computed" in reply.error_message
    finally:
        device.close()


def test_a_request_published_twice_is_computed_and_answered_once(
    hub: Hub, own_mosquitto: MosquittoProcess, topics: Topics
) -> None:
    device = Device(own_mosquitto.url, topics)
    try:
        before = computed(hub)

        def frame(sender: Device) -> bytes:
            return encode_message(
                Message(
                    kind="request",
                    request_id="same-id",
                    model="linear",
                    device_id=sender.device_id,
                    tensors={"x": x_rows()},
                )
            )

        own = topics.device_infer(device.device_id, "linear")
        device.publish(own, frame(device))
        device.publish(own, frame(device))  # a redelivery, or a retry with the same id
        marker = device.request("linear", {"x": x_rows()})
        got = [device.reply().request_id for _ in range(2)]
        assert sorted(got) == sorted(["same-id", marker])  # in order: nothing else came
        assert device.replies.empty()
        assert computed(hub) == before + 2
        assert hub.mqtt_front is not None and hub.mqtt_front.stats()["duplicates"] == 1
        other = Device(own_mosquitto.url, topics)  # another device may use the same id
        try:
            other.publish(topics.device_infer(other.device_id, "linear"), frame(other))
            assert other.reply("same-id").ok
        finally:
            other.close()
    finally:
        device.close()


def test_a_constant_clock_offset_is_not_lateness() -> None:
    baseline = TransitBaseline(window_s=60.0)
    offset = -3600.0  # the device's clock is an hour ahead: transits look negative
    assert baseline.lateness_s("d", offset + 0.004, now=0.0) == 0.0
    assert baseline.lateness_s("d", offset + 0.006, now=1.0) == pytest.approx(0.002)
    assert baseline.lateness_s("d", offset + 5.0, now=2.0) == pytest.approx(4.996)  # held up
    # A device not heard from for a whole window starts over (no stale baseline).
    assert baseline.lateness_s("d", offset + 9.0, now=200.0) == 0.0


def test_recent_requests_forget_after_their_window_and_beyond_their_size() -> None:
    recent = RecentRequests(window_s=10.0, max_entries=2)
    assert not recent.seen(("d", "1"), 0.0) and recent.seen(("d", "1"), 5.0)
    assert not recent.seen(("d", "1"), 20.0)  # the window passed: a new request
    assert not recent.seen(("d", "2"), 21.0) and not recent.seen(("d", "3"), 22.0)
    assert not recent.seen(("d", "1"), 23.0)  # the oldest was forgotten for room
