"""Huge MQTT messages: the broker refuses them (generated configuration), the hub never takes one.

Two defences, each tested on a real Mosquitto: the broker configuration that
``tandem fleet provision --broker-conf`` writes (``max_packet_size``, Tandem's
frame limit plus the packet's overhead) disconnects a device that sends a
larger packet before the payload is read; and a hub advertises its maximum
packet size in its MQTT 5 CONNECT, so even a broker without that limit never
delivers it a larger message (it drops it). Either way another device's
requests keep being answered.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from cloud_hub import Hub
from shared import Limits, MqttSettings, Topics, mqtt_max_packet_bytes
from tandem.broker import render_broker_limits

from ._brokers import MosquittoProcess
from ._models import write_linear_classifier
from ._mqtt_device import WAIT_S, Device
from ._plane import Requester, linear_repo, running_hub, wait_until

MiB = 1024 * 1024


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


class _Sender:
    """A device that publishes raw bytes and notices when the broker drops it."""

    def __init__(self, url: str) -> None:
        settings = MqttSettings.from_url(url)
        self.gone = threading.Event()
        self.client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"big-{uuid.uuid4().hex[:6]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_disconnect = lambda *_: self.gone.set()
        connected = threading.Event()
        self.client.on_connect = lambda *_: connected.set()
        self.client.connect(settings.host, settings.port)
        self.client.loop_start()
        assert connected.wait(WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_the_generated_broker_limit_matches_the_frame_limit() -> None:
    text = render_broker_limits()
    assert f"max_packet_size {mqtt_max_packet_bytes()}\n" in text
    assert mqtt_max_packet_bytes() - Limits().max_frame_bytes >= 65535  # room for any topic


def test_an_oversize_message_is_refused_by_the_generated_broker_configuration(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """The session's Mosquitto runs with what ``--broker-conf`` writes; the hub as processes."""
    repo = linear_repo(tmp_path / "repo")
    with running_hub(repo, mosquitto.url, http=0) as hub:
        prefix = hub.spec.prefix
        other = Requester(mosquitto.url, prefix=prefix)
        sender = _Sender(mosquitto.url)
        try:
            x = np.ones((1, 16), np.float32)
            first = [other.send(x) for _ in range(5)]
            wait_until(lambda: other.answered(first) == 5, 30.0, "the first replies")
            pids = [c.pid for c in hub.children if c.pid is not None]
            before = _rss_bytes(pids)
            big = b"\x00" * (Limits().max_frame_bytes + MiB)  # one MiB over the frame limit
            topic = Topics(prefix).device_infer("big-device", "linear")
            sender.client.publish(topic, big, qos=1)
            assert sender.gone.wait(60), "the broker took a packet over max_packet_size"
            del big
            then = [other.send(x) for _ in range(5)]
            wait_until(lambda: other.answered(then) == 5, 30.0, "the other device's replies")
            assert other.check_correct() == (10, 0)
            grown = _rss_bytes(pids) - before
            assert grown < 16 * MiB, f"the hub grew by {grown / MiB:.0f} MiB"
        finally:
            sender.close()
            other.close()


@pytest.fixture
def unlimited_mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    broker = MosquittoProcess(tmp_path, size_limit=False).start()
    yield broker
    broker.stop()


@pytest.mark.parametrize("client", ["crt", "paho"])
def test_a_hub_advertises_its_packet_limit_so_no_broker_delivers_more(
    unlimited_mosquitto: MosquittoProcess, tmp_path: Path, client: str
) -> None:
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    topics = Topics(f"t-{uuid.uuid4().hex[:8]}/v1")
    limits = Limits(max_frame_bytes=1 * MiB)
    settings = MqttSettings.from_url(unlimited_mosquitto.url, protocol="5")
    with Hub(
        tmp_path / "repo", mqtt=settings, topics=topics, limits=limits, mqtt_client=client
    ) as hub:
        assert hub.mqtt_front is not None
        device = Device(unlimited_mosquitto.url, topics)
        try:
            # This broker has no limit; the hub's CONNECT said 1 MiB and a bit.
            device.publish(topics.device_infer(device.device_id, "linear"), b"\x00" * (2 * MiB))
            x = np.ones((1, 16), np.float32)
            request_id = device.request("linear", {"x": x})
            assert device.reply(request_id).ok
            assert hub.mqtt_front.stats()["received"] == 1  # the big one never reached it
        finally:
            device.close()


@pytest.mark.parametrize("gateway", [False, True], ids=["broker", "site-gateway"])
def test_provision_writes_the_size_limit_for_the_broker(tmp_path: Path, gateway: bool) -> None:
    from ._cli import tandem

    site = ("--gateway", "plant-a", "--bridge-file", "bridge.conf") if gateway else ()
    cloud = ("--cloud-broker", "mqtt://cloud.example:1883", "--cloud-dynsec-file", "cloud.json")
    result = tandem(
        "fleet", "provision", "cam-01", "--dynsec-file", "d.json", "--password-out", "pw",
        "--broker-conf", "tandem-limits.conf", *site, *(cloud if gateway else ()),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "tandem-limits.conf").read_text() == render_broker_limits()
    if gateway:  # the site broker's bridge file carries the same limit
        line = f"max_packet_size {mqtt_max_packet_bytes()}\n"
        assert line in (tmp_path / "bridge.conf").read_text()
