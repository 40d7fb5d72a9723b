"""``shared.MqttSession`` on a real Mosquitto, for both implementations (paho and awscrt).

What every owner of a session (uplink, updater, hub, fleet link) relies on:
a refused or unreachable first connection says why in one line; a PUBACK
that refuses a QoS 1 message (an ACL's "not authorized") is never taken for
an acknowledgement; a QoS 1 message published while the broker is away goes
out when it is back; a lost connection is reported, counted, and the
subscriptions come back by themselves.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from model_cdn import AssignmentSender, BrokerError
from model_cdn.fleet import FleetLink
from shared import (
    InboundMessage,
    MqttSession,
    MqttSettings,
    PahoSession,
    Topics,
)

from ._brokers import MosquittoProcess, free_port, write_password_file

WAIT_S = 10.0  # bound on waiting for something that should happen

# (name, protocol): paho on MQTT 5 and 3.1.1, and awscrt (MQTT 5 only)
KINDS = ["paho-5", "paho-3.1.1", "crt"]


def make_session(kind: str, settings: MqttSettings, **handlers: object) -> MqttSession:
    client_id = f"session-test-{uuid.uuid4().hex[:8]}"
    if kind == "crt":
        from cloud_hub.mqtt._crt_session import CrtSession  # awscrt: a hub (and dev) dependency

        return CrtSession(settings, client_id, **handlers)
    protocol = kind.removeprefix("paho-")
    return PahoSession(settings, client_id, protocol=protocol, **handlers)  # type: ignore[arg-type]


def wait_until(predicate: Callable[[], object], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def as_root() -> str:
    # Run as root, Mosquitto drops to its own user, which cannot read pytest's 0700 tmp dirs.
    return "user root\n" if os.geteuid() == 0 else ""


@pytest.fixture
def password_broker(tmp_path: Path) -> Iterator[MosquittoProcess]:
    """A Mosquitto that lets in only alice, with her password."""
    users = write_password_file(tmp_path / "passwords", {"alice": "right-password"})
    broker = MosquittoProcess(tmp_path, password_file=users).start()
    yield broker
    broker.stop()


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[MosquittoProcess]:
    """A Mosquitto whose ACL lets anyone write under ``open/`` only (and read everything)."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\ntopic read #\n")
    broker = MosquittoProcess(tmp_path, extra_config=f"acl_file {acl}\n{as_root()}").start()
    yield broker
    broker.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_credentials_are_a_refusal_with_its_reason_code(
    kind: str, password_broker: MosquittoProcess
) -> None:
    settings = MqttSettings.from_url(password_broker.url, username="alice", password="wrong")
    session = make_session(kind, settings)
    try:
        # the refusal, not the wait, ends start(): it may wait an hour, and returns at once
        # (the join only bounds a hang)
        returned: list[bool] = []
        starter = threading.Thread(target=lambda: returned.append(session.start(wait_s=3600)))
        starter.start()
        starter.join(6 * WAIT_S)
        assert returned == [False], "the refusal did not end the wait"
        failure = session.connect_failure
        assert failure is not None and failure.refused and failure.refusal is not None
        # Mosquitto: "bad user name or password" (0x86) or "not authorized" (0x87)
        assert failure.refusal.code in (0x86, 0x87), failure
        line = failure.explain(settings.url)
        assert line.startswith(f"the MQTT broker at {settings.url} refused the connection: ")
        assert "\n" not in line and "wrong" not in line  # one line, no password
        assert not session.connected and session.connects == 0
    finally:
        session.stop(timeout_s=1)


@pytest.mark.parametrize("kind", KINDS)
def test_the_right_credentials_connect_and_clear_nothing_to_explain(
    kind: str, password_broker: MosquittoProcess
) -> None:
    settings = MqttSettings.from_url(
        password_broker.url, username="alice", password="right-password"
    )
    session = make_session(kind, settings)
    try:
        assert session.start(wait_s=WAIT_S) is True
        assert session.connect_failure is None and session.connects == 1
    finally:
        session.stop(timeout_s=1)


@pytest.mark.parametrize("kind", KINDS)
def test_an_unreachable_broker_is_not_a_refusal(kind: str) -> None:
    settings = MqttSettings.from_url(f"mqtt://127.0.0.1:{free_port()}", protocol="5")
    session = make_session(kind, settings)
    try:
        assert session.start(wait_s=WAIT_S) is False
        failure = session.connect_failure
        assert failure is not None and not failure.refused
        assert failure.explain(settings.url).startswith(
            f"cannot reach the MQTT broker at {settings.url}: "
        )
    finally:
        session.stop(timeout_s=1)


@pytest.mark.parametrize("kind", ["paho-5", "crt"])
def test_a_puback_refusal_is_not_an_acknowledgement(
    kind: str, acl_broker: MosquittoProcess
) -> None:
    session = make_session(kind, MqttSettings.from_url(acl_broker.url, protocol="5"))
    try:
        assert session.start(wait_s=WAIT_S)
        allowed = session.publish("open/x", b"fine", qos=1)
        denied = session.publish("closed/x", b"not allowed", qos=1)
        assert allowed.wait(WAIT_S) is True
        assert allowed.refusal is None and allowed.done and not allowed.failed
        assert denied.wait(WAIT_S) is False
        assert denied.done and not denied.failed
        assert denied.refusal is not None and denied.refusal.code == 0x87, denied.refusal
        assert "not authorized" in str(denied.refusal).lower()
        # the connection survives a refused message
        assert session.publish("open/y", b"still fine", qos=1).wait(WAIT_S)
    finally:
        session.stop(timeout_s=1)


def test_the_fleet_link_names_a_refused_connection_in_one_line(
    password_broker: MosquittoProcess,
) -> None:
    settings = MqttSettings.from_url(password_broker.url, username="alice", password="wrong")
    link = FleetLink(settings, Topics())
    with pytest.raises(BrokerError, match=r"refused the connection: .*reason code 0x8[67]"):
        link.start(wait_s=WAIT_S)
    assert not link.started  # stopped: it does not keep knocking in the background
    with pytest.raises(BrokerError, match="refused the connection"):
        AssignmentSender.connect(settings, Topics(), ack_timeout_s=WAIT_S)


@pytest.mark.parametrize("kind", ["paho-5", "paho-3.1.1"])
def test_a_puback_says_when_no_subscription_matched(kind: str, mosquitto: MosquittoProcess) -> None:
    """Mosquitto answers an MQTT 5 QoS 1 publish that no subscription matches with reason
    0x10 (accepted, read by nobody): a device's sticky text turn goes elsewhere at once."""
    session = make_session(kind, MqttSettings.from_url(mosquitto.url))
    heard: queue.Queue[InboundMessage] = queue.Queue()
    topic = f"no-subscribers/{uuid.uuid4().hex}"
    try:
        assert session.start(wait_s=WAIT_S)
        nobody = session.publish(f"{topic}/nobody", b"x", qos=1)
        assert nobody.wait(WAIT_S) is True and nobody.refusal is None  # accepted all the same
        assert nobody.no_subscribers is (kind == "paho-5")  # 3.1.1's PUBACK has no reason
        session.on_message = heard.put
        session.subscribe(f"{topic}/read", qos=1)
        assert session.subscribed.wait(WAIT_S)
        read = session.publish(f"{topic}/read", b"y", qos=1)
        assert read.wait(WAIT_S) is True and not read.no_subscribers
        assert heard.get(timeout=WAIT_S).payload == b"y"
    finally:
        session.stop(timeout_s=1)


@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_broker_is_reported_and_the_session_comes_back_subscribed(
    kind: str, own_mosquitto: MosquittoProcess
) -> None:
    changes: queue.Queue[bool] = queue.Queue()
    received: queue.Queue[InboundMessage] = queue.Queue()
    settings = MqttSettings.from_url(own_mosquitto.url, reconnect_max_delay_s=1.0)
    session = make_session(kind, settings, on_message=received.put, on_connection=changes.put)
    topic = f"session/{uuid.uuid4().hex[:8]}"
    session.subscribe(topic)
    try:
        assert session.start(wait_s=WAIT_S)
        assert changes.get(timeout=WAIT_S) is True
        assert session.subscribed.wait(WAIT_S)
        own_mosquitto.stop()
        assert changes.get(timeout=WAIT_S) is False  # at once, so owners fail what they wait for
        assert not session.connected and session.disconnects == 1
        offline = session.publish(topic, b"sent while away", qos=1)
        assert offline.offline and not offline.failed
        own_mosquitto.start()
        assert changes.get(timeout=WAIT_S) is True
        assert session.connects == 2
        assert session.subscribed.wait(WAIT_S)  # subscribed again without being asked
        assert offline.wait(WAIT_S)  # the message kept while away went out
        session.publish(topic, b"after", qos=1)
        payloads = set()
        while b"after" not in payloads:
            payloads.add(received.get(timeout=WAIT_S).payload)
    finally:
        session.stop(timeout_s=1)
    assert session.disconnects == 2  # the stop counts too


@pytest.mark.parametrize("kind", ["paho-5", "crt"])
def test_a_message_handler_that_raises_does_not_stop_the_session(
    kind: str, mosquitto: MosquittoProcess
) -> None:
    received: list[bytes] = []
    got = threading.Event()

    def handler(message: InboundMessage) -> None:
        if message.payload == b"bad":
            raise ValueError("a bug in the owner")
        received.append(message.payload)
        got.set()

    session = make_session(kind, MqttSettings.from_url(mosquitto.url), on_message=handler)
    topic = f"session/{uuid.uuid4().hex[:8]}"
    session.subscribe(topic)
    try:
        assert session.start(wait_s=WAIT_S) and session.subscribed.wait(WAIT_S)
        session.publish(topic, b"bad", qos=1)
        session.publish(topic, b"good", qos=1)
        assert got.wait(WAIT_S) and received == [b"good"]
        assert session.connected and session.disconnects == 0
    finally:
        session.stop(timeout_s=1)
