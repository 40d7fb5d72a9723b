"""Broker settings from URLs, and the paho client factory against a real Mosquitto."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from shared import ConfigError, MqttSettings, TlsSettings, create_client, resolve_protocol

from ._brokers import MosquittoProcess, free_port

# -- MqttSettings.from_url ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "tls"),
    [
        ("mqtt://broker.local", "broker.local", 1883, False),
        ("mqtt://broker.local:1884", "broker.local", 1884, False),
        ("mqtts://broker.local", "broker.local", 8883, True),
        ("mqtts://broker.local:443", "broker.local", 443, True),
        ("tcp://10.0.0.2", "10.0.0.2", 1883, False),
        ("ssl://10.0.0.2", "10.0.0.2", 8883, True),
        ("mqtt://[::1]:1999", "::1", 1999, False),
        ("mqtt://127.0.0.1:65535", "127.0.0.1", 65535, False),
        ("mqtt://Broker.Local/", "broker.local", 1883, False),
    ],
)
def test_from_url_reads_host_port_and_tls(url: str, host: str, port: int, tls: bool) -> None:
    settings = MqttSettings.from_url(url)
    assert (settings.host, settings.port) == (host, port)
    assert (settings.tls is not None) is tls
    assert settings.username is None
    assert settings.password is None


def test_from_url_reads_credentials_with_percent_escapes() -> None:
    settings = MqttSettings.from_url("mqtts://dev%40site:p%3Ass%2Fw%25rd%20x@broker:8884")
    assert settings.username == "dev@site"
    assert settings.password == "p:ss/w%rd x"
    assert (settings.host, settings.port) == ("broker", 8884)
    assert settings.tls == TlsSettings()


def test_from_url_with_user_only() -> None:
    settings = MqttSettings.from_url("mqtt://edge-7@broker")
    assert settings.username == "edge-7"
    assert settings.password is None


def test_from_url_passes_options_on() -> None:
    settings = MqttSettings.from_url("mqtt://broker", protocol="3.1.1", keepalive_s=10)
    assert settings.protocol == "3.1.1"
    assert settings.keepalive_s == 10
    with pytest.raises(ConfigError):
        MqttSettings.from_url("mqtt://broker", protocol="4")


@pytest.mark.parametrize(
    "url",
    [
        "http://broker",
        "ws://broker:9001",
        "broker:1883",
        "broker",
        "",
        "mqtt://",
        "mqtt://:1883",
        "mqtt://user:pass@",
        "mqtt://broker:0",  # not the default port
        "mqtt://broker:65536",
        "mqtt://broker:99999",
        "mqtt://broker:-1",
        "mqtt://broker:abc",
        "mqtt://[::1",
        "mqtt://[::1]:x",
    ],
)
def test_bad_broker_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        MqttSettings.from_url(url)


def test_non_string_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        MqttSettings.from_url(None)  # type: ignore[arg-type]


def test_url_property_omits_the_password_and_round_trips() -> None:
    for url in (
        "mqtt://broker:1883",
        "mqtts://dev%40site@broker:8883",
        "mqtt://[::1]:1999",
    ):
        settings = MqttSettings.from_url(url)
        assert settings.url == url
        assert MqttSettings.from_url(settings.url) == settings
    secret = MqttSettings.from_url("mqtt://u:secret@broker")
    assert "secret" not in secret.url


@pytest.mark.parametrize(
    "fields",
    [
        {"host": ""},
        {"port": 0},
        {"port": 70000},
        {"port": "1883"},
        {"port": True},
        {"protocol": "4"},
        {"keepalive_s": -1},
        {"connect_timeout_s": 0},
        {"reconnect_min_delay_s": 0},
        {"reconnect_min_delay_s": 2.0, "reconnect_max_delay_s": 1.0},
    ],
)
def test_settings_validate_their_fields(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        MqttSettings(**fields)


def test_settings_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        MqttSettings("broker")  # type: ignore[call-arg]
    settings = MqttSettings()
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


# -- create_client --------------------------------------------------------------------------


@contextmanager
def connected(client: mqtt.Client, broker: MosquittoProcess) -> Iterator[mqtt.Client]:
    """``client`` connected to ``broker`` with its network loop running; cleaned up after."""
    ready = threading.Event()
    codes: list[Any] = []

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        codes.append(reason)
        ready.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", broker.port, keepalive=30)
    client.loop_start()
    try:
        assert ready.wait(10), "no CONNACK from the broker"
        assert not codes[0].is_failure
        yield client
    finally:
        client.disconnect()
        client.loop_stop()


def nodelay(client: mqtt.Client) -> int:
    sock = client.socket()
    assert isinstance(sock, socket.socket)
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_create_client_sets_tcp_nodelay_on_the_real_socket(mosquitto: MosquittoProcess) -> None:
    settings = MqttSettings.from_url(mosquitto.url)
    for protocol in ("5", "3.1.1"):
        client = create_client(settings, f"test-nodelay-{protocol}", protocol=protocol)
        with connected(client, mosquitto):
            assert nodelay(client) != 0


def test_create_client_leaves_nagle_on_when_asked(mosquitto: MosquittoProcess) -> None:
    settings = MqttSettings.from_url(mosquitto.url, tcp_nodelay=False)
    client = create_client(settings, "test-nagle")
    with connected(client, mosquitto):
        assert nodelay(client) == 0


def test_create_client_applies_protocol_credentials_and_timeouts() -> None:
    settings = MqttSettings.from_url("mqtt://u%20x:p%40ss@broker", connect_timeout_s=1.5)
    v5 = create_client(settings, "c5")
    v311 = create_client(settings, "c311", protocol="3.1.1")
    assert v5.protocol == mqtt.MQTTv5
    assert v311.protocol == mqtt.MQTTv311
    for client in (v5, v311):
        assert client.username == "u x"
        assert client.password == "p@ss"
        assert client.connect_timeout == 1.5


def test_create_client_with_tls_settings() -> None:
    client = create_client(MqttSettings.from_url("mqtts://broker"), "tls")
    assert client.socket() is None  # configured, not connected


# -- resolve_protocol -----------------------------------------------------------------------


def test_resolve_protocol_finds_mqtt5_on_mosquitto(mosquitto: MosquittoProcess) -> None:
    assert resolve_protocol(MqttSettings.from_url(mosquitto.url)) == "5"


def test_resolve_protocol_falls_back_to_311_when_nothing_listens() -> None:
    settings = MqttSettings(port=free_port(), connect_timeout_s=2.0)
    assert resolve_protocol(settings) == "3.1.1"


def test_resolve_protocol_keeps_an_explicit_choice_without_connecting() -> None:
    port = free_port()  # nothing listens: an attempt to connect would say 3.1.1
    assert resolve_protocol(MqttSettings(port=port, protocol="5")) == "5"
    assert resolve_protocol(MqttSettings(port=port, protocol="3.1.1")) == "3.1.1"


def test_packed_publish_properties_read_back_as_paho_properties() -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from shared import publish_properties

    assert publish_properties() is None
    packed = publish_properties(correlation_data=b"req-7" * 40, expiry_interval_s=12)
    assert packed is not None
    parsed, length = Properties(PacketTypes.PUBLISH).unpack(packed.pack())
    assert length == len(packed.pack())
    assert parsed.CorrelationData == b"req-7" * 40  # a length needing two varint bytes
    assert parsed.MessageExpiryInterval == 12
    only_expiry = publish_properties(expiry_interval_s=2**40)
    assert only_expiry is not None
    assert Properties(PacketTypes.PUBLISH).unpack(only_expiry.pack())[0].MessageExpiryInterval == (
        2**32 - 1
    )
    with pytest.raises(ValueError, match="65535"):
        publish_properties(correlation_data=bytes(70_000))
