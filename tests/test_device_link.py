"""A device's one MQTT connection (``edge_agent.DeviceLink``), on real Mosquittos.

The agent, its updater and its telemetry reporter share one session whose
client id is the device id. On a broker provisioned by ``tandem fleet
provision`` with Mosquitto's dynamic-security plugin (client ids bound to
credentials, first-layout request topics off), that device installs an
assigned model, reports it, answers from the hub over its own request topic
and sends telemetry, all over one connection, and a second connection with
its credentials under another id is refused. Losing the broker fails pending
requests at once (the agent falls back), and the link comes back subscribed.

Connections are counted in the broker's own log: Mosquitto writes a line
for every client that connects and every one that goes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cloud_hub import Hub
from edge_agent import (
    CircuitBreaker,
    EdgeAgent,
    InferenceResult,
    ModelUpdater,
    OffloadPolicy,
    Source,
    TelemetryReporter,
)
from model_cdn.fleet import FleetEvent, FleetLink
from shared import (
    DeviceReport,
    Message,
    MqttSettings,
    PahoSession,
    Topics,
    UpdateState,
    UpdateStatus,
    device_client_id,
)
from tandem.broker import provision_dynsec

from ._brokers import MosquittoProcess, dynsec_plugin
from ._models import linear_classifier_weights, write_linear_classifier
from ._needs import need
from ._responder import Responder
from ._test_cdn import LoopbackCdn
from ._update_kit import MODEL, SAMPLE, Rig, wait_until

DEVICE = "cam-1"
WAIT_S = 30.0
W_CLOUD, B_CLOUD = linear_classifier_weights(seed=11)
_CONNECTED = re.compile(r"New client connected from \S+ as (\S+) ")
_GONE = re.compile(r"Client (\S+) (?:disconnected|closed its connection)")


def live_connections(broker: MosquittoProcess, client_id: str) -> tuple[int, int]:
    """(connections made, connections open now) under ``client_id``, per the broker's log."""
    made = gone = 0
    for line in broker.log_path.read_text().splitlines():
        if (m := _CONNECTED.search(line)) and m.group(1) == client_id:
            made += 1
        elif (m := _GONE.search(line)) and m.group(1) == client_id:
            gone += 1
    return made, made - gone


@dataclass
class BoundBroker:
    broker: MosquittoProcess
    passwords: dict[str, str]

    def settings(self, user: str) -> MqttSettings:
        return MqttSettings(port=self.broker.port, username=user, password=self.passwords[user])


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[BoundBroker]:
    """A Mosquitto run from ``tandem fleet provision``'s dynamic-security file: client ids
    bound to credentials, and only the per-device request topics."""
    if dynsec_plugin() is None:
        need("Mosquitto's dynamic-security plugin is not installed")
    state = tmp_path / "dynsec.json"
    done = provision_dynsec(["hub", "cdn", DEVICE], dynsec_file=state, legacy_topics=False)
    broker = MosquittoProcess(tmp_path, dynsec_file=state).start()
    try:
        yield BoundBroker(broker, dict(done.passwords))
    finally:
        broker.stop()


def hub_repo(root: Path) -> Path:
    write_linear_classifier(root / "linear" / "1" / "model.onnx", seed=11)
    (root / "linear" / "config.json").write_text(json.dumps({"max_queue_delay_ms": 1.0}))
    return root


class Fleet:
    """The CDN's side: its fleet link hears status and telemetry, and assigns."""

    def __init__(self, settings: MqttSettings) -> None:
        self.events: list[FleetEvent] = []
        self._lock = threading.Lock()
        self.link = FleetLink(settings, Topics(), self._on_event, client_id="tandem-cdn-test")

    def _on_event(self, event: FleetEvent) -> None:
        with self._lock:
            self.events.append(event)

    def statuses(self) -> list[UpdateStatus]:
        with self._lock:
            return [e for e in self.events if isinstance(e, UpdateStatus)]

    def reports(self) -> list[DeviceReport]:
        with self._lock:
            return [e for e in self.events if isinstance(e, DeviceReport)]


def test_agent_updater_and_telemetry_share_one_connection_bound_to_the_device_id(
    tmp_path: Path, bound: BoundBroker
) -> None:
    cdn = LoopbackCdn()
    rig = Rig.create(cdn, tmp_path / "rig", DEVICE)
    fleet = Fleet(bound.settings("cdn"))
    device = bound.settings(DEVICE)
    try:
        with Hub(hub_repo(tmp_path / "repo"), mqtt=bound.settings("hub")):
            fleet.link.start(wait_s=WAIT_S)
            agent = EdgeAgent(
                ModelUpdater.bootstrap(rig.store_dir, [rig.key.public_key], MODEL),  # lin@1
                device_id=DEVICE,
                broker=device,
                cloud_model="linear",
                policy=OffloadPolicy.always_cloud(),
            )
            updater = rig.updater(agent, mqtt=device)
            assert updater.link is agent.link  # one link, not a second connection
            with agent, updater, TelemetryReporter(agent, interval_s=0.2, qos=1):
                assert agent.link is not None and agent.link.client_id == DEVICE
                # a request on the device's own topic (the broker refuses the first layout)
                answer = agent.infer(SAMPLE, deadline_ms=5000)
                assert answer.source is Source.CLOUD, answer.reason
                np.testing.assert_allclose(answer.output, SAMPLE @ W_CLOUD + B_CLOUD, atol=1e-4)
                # an assignment from the CDN, installed and reported over the same connection
                v2 = rig.publisher.publish(2)
                document = json.loads(rig.publisher.assignment(DEVICE, 2))
                fleet.link.publish_retained(DEVICE, document, wait_s=WAIT_S)
                wait_until(
                    lambda: UpdateState.INSTALLED in {s.state for s in fleet.statuses()},
                    WAIT_S,
                    "the installed report at the CDN",
                )
                assert agent.runtime is not None and agent.runtime.version == "2"
                np.testing.assert_allclose(
                    agent.runtime.run({"x": SAMPLE})["logits"], v2.expected(), atol=1e-4
                )
                wait_until(lambda: len(fleet.reports()) >= 2, WAIT_S, "telemetry at the CDN")
                made, open_now = live_connections(bound.broker, DEVICE)
                assert open_now == 1  # agent, updater and reporter: one connection
                assert agent.link.connects == 1 and agent.link.disconnects == 0
                # anyone with the device's credentials under another id is refused
                other = PahoSession(device, f"tandem-updater-{DEVICE}")
                try:
                    assert other.start(wait_s=WAIT_S) is False
                    failure = other.connect_failure
                    assert failure is not None and failure.refused, failure
                finally:
                    other.stop(timeout_s=1)
                assert live_connections(bound.broker, DEVICE)[1] == 1
                assert agent.link.connected and agent.link.disconnects == 0
            assert updater.stats.installed == 1
        log = bound.broker.log_path.read_text()
        assert "already connected, closing old connection" not in log  # no takeover, ever
        assert made == 2  # the session's one connection, and the protocol probe before it
    finally:
        fleet.link.stop()
        cdn.close()


def test_the_device_id_is_the_client_id_and_an_updater_alone_opens_its_own_link(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    cdn = LoopbackCdn()
    try:
        rig = Rig.create(cdn, tmp_path, "cam-solo")
        alone = rig.updater(rig.agent(), mqtt=MqttSettings.from_url(mosquitto.url))
        assert alone.link is not None and alone.link.client_id == device_client_id("cam-solo")
        with alone:
            assert alone.link.wait_connected(WAIT_S)
        assert not alone.link.connected  # it owned the link, and closed it
        assert rig.updater(rig.agent()).link is None  # no broker: it polls the CDN
    finally:
        cdn.close()


def test_losing_the_broker_fails_pending_requests_at_once_and_the_link_comes_back(
    tmp_path: Path, own_mosquitto: MosquittoProcess
) -> None:
    silent = threading.Event()
    cdn = LoopbackCdn()
    rig = Rig.create(cdn, tmp_path, "cam-lost")
    settings = MqttSettings.from_url(own_mosquitto.url)

    def answer(request: Message) -> Message | None:
        if silent.is_set():
            return None  # the hub holds the request: only the broker's loss can end the wait
        x = request.tensors["x"]
        return request.reply(tensors={"logits": x @ W_CLOUD + B_CLOUD})

    agent = EdgeAgent(
        ModelUpdater.bootstrap(rig.store_dir, [rig.key.public_key], MODEL),
        device_id="cam-lost",
        broker=settings,
        policy=OffloadPolicy.always_cloud(),
        breaker=CircuitBreaker(failure_threshold=100, cooldown_s=0.2),
    )
    updater = rig.updater(agent, mqtt=settings)
    results: list[InferenceResult] = []
    try:
        with Responder(settings, answer) as hub, agent, updater:
            link = agent.link
            assert link is not None and updater.link is link
            assert agent.infer(SAMPLE, deadline_ms=5000).source is Source.CLOUD
            silent.set()
            call = threading.Thread(
                target=lambda: results.append(agent.infer(SAMPLE, deadline_ms=600_000))
            )
            call.start()
            wait_until(lambda: len(hub.requests) == 2, WAIT_S, "the request at the hub")
            own_mosquitto.stop()
            call.join(WAIT_S)  # long before its deadline of ten minutes
            assert not call.is_alive()
            (result,) = results
            assert result.source is Source.EDGE_FALLBACK
            assert result.reason == "fallback:broker_unavailable"  # failed at once, not timed out
            silent.clear()
            own_mosquitto.start()
            assert link.wait_connected(WAIT_S) and link.session.subscribed.wait(WAIT_S)
            assert (link.connects, link.disconnects) == (2, 1)
            assert set(link.session.filters) == {
                Topics().reply("cam-lost"),
                Topics().assign("cam-lost"),
            }  # both owners' topics, subscribed again without being asked
            wait_until(
                lambda: agent.infer(SAMPLE, deadline_ms=2000).source is Source.CLOUD,
                WAIT_S,
                "a cloud answer on the re-subscribed reply topic",
            )
    finally:
        cdn.close()
