"""Site gateways on real brokers: a cloud Mosquitto (the dynamic-security plugin) and a
site Mosquitto bridged to it, started from the files ``tandem fleet provision --gateway``
writes, a hub, edge agents at the site and the CDN's fleet link.

The uplink cut runs the site broker in a network namespace of its own
(``_site_net``), takes its end of the uplink down, and restarts the site broker
in the outage.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest

from edge_agent import CircuitBreaker, EdgeAgent, OffloadPolicy, Source, TelemetryReporter
from edge_agent.runtimes import load_runtime
from model_cdn.fleet import FleetEvent, FleetLink, FleetView
from model_cdn.registry import open_registry
from shared import DeviceReport, MqttSettings
from tandem.broker import (
    BridgeOptions,
    BrokerFiles,
    provision_dynsec,
    provision_gateway,
    provision_users,
)

from ._brokers import MosquittoProcess, dynsec_plugin, free_port
from ._cli import tandem
from ._hubs import HubProcess
from ._models import linear_classifier_weights, write_linear_classifier
from ._needs import need
from ._site_net import GatewayBroker, SiteNetwork
from .test_site_gateway_files import SITE, TOPICS, option, provision

W_EDGE, B_EDGE = linear_classifier_weights(seed=0)
W_CLOUD, B_CLOUD = linear_classifier_weights(seed=1)


# -- real brokers ------------------------------------------------------------------------


def needs_plugin() -> Path:
    plugin = dynsec_plugin()
    if plugin is None:
        need("needs Mosquitto's dynamic-security plugin")
    return plugin


def cloud_broker(tmp_path: Path, port: int, dynsec: Path, *listen: str) -> MosquittoProcess:
    extra = "".join(f"listener {port} {address}\n" for address in listen)
    return MosquittoProcess(tmp_path, port=port, dynsec_file=dynsec, extra_config=extra)


def connect(url: str, user: str, password: str, client_id: str) -> mqtt.Client:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
    )
    client.username_pw_set(user, password)
    settings = MqttSettings.from_url(url)
    client.connect(settings.host, settings.port)
    client.loop_start()
    return client


def wait_for(condition: Any, within_s: float, what: str) -> None:
    end = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {within_s} s: {what}")
        time.sleep(0.05)


class Inbox:
    """Messages a paho client received, by topic."""

    def __init__(self, client: mqtt.Client) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self._lock = threading.Lock()
        client.on_message = self._on_message

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(message)

    def on(self, topic: str) -> list[mqtt.MQTTMessage]:
        with self._lock:
            return [m for m in self.messages if m.topic == topic]


@pytest.mark.parametrize("files", ["dynsec", "acl_file"])
def test_stolen_gateway_credentials_speak_only_for_that_sites_devices(
    tmp_path: Path, files: str
) -> None:
    port = free_port()
    gateway = f"tandem-gateway-{SITE}"
    site = BrokerFiles(dynsec_file=tmp_path / "site.json")
    if files == "dynsec":
        needs_plugin()
        cloud = BrokerFiles(dynsec_file=tmp_path / "cloud.json")
        assert cloud.dynsec_file is not None
        services = provision_dynsec(["hub", "cdn", "cam-09"], dynsec_file=cloud.dynsec_file)
    else:
        cloud = BrokerFiles(passwd_file=tmp_path / "cloud.passwd", acl_file=tmp_path / "cloud.acl")
        assert cloud.passwd_file is not None and cloud.acl_file is not None
        services = provision_users(
            ["hub", "cdn", "cam-09"], passwd_file=cloud.passwd_file, acl_file=cloud.acl_file
        )
    provision_gateway(  # cam-09 talks to the cloud directly; cam-01 is the site's
        SITE,
        ["cam-01"],
        cloud_url=f"mqtt://127.0.0.1:{port}",
        bridge_file=tmp_path / "bridge.conf",
        site_files=site,
        cloud_files=cloud,
    )
    stolen = option((tmp_path / "bridge.conf").read_text(), "remote_password")
    pw = services.passwords
    with ExitStack() as stack:
        if cloud.dynsec_file is not None:
            broker = cloud_broker(tmp_path, port, cloud.dynsec_file)
        else:
            broker = MosquittoProcess(
                tmp_path,
                port=port,
                password_file=cloud.passwd_file,
                extra_config=f"acl_file {cloud.acl_file}\n",
            )
        stack.callback(broker.start().stop)
        cdn = connect(broker.url, "cdn", pw["cdn"], "tandem-cdn-test")
        hub = connect(broker.url, "hub", pw["hub"], "tandem-hub-test")
        thief = connect(broker.url, gateway, stolen, gateway)
        for client in (cdn, hub, thief):
            stack.callback(client.loop_stop)
        heard, thief_heard = Inbox(cdn), Inbox(thief)
        subscribed, cdn_subscribed = threading.Event(), threading.Event()
        thief.on_subscribe = lambda *_a: subscribed.set()
        cdn.on_subscribe = lambda *_a: cdn_subscribed.set()
        cdn.subscribe(f"{TOPICS.prefix}/dev/+/telemetry", 1)
        thief.subscribe([(TOPICS.reply("cam-09"), 1), (TOPICS.reply("cam-01"), 1)])
        # Both SUBACKs in before anything is published: a report sent before the CDN's
        # subscription is in place is never delivered (the test failed so under load).
        assert subscribed.wait(10) and cdn_subscribed.wait(10)
        # One connection delivers in order: had the first of each pair gone through, it
        # would have arrived before the second.
        thief.publish(TOPICS.telemetry("cam-09"), b"forged", qos=1).wait_for_publish(5)
        thief.publish(TOPICS.telemetry("cam-01"), b"own", qos=1).wait_for_publish(5)
        hub.publish(TOPICS.reply("cam-09"), b"for cam-09", qos=1).wait_for_publish(5)
        hub.publish(TOPICS.reply("cam-01"), b"for cam-01", qos=1).wait_for_publish(5)
        wait_for(lambda: heard.on(TOPICS.telemetry("cam-01")), 10, "the site's own report")
        wait_for(lambda: thief_heard.on(TOPICS.reply("cam-01")), 10, "the site's own reply")
        assert heard.on(TOPICS.telemetry("cam-09")) == []  # refused: not its site's device
        assert thief_heard.on(TOPICS.reply("cam-09")) == []


def write_repo(root: Path) -> Path:
    write_linear_classifier(root / "linear" / "1" / "model.onnx", seed=1)
    (root / "linear" / "config.json").write_text(json.dumps({"max_queue_delay_ms": 2.0}))
    return root


def site_agent(model: Path, gateway: GatewayBroker, device: str, password: str) -> EdgeAgent:
    settings = MqttSettings(
        host=gateway.address, port=gateway.port, username=device, password=password
    )
    return EdgeAgent(
        load_runtime(model, name="linear", version="e1"),
        device_id=device,
        broker=settings,
        policy=OffloadPolicy.always_cloud(),
        breaker=CircuitBreaker(failure_threshold=2, cooldown_s=0.2, max_cooldown_s=0.5),
    )


def until_cloud_answers(agent: EdgeAgent, x: np.ndarray, within_s: float) -> None:
    """Call until the cloud answers (the bridge and the hub come up by themselves)."""
    end = time.monotonic() + within_s
    while agent.infer(x, deadline_ms=1000).source is not Source.CLOUD:
        assert time.monotonic() < end, f"{agent.device_id}: no cloud answer in {within_s} s"
        time.sleep(0.1)


class Fleet:
    """The CDN's side: a fleet link on the cloud broker, keeping every report it hears."""

    def __init__(self, url: str) -> None:
        self.reports: list[tuple[float, DeviceReport]] = []  # (arrival, report), in order
        self._lock = threading.Lock()
        self.link = FleetLink(MqttSettings.from_url(url), TOPICS, self._on_event)

    def _on_event(self, event: FleetEvent) -> None:
        if isinstance(event, DeviceReport):
            with self._lock:
                self.reports.append((time.time(), event))

    def heard(self) -> list[tuple[float, DeviceReport]]:
        with self._lock:
            return list(self.reports)

    def keys(self) -> Counter[tuple[str, float]]:
        return Counter((r.device, r.at) for _, r in self.heard())


def sent(reporter: TelemetryReporter) -> tuple[str, float]:
    """Publish one report now (QoS 1, to the site broker); its (device, at)."""
    metrics = reporter.report()
    assert metrics is not None, "the site broker took no report"
    report = DeviceReport.from_json(metrics.to_json())
    return report.device, report.at


def retained_assignment(gateway: GatewayBroker, device: str, password: str) -> list[Any]:
    """Connect as ``device`` to the site broker and take what its assignment topic holds."""
    client = connect(gateway.url, device, password, device)
    try:
        inbox = Inbox(client)
        client.subscribe(TOPICS.assign(device), 1)
        wait_for(lambda: inbox.on(TOPICS.assign(device)), 10, f"{device}'s assignment")
        return [(m.payload, m.retain) for m in inbox.on(TOPICS.assign(device))]
    finally:
        client.disconnect()
        client.loop_stop()


def test_cli_provisioned_site_carries_requests_replies_reports_and_keeps_assignments(
    tmp_path: Path, linear_onnx: Path
) -> None:
    from cloud_hub import Hub

    plugin = needs_plugin()
    cloud_port, site_port = free_port(), free_port()
    assert tandem(
        "fleet", "provision", "hub", "cdn", "--dynsec-file", "cloud.json",
        "--password-out", "services.txt", cwd=tmp_path,
    ).returncode == 0  # fmt: skip
    result = tandem(
        "fleet", "provision", "cam-01", "cam-02", "--gateway", SITE,
        "--dynsec-file", "site.json", "--bridge-file", "bridge.conf",
        "--cloud-broker", f"mqtt://127.0.0.1:{cloud_port}", "--cloud-dynsec-file", "cloud.json",
        "--password-out", "devices.txt", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    pw = dict(
        line.split(" ")
        for name in ("services.txt", "devices.txt")
        for line in (tmp_path / name).read_text().splitlines()
    )
    x = np.random.default_rng(3).normal(size=(1, 16)).astype(np.float32)
    with ExitStack() as stack:
        cloud = cloud_broker(tmp_path, cloud_port, tmp_path / "cloud.json").start()
        stack.callback(cloud.stop)
        hub_url = f"mqtt://hub:{pw['hub']}@127.0.0.1:{cloud_port}"
        hub = stack.enter_context(
            Hub(write_repo(tmp_path / "repo"), mqtt=MqttSettings.from_url(hub_url))
        )
        del hub
        fleet = Fleet(f"mqtt://cdn:{pw['cdn']}@127.0.0.1:{cloud_port}")
        fleet.link.start()
        stack.callback(fleet.link.stop)
        gateway = GatewayBroker(
            tmp_path, address="127.0.0.1", port=site_port, plugin=plugin,
            dynsec_file=tmp_path / "site.json", bridge_file=tmp_path / "bridge.conf",
        ).start()  # fmt: skip
        stack.callback(gateway.stop)
        agent = stack.enter_context(site_agent(linear_onnx, gateway, "cam-01", pw["cam-01"]))

        until_cloud_answers(agent, x, within_s=30)
        answer = agent.infer(x, deadline_ms=2000)
        assert answer.source is Source.CLOUD  # the hub's model, across the bridge both ways
        np.testing.assert_allclose(answer.output, x @ W_CLOUD + B_CLOUD, rtol=1e-4, atol=1e-4)

        key = sent(TelemetryReporter(agent, qos=1))
        wait_for(lambda: fleet.keys()[key] == 1, 10, "the report at the fleet link")

        document = {"model": "linear", "version": 7}
        fleet.link.publish_retained("cam-02", document, wait_s=5)
        first = retained_assignment(gateway, "cam-02", pw["cam-02"])  # live or retained
        again = retained_assignment(gateway, "cam-02", pw["cam-02"])  # a new session
        assert [json.loads(payload) for payload, _ in first] == [document]
        assert [(json.loads(p), retain) for p, retain in again] == [(document, True)]


@dataclass
class Cut:
    """What the devices did while the uplink was down."""

    answers: list[Any]  # InferenceResult of every call
    reports: list[tuple[str, float]]  # (device, at) of every report the site broker took
    after_both_ends_let_go: int  # reports sent once no TCP connection was left on the uplink


def ride_out_the_cut(
    net: SiteNetwork,
    cloud_port: int,
    agents: dict[str, EdgeAgent],
    reporters: dict[str, TelemetryReporter],
    x: np.ndarray,
) -> Cut:
    """Cut the uplink; keep the devices answering and reporting until neither end holds a
    connection on it any more (both keepalives ran out), then a few rounds more."""
    cut = Cut([], [], 0)
    net.cut()
    end = time.monotonic() + 60
    rounds_after = 0
    while rounds_after < 3:
        assert time.monotonic() < end, "the uplink's connection outlived both keepalives"
        if rounds_after or net.uplink_connections(cloud_port) == 0:
            rounds_after += 1
        for device, agent in agents.items():
            cut.answers.append(agent.infer(x, deadline_ms=200))
            cut.reports.append(sent(reporters[device]))
            cut.after_both_ends_let_go += bool(rounds_after)
        time.sleep(0.2)
    return cut


@pytest.mark.slow
def test_uplink_cut_devices_answer_locally_and_queued_reports_reach_the_fleet_once(
    tmp_path: Path, linear_onnx: Path
) -> None:
    plugin = needs_plugin()
    reason = SiteNetwork.unavailable()
    need(reason)  # make test runs as root with ip(8): under CI a machine without them fails
    net = SiteNetwork()
    x = np.random.default_rng(7).normal(size=(1, 16)).astype(np.float32)
    devices = ["cam-01", "cam-02"]
    with ExitStack() as stack:
        stack.callback(net.close)
        try:
            net.create()
        except subprocess.CalledProcessError as e:  # root without CAP_NET_ADMIN, say
            need(f"network namespaces are not usable here: {e.stderr!r:.200}")
        cloud_port, site_port = free_port(), free_port()
        fast_uplink = BridgeOptions(keepalive_s=2, restart_base_s=1, restart_cap_s=2)
        p = provision(
            tmp_path, f"mqtt://{net.cloud_address}:{cloud_port}", [*devices, "cam-03"], fast_uplink
        )
        cloud = cloud_broker(tmp_path, cloud_port, p.cloud, net.cloud_address).start()
        stack.callback(cloud.stop)
        hub = HubProcess(
            write_repo(tmp_path / "repo"),
            f"mqtt://hub:{p.passwords['hub']}@127.0.0.1:{cloud_port}",
            tmp_path / "hub.log",
            "--workers", "1",
        ).start()  # fmt: skip
        stack.callback(hub.stop)
        fleet = Fleet(f"mqtt://cdn:{p.passwords['cdn']}@127.0.0.1:{cloud_port}")
        fleet.link.start()
        stack.callback(fleet.link.stop)
        gateway = GatewayBroker(
            tmp_path, address=net.gateway_address, port=site_port, plugin=plugin,
            dynsec_file=p.site, bridge_file=p.bridge, net=net,
        ).start()  # fmt: skip
        stack.callback(gateway.stop)
        agents = {
            d: stack.enter_context(site_agent(linear_onnx, gateway, d, p.passwords[d]))
            for d in devices
        }
        reporters = {d: TelemetryReporter(a, qos=1) for d, a in agents.items()}

        # Uplink up: the hub answers across the bridge; reports and an assignment cross it.
        for agent in agents.values():
            until_cloud_answers(agent, x, within_s=60)
        before = [sent(reporters[d]) for d in devices for _ in range(2)]
        wait_for(lambda: all(fleet.keys()[k] for k in before), 10, "reports before the cut")
        document = {"model": "linear", "version": 2}
        fleet.link.publish_retained("cam-03", document, wait_s=5)
        retained_assignment(gateway, "cam-03", p.passwords["cam-03"])  # it reached the site

        heard_before_cut = len(fleet.heard())
        assert net.uplink_connections(cloud_port) == 2  # one connection, seen from both ends
        cut = ride_out_the_cut(net, cloud_port, agents, reporters, x)
        gateway.stop()  # and a power cut at the site, the uplink still down: the queue is on disk
        gateway.start()
        for device, agent in agents.items():
            assert agent.uplink is not None and agent.uplink.wait_connected(30)
            cut.answers.append(agent.infer(x, deadline_ms=200))
            cut.reports.append(sent(reporters[device]))
        in_the_cut = retained_assignment(gateway, "cam-03", p.passwords["cam-03"])
        restored_at = time.time()
        assert len(fleet.heard()) == heard_before_cut  # nothing crossed a cut uplink
        net.restore()

        wait_for(
            lambda: all(fleet.keys()[k] for k in cut.reports), 30, "the queued reports, restored"
        )
        for agent in agents.values():  # and offloading again, without any call from the app
            until_cloud_answers(agent, x, within_s=30)
        heard = fleet.heard()

    # Devices kept answering, locally, with their own model's answer.
    assert len(cut.answers) == len(cut.reports) and cut.after_both_ends_let_go >= 2 * len(devices)
    assert {a.source for a in cut.answers} == {Source.EDGE_FALLBACK}
    for answer in cut.answers:
        np.testing.assert_allclose(answer.output, x @ W_EDGE + B_EDGE, rtol=1e-5)
    # The site kept the assignment retained while the cloud was out of reach.
    assert [(json.loads(payload), retain) for payload, retain in in_the_cut] == [(document, True)]
    # Every report arrived once; those of the cut after the restore, in each device's order.
    counts = Counter((r.device, r.at) for _, r in heard)
    assert set(counts) == set(before) | set(cut.reports)
    assert set(counts.values()) == {1}
    arrivals = {(r.device, r.at): t for t, r in heard}
    assert all(arrivals[k] >= restored_at for k in cut.reports)
    for device in devices:
        order = [r.at for _, r in heard if r.device == device]
        assert order == sorted(order)
    # The fleet registry holds each device once, at its last report.
    view = FleetView()
    registry = open_registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        for arrived, report in heard:
            view.observe_report(report, arrived)
        registry.upsert_devices(view.take_dirty())
        rows = registry.list_devices()
    finally:
        registry.close()
    assert [row.device for row in rows] == devices
    for row in rows:
        last = max(at for d, at in counts if d == row.device)
        assert row.telemetry is not None and row.telemetry["at"] == last
