"""The in-process amqtt broker against a real paho-mqtt 2.x client speaking MQTT 3.1.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from tandem.broker import BrokerStartError, EmbeddedBroker

from ._brokers import free_port


def _broker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tandem-mqtt-broker")]


class _Client:
    """A paho client whose CONNACK, SUBACK and messages the test can wait for."""

    def __init__(self, port: int, client_id: str) -> None:
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.disconnected = threading.Event()
        self.received: list[mqtt.MQTTMessage] = []
        self.got_message = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311
        )
        self.client.on_connect = lambda c, u, flags, rc, props: self.connected.set()
        self.client.on_subscribe = lambda c, u, mid, rcs, props: self.subscribed.set()
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnected.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(10), "no CONNACK from the embedded broker"

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        self.received.append(msg)
        self.got_message.set()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b
    assert not _broker_threads()


def test_qos1_publish_reaches_a_subscriber(broker: EmbeddedBroker) -> None:
    client = _Client(broker.port, "test-qos1")
    try:
        client.client.subscribe("tandem/test/+", qos=1)
        assert client.subscribed.wait(10), "no SUBACK"
        info = client.client.publish("tandem/test/a", b"\x00\x01hello", qos=1)
        info.wait_for_publish(10)
        assert info.is_published()
        assert client.got_message.wait(10), "the message did not come back"
        (msg,) = client.received
        assert (msg.topic, msg.payload, msg.qos) == ("tandem/test/a", b"\x00\x01hello", 1)
    finally:
        client.close()


def test_port_zero_picks_a_free_port() -> None:
    with EmbeddedBroker(port=0) as b:
        assert b.port > 0
        assert b.url == f"mqtt://127.0.0.1:{b.port}"
        with socket.create_connection(("127.0.0.1", b.port), timeout=5):
            pass


def test_explicit_port_is_used() -> None:
    port = free_port()
    with EmbeddedBroker(port=port) as b:
        assert b.port == port and b.running


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = EmbeddedBroker(port=port)
        with pytest.raises(BrokerStartError, match="already in use"):
            b.start()
        assert not b.running
    assert not _broker_threads()


def test_start_stop_twice_leaves_no_thread() -> None:
    b = EmbeddedBroker()
    ports = []
    for round_ in range(2):
        b.start()
        assert b.running and len(_broker_threads()) == 1
        ports.append(b.port)
        client = _Client(b.port, f"test-restart-{round_}")
        client.close()
        b.stop()
        assert not b.running and not _broker_threads()
    assert ports[0] == ports[1]  # a restarted broker keeps its port, so clients can reconnect
    b.stop()  # stopping twice is harmless


def test_stop_with_a_client_still_connected() -> None:
    b = EmbeddedBroker().start()
    client = _Client(b.port, "test-still-connected")
    try:
        client.client.subscribe("tandem/test/x", qos=1)
        assert client.subscribed.wait(10)
        client.client.publish("tandem/test/x", b"x", qos=1).wait_for_publish(10)
        assert client.got_message.wait(10)
        b.stop(timeout_s=15)
        assert not _broker_threads()
        assert client.disconnected.wait(10), "the client did not see the broker go"
    finally:
        client.client.loop_stop()
        b.stop()


def test_invalid_port_is_refused() -> None:
    with pytest.raises(ValueError, match="port"):
        EmbeddedBroker(port=70000)


def test_a_packet_over_the_limit_ends_its_connection_and_reaches_no_one() -> None:
    """amqtt has no size limit of its own; the embedded broker refuses before reading."""
    with EmbeddedBroker(max_packet_bytes=4096) as b:
        hub, sender = _Client(b.port, "cap-hub"), _Client(b.port, "cap-sender")
        try:
            hub.client.subscribe("tandem/cap/+", qos=1)
            assert hub.subscribed.wait(10), "no SUBACK"
            sender.client.publish("tandem/cap/big", b"x" * 8192, qos=1)
            assert sender.disconnected.wait(10), "the broker kept a client over the limit"
            other = _Client(b.port, "cap-other")  # everyone else is served as before
            try:
                other.client.publish("tandem/cap/small", b"y" * 1000, qos=1)
                assert hub.got_message.wait(10), "a message within the limit was lost"
                assert [m.topic for m in hub.received] == ["tandem/cap/small"]
            finally:
                other.close()
        finally:
            hub.close()
            sender.close()


def test_the_default_limit_is_tandems_frame_limit() -> None:
    from shared import Limits, mqtt_max_packet_bytes

    assert EmbeddedBroker().max_packet_bytes == mqtt_max_packet_bytes()
    assert mqtt_max_packet_bytes() > Limits().max_frame_bytes
