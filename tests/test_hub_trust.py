"""Attacks on the hub by a device with valid credentials, each staged on a real Mosquitto.

A device publishes requests on its own topic (``…/dev/{device}/infer/{model}``),
which the broker's ACL lets only that device write; the hub answers on that
device's reply topic, whatever the frame says.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud_hub import Hub
from shared import ErrorCode, Message, MqttSettings, Topics, encode_message, new_request_id

from ._models import linear_classifier_weights, write_linear_classifier
from ._mqtt_device import WAIT_S, Device


def x_rows(n: int = 2) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, 16)).astype(np.float32)


@pytest.fixture
def topics() -> Topics:
    return Topics(f"t-{uuid.uuid4().hex[:8]}/v1")


@pytest.fixture
def hub(mosquitto: Any, tmp_path: Path, topics: Topics) -> Iterator[Hub]:
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    with Hub(tmp_path / "repo", mqtt=MqttSettings.from_url(mosquitto.url), topics=topics) as h:
        yield h


@pytest.fixture
def devices(mosquitto: Any, topics: Topics) -> Iterator[tuple[Device, Device]]:
    attacker, victim = Device(mosquitto.url, topics), Device(mosquitto.url, topics)
    yield attacker, victim
    attacker.close()
    victim.close()


def test_a_request_on_a_devices_own_topic_is_answered_on_its_reply_topic(
    hub: Hub, devices: tuple[Device, Device]
) -> None:
    device, _ = devices
    x = x_rows()
    request_id = device.request("linear", {"x": x}, own_topic=True)
    reply = device.reply(request_id)
    weight, bias = linear_classifier_weights()
    np.testing.assert_allclose(reply.tensors["logits"], x @ weight + bias, rtol=1e-5, atol=1e-5)


def test_reply_redirection_to_another_device_goes_back_to_the_sender(
    hub: Hub, devices: tuple[Device, Device]
) -> None:
    attacker, victim = devices
    ids = [
        attacker.request("linear", {"x": x_rows()}, own_topic=True, reply_to=victim.reply_topic)
        for _ in range(10)
    ]
    got = [attacker.reply().request_id for _ in ids]
    assert sorted(got) == sorted(ids)  # every reply came back to the attacker itself ...
    with pytest.raises(queue.Empty):  # ... and none to the victim (the last one is long in)
        victim.replies.get_nowait()


def test_by_default_a_first_layout_request_gets_nothing_and_redirects_nothing(
    hub: Hub, devices: tuple[Device, Device], caplog: pytest.LogCaptureFixture
) -> None:
    """Legacy topics are off unless asked for: the redirectable layout is not even heard."""
    attacker, victim = devices
    planted = attacker.request(
        "linear", {"x": x_rows()}, own_topic=False, reply_to=victim.reply_topic
    )
    later = attacker.request("linear", {"x": x_rows()}, own_topic=True)
    assert attacker.reply().request_id == later  # served in order: the first was never taken
    assert victim.replies.empty() and attacker.replies.empty(), planted
    assert hub.mqtt_front is not None and hub.mqtt_front.stats()["received"] == 1
    assert "legacy topics on" not in caplog.text


def test_legacy_topics_are_an_opt_in_that_warns_while_on(
    mosquitto: Any,
    tmp_path: Path,
    topics: Topics,
    devices: tuple[Device, Device],
    caplog: pytest.LogCaptureFixture,
) -> None:
    attacker, victim = devices
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    settings = MqttSettings.from_url(mosquitto.url)
    with (
        caplog.at_level("WARNING", logger="cloud_hub"),
        Hub(tmp_path / "repo", mqtt=settings, topics=topics, legacy_topics=True),
    ):
        request_id = attacker.request("linear", {"x": x_rows()}, own_topic=False)
        assert attacker.reply(request_id).ok  # the migration still works while opted in
    warned = [r for r in caplog.records if "legacy topics on" in r.getMessage()]
    assert warned and warned[0].levelname == "WARNING"
    assert topics.infer_filter() in warned[0].getMessage()
    assert victim.replies.empty()


def test_a_header_naming_another_device_is_refused_to_the_sender(
    hub: Hub, devices: tuple[Device, Device]
) -> None:
    attacker, victim = devices
    message = Message(
        kind="request",
        request_id=new_request_id(),
        model="linear",
        device_id=victim.device_id,
        reply_to=victim.reply_topic,
        tensors={"x": x_rows()},
    )
    attacker.publish(
        attacker.topics.device_infer(attacker.device_id, "linear"), encode_message(message)
    )
    reply = attacker.reply(message.request_id)
    assert reply.error is ErrorCode.BAD_REQUEST and victim.device_id in reply.error_message
    assert victim.replies.empty()


@pytest.mark.parametrize("own_topic", [True, False])
def test_a_retained_request_is_never_answered(
    mosquitto: Any, tmp_path: Path, topics: Topics, devices: tuple[Device, Device], own_topic: bool
) -> None:
    attacker, victim = devices
    planted = attacker.request(
        "linear", {"x": x_rows()}, own_topic=own_topic, retain=True, reply_to=victim.reply_topic
    )
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    try:
        # The hub starts after the retained request exists: the broker hands it over on
        # subscribe, before any later message, so once a later request is answered, the
        # retained one would have been too.
        settings = MqttSettings.from_url(mosquitto.url)
        with Hub(tmp_path / "repo", mqtt=settings, topics=topics, legacy_topics=True) as h:
            later = attacker.request("linear", {"x": x_rows()}, own_topic=True)
            assert attacker.reply().request_id == later
            assert h.mqtt_front is not None and h.mqtt_front.stats().get("dropped", 0) >= 1
        assert victim.replies.empty() and attacker.replies.empty(), planted
    finally:  # clear the retained message for whoever uses this broker next
        topic = (
            topics.device_infer(attacker.device_id, "linear")
            if own_topic
            else topics.infer("linear")
        )
        attacker.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(WAIT_S)


def test_the_c_mqtt_client_sends_without_nagle(mosquitto: Any) -> None:
    """awscrt leaves Nagle on; a reply written alone then waited for a delayed ACK (40 ms)."""
    import os
    import socket

    from cloud_hub.mqtt._crt_session import CrtSession

    settings = MqttSettings.from_url(mosquitto.url)
    session = CrtSession(settings, f"nagle-{uuid.uuid4().hex[:6]}")
    try:
        assert session.start(wait_s=10)
        flags = []
        for name in os.listdir("/proc/self/fd"):
            try:
                dup = socket.fromfd(int(name), socket.AF_INET, socket.SOCK_STREAM)
            except OSError:
                continue
            with dup:
                try:
                    peer = dup.getpeername()
                except OSError:
                    continue
                if isinstance(peer, tuple) and peer[1] == settings.port:  # not a unix socket
                    flags.append(dup.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        assert flags and all(flags), flags
    finally:
        session.stop(timeout_s=2)
