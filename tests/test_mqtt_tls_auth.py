"""The edge uplink over TLS with credentials, against a real Mosquitto.

A throwaway CA signs a server certificate for 127.0.0.1 / localhost; the broker
listens in TLS only and lets in only the users of its password file. A right
URL + CA gets cloud answers; a wrong password or a CA that did not sign the
server's certificate must end in a local answer marked fallback, promptly and
without an exception (pytest-timeout, 120 s, guards against a hang).
"""

from __future__ import annotations

import base64
import gc
import re
import shutil
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest

from edge_agent import EdgeAgent, MqttUplink, OffloadPolicy, Source
from edge_agent.runtimes import load_runtime
from shared import Message, MqttSettings, TlsSettings, create_client, resolve_protocol

from ._brokers import BrokerTls, MosquittoProcess, mosquitto_password_hash, write_password_file
from ._models import linear_classifier_weights
from ._needs import need
from ._pki import Pki, make_pki
from ._responder import Responder

USER, PASSWORD = "edge-7", "s3cret:p@ss/w%rd"  # URL-special characters, percent-escaped below
HUB_USER, HUB_PASSWORD = "hub", "hub-pass"

W_EDGE, B_EDGE = linear_classifier_weights(seed=0)  # what linear_onnx computes
W_CLOUD, B_CLOUD = linear_classifier_weights(seed=1)  # the Responder's "bigger" model

# paho-mqtt 2.x does not close the SSLSocket when the TLS handshake fails; shared's
# create_client hands paho a context whose sockets close themselves (see the last test:
# a leak would surface as a ResourceWarning, which filterwarnings=error fails on).


def cloud_answer(request: Message) -> Message:
    return request.reply(tensors={"logits": request.tensors["x"] @ W_CLOUD + B_CLOUD})


def sample(n: int = 1, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[MosquittoProcess]:
    """Mosquitto with one TLS listener, no anonymous access, a password file."""
    d = tmp_path_factory.mktemp("mosquitto-tls")
    passwords = write_password_file(d / "passwd", {USER: PASSWORD, HUB_USER: HUB_PASSWORD})
    broker = MosquittoProcess(
        d,
        password_file=passwords,
        tls=BrokerTls(cafile=pki.ca, certfile=pki.server_cert, keyfile=pki.server_key),
    ).start()
    yield broker
    broker.stop()


def settings_for(
    broker: MosquittoProcess, user: str, password: str, ca: Path, **options: Any
) -> MqttSettings:
    url = f"mqtts://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{broker.port}"
    return MqttSettings.from_url(url, tls=TlsSettings(ca_certs=str(ca)), **options)


def make_agent(linear_onnx: Path, broker: MqttSettings, device_id: str) -> EdgeAgent:
    runtime = load_runtime(linear_onnx, name="linear", version="3")
    return EdgeAgent(
        runtime,
        device_id=device_id,
        broker=broker,
        policy=OffloadPolicy.always_cloud(),
        cloud_model="linear",
    )


def connack(settings: MqttSettings) -> Any:
    """The CONNACK reason a plain paho client gets with ``settings`` (TLS errors raise)."""
    client = create_client(settings, f"tls-check-{id(settings):x}", protocol="5")
    answered = threading.Event()
    reasons: list[Any] = []

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        reasons.append(reason)
        answered.set()

    client.on_connect = on_connect
    client.connect(settings.host, settings.port, keepalive=30)
    client.loop_start()
    try:
        assert answered.wait(10), "no CONNACK from the broker"
    finally:
        client.disconnect()
        client.loop_stop()
    return reasons[0]


# -- the broker really demands what it says -------------------------------------------------


def test_broker_accepts_right_credentials_and_refuses_others(
    secure_broker: MosquittoProcess, pki: Pki
) -> None:
    assert not connack(settings_for(secure_broker, USER, PASSWORD, pki.ca)).is_failure
    assert connack(settings_for(secure_broker, USER, "wrong", pki.ca)).is_failure
    assert connack(settings_for(secure_broker, "nobody", PASSWORD, pki.ca)).is_failure
    anonymous = MqttSettings(
        host="127.0.0.1", port=secure_broker.port, tls=TlsSettings(ca_certs=str(pki.ca))
    )
    assert connack(anonymous).is_failure


def test_probe_finds_mqtt5_through_tls_and_credentials(
    secure_broker: MosquittoProcess, pki: Pki
) -> None:
    assert resolve_protocol(settings_for(secure_broker, USER, PASSWORD, pki.ca)) == "5"


# -- the agent over TLS + credentials -------------------------------------------------------


def test_cloud_answers_over_tls_with_credentials(
    linear_onnx: Path, secure_broker: MosquittoProcess, pki: Pki
) -> None:
    hub = settings_for(secure_broker, HUB_USER, HUB_PASSWORD, pki.ca)
    edge = settings_for(secure_broker, USER, PASSWORD, pki.ca)
    with (
        Responder(hub, cloud_answer) as responder,
        make_agent(linear_onnx, edge, "dev-tls") as agent,
    ):
        assert agent.uplink is not None and agent.uplink.connected
        assert agent.uplink.protocol == "5"
        x = sample(3)
        results = [agent.infer(x, deadline_ms=5000) for _ in range(3)]
    for result in results:
        assert result.source is Source.CLOUD, result.reason
        np.testing.assert_allclose(result.output, x @ W_CLOUD + B_CLOUD, rtol=1e-5)
    assert len(responder.requests) == 3
    assert {r.device_id for r in responder.requests} == {"dev-tls"}


def test_wrong_password_answers_locally_as_fallback(
    linear_onnx: Path, secure_broker: MosquittoProcess, pki: Pki
) -> None:
    hub = settings_for(secure_broker, HUB_USER, HUB_PASSWORD, pki.ca)
    edge = settings_for(secure_broker, USER, "not-the-password", pki.ca)
    with (
        Responder(hub, cloud_answer) as responder,  # a hub is there: only the refusal stops us
        make_agent(linear_onnx, edge, "dev-badpass") as agent,
    ):
        assert agent.uplink is not None and not agent.uplink.connected
        x = sample(2)
        results = [agent.infer(x, deadline_ms=2000) for _ in range(3)]
    assert_local_fallback(results, x)
    assert responder.requests == []


def test_untrusted_ca_answers_locally_as_fallback(
    linear_onnx: Path, secure_broker: MosquittoProcess, pki: Pki
) -> None:
    hub = settings_for(secure_broker, HUB_USER, HUB_PASSWORD, pki.ca)
    edge = settings_for(secure_broker, USER, PASSWORD, pki.rogue_ca)
    with (
        Responder(hub, cloud_answer) as responder,
        make_agent(linear_onnx, edge, "dev-rogue-ca") as agent,
    ):
        assert agent.uplink is not None and not agent.uplink.connected
        x = sample(2)
        results = [agent.infer(x, deadline_ms=2000) for _ in range(3)]
    assert_local_fallback(results, x)
    assert responder.requests == []


def assert_local_fallback(results: list[Any], x: np.ndarray) -> None:
    for result in results:
        assert result.source is Source.EDGE_FALLBACK and result.degraded, result.reason
        assert result.reason.startswith("fallback:"), result.reason
        np.testing.assert_allclose(result.output, x @ W_EDGE + B_EDGE, rtol=1e-5, atol=1e-5)
    assert results[0].reason == "fallback:broker_unavailable"


# -- the password file ----------------------------------------------------------------------


def test_python_password_hash_matches_mosquitto_passwd(tmp_path: Path) -> None:
    need(None if shutil.which("mosquitto_passwd") else "needs mosquitto_passwd")
    line = write_password_file(tmp_path / "passwd", {USER: PASSWORD}).read_text().strip()
    match = re.fullmatch(rf"{re.escape(USER)}:\$7\$(\d+)\$([^$]+)\$([^$]+)", line)
    assert match, line
    salt = base64.b64decode(match[2])
    assert (
        line == f"{USER}:{mosquitto_password_hash(PASSWORD, salt=salt, iterations=int(match[1]))}"
    )


def test_python_written_password_file_works_with_mosquitto(tmp_path: Path, pki: Pki) -> None:
    passwords = write_password_file(
        tmp_path / "passwd", {USER: PASSWORD}, use_mosquitto_passwd=False
    )
    broker = MosquittoProcess(
        tmp_path,
        password_file=passwords,
        tls=BrokerTls(cafile=pki.ca, certfile=pki.server_cert, keyfile=pki.server_key),
    ).start()
    try:
        assert not connack(settings_for(broker, USER, PASSWORD, pki.ca)).is_failure
        assert connack(settings_for(broker, USER, PASSWORD + "x", pki.ca)).is_failure
    finally:
        broker.stop()


# -- paho leaves a failed TLS handshake's socket open; create_client closes it ---------


def test_failed_tls_handshake_leaves_no_open_socket(
    secure_broker: MosquittoProcess, pki: Pki
) -> None:
    settings = settings_for(secure_broker, USER, PASSWORD, pki.rogue_ca)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        assert resolve_protocol(settings) == "3.1.1"  # the probe's handshake fails
        uplink = MqttUplink(settings, device_id="dev-leak").start(wait_s=1.5)  # so do retries
        assert not uplink.connected
        uplink.stop()
        gc.collect()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == []
