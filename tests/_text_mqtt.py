"""What the text-over-MQTT tests share: the served hub and device, peers, gates, frames.

The tiny language-model pair is built once per module (``tests/_language.py``,
seconds); the hub serves its hub model from a repository directory, a device
agent runs its device model. Greedy answers are compared with
``greedy_generate`` on the same models, never with stored strings. Extra
MQTT clients (paho, as any device or attacker would) spy on, duplicate,
reorder or forge messages on the device's topics. Waits are on conditions.
"""

from __future__ import annotations

import json
import queue
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from cloud_hub import Coalescing, Hub
from cloud_hub.language import LanguageEngine, TurnUpdate
from edge_agent import (
    EdgeAgent,
)
from shared import (
    GenerateRequest,
    MqttSettings,
    decode_text_message,
    encode_text_message,
)
from tandem.demo.language import build_language_models, load_model

from ._brokers import MosquittoProcess
from ._language import tiny_recipe

WAIT_S = 30.0
TINY = tiny_recipe(context=128)
PROMPT = 'The "assert" statement'
P = "tandem/v1"
# Chunks flush by size here (8 tokens), never by time within a test: counts do not depend
# on how fast this machine decodes.
SIZED = Coalescing(max_delay_s=30.0, max_tokens=8, max_bytes=4096)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.005)


class GatedEngine(LanguageEngine):
    """The real engine, whose thread waits on ``gate`` after a gated turn's first update
    (the hub goes silent mid-stream while the turn is certainly in the engine)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gated_max_tokens = -1
        self.held = threading.Event()

    def _deliver(self, turn: Any, update: TurnUpdate) -> None:
        super()._deliver(turn, update)
        if turn.max_tokens == self.gated_max_tokens and update.finish is None:
            self.held.set()
            assert self.gate.wait(WAIT_S)


@dataclass
class Peer:
    """A plain paho client (MQTT 5) that records what it receives."""

    client: mqtt.Client
    received: queue.Queue[tuple[str, bytes]] = field(default_factory=queue.Queue)
    on_message: Callable[[str, bytes], None] | None = None

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *a: done.set()
        self.client.subscribe(topic, qos=1)
        assert done.wait(WAIT_S), f"no SUBACK for {topic}"

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(WAIT_S)

    def take(self) -> tuple[str, Any]:
        topic, payload = self.received.get(timeout=WAIT_S)
        return topic, decode_text_message(payload)


@pytest.fixture
def peer(mosquitto: MosquittoProcess) -> Iterator[Callable[[str], Peer]]:
    peers: list[Peer] = []

    def make(client_id: str) -> Peer:
        client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
        )
        p = Peer(client)

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            if p.on_message is not None:
                p.on_message(msg.topic, msg.payload)
            p.received.put((msg.topic, msg.payload))

        client.on_message = on_message
        connected = threading.Event()
        client.on_connect = lambda *a: connected.set()
        client.connect("127.0.0.1", mosquitto.port)
        client.loop_start()
        assert connected.wait(WAIT_S)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.client.disconnect()
        p.client.loop_stop()


@dataclass
class Served:
    hub: Hub
    url: str
    hub_model: Path
    device_model: Path
    gated: GatedEngine

    def agent(self, device: str, cloud: str = "tiny", **kw: Any) -> EdgeAgent:
        return EdgeAgent(
            None, device_id=device, broker=self.url, language_model=self.device_model,
            cloud_language_model=cloud, **kw,
        )  # fmt: skip


def hub_repository(root: Path, hub_model: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(hub_model, repo / "tiny" / "1")
    (repo / "tiny" / "config.json").write_text(
        json.dumps({"platform": "onnxruntime_genai", "generation": {"max_output_tokens": 60}})
    )
    return repo


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_language_models(tmp_path_factory.mktemp("lm-cache"), recipe=TINY)


@pytest.fixture(scope="module")
def served(
    models: Any, mosquitto: MosquittoProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    repo = hub_repository(tmp_path_factory.mktemp("hub"), models.hub_model)
    settings = MqttSettings.from_url(mosquitto.url)
    with Hub(repo, mqtt=settings, coalescing=SIZED, mqtt_client="paho") as hub:
        gated = GatedEngine(models.hub_model)
        hub.language.add_engine("gated", gated)
        yield Served(hub, mosquitto.url, models.hub_model, models.device_model, gated)
        gated.gate.set()


@pytest.fixture(scope="module")
def reference(served: Served) -> Any:
    return load_model(served.hub_model)


def front_stats(served: Served) -> dict[str, int]:
    assert served.hub.text_front is not None
    return served.hub.text_front.stats()


def bad_frame(device: str, **header: Any) -> bytes:
    """A well-formed request of ``device`` (fields as given), to see what the hub answers."""
    request = GenerateRequest(
        request_id=header.pop("id", "bad-1"), model=header.pop("model", "tiny"),
        max_tokens=header.pop("max_tokens", 4), prompt="hi", **header,
    )  # fmt: skip
    return encode_text_message(request)


def raw_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<4sBBHI", b"TNDM", 1, 0, 0, len(raw)) + raw + payload
