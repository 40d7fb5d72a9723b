"""The one assignment sender on a real Mosquitto: the admin API's PUT and the rollout
controller both publish through it, retained at QoS 1, over the CDN's one fleet link.

The broker is a real one (tests/_brokers.py); devices are played by plain
subscribers that take the retained message, as a device that connects late would.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model_cdn import (
    AssignmentNotPublishedError,
    AssignmentSender,
    BrokerError,
    FleetService,
    LocalBlobStore,
    create_app,
    open_registry,
)
from model_cdn.fleet import FleetLink
from model_cdn.registry import DeviceRecord, Registry
from shared import MqttSettings, SigningKey, Topics, verify_assignment

from ._brokers import MosquittoProcess, free_port
from ._cdn import make_assignment_doc, make_manifest_doc, receive_retained, serve_in_thread

KEY = SigningKey(bytes(range(32)))
ADMIN = {"Authorization": "Bearer admin-secret"}
DEVICES = ("cam-1", "cam-2", "cam-3")


def wait_until(predicate: object, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    registry = open_registry(tmp_path / "registry.db")
    for version in (1, 2):
        registry.add_version(make_manifest_doc(KEY, "mnist", version))
    now = time.time()
    registry.upsert_devices(
        DeviceRecord(
            device=device,
            labels={"site": "a"},
            capabilities={},
            models={"mnist": 1},
            first_seen=now,
            last_seen=now,
            telemetry=None,
        )
        for device in DEVICES
    )
    try:
        yield registry
    finally:
        registry.close()


def topics() -> Topics:
    return Topics(f"pub-{uuid.uuid4().hex[:8]}/v1")


def test_the_put_route_and_the_controller_publish_through_one_link(
    tmp_path: Path, registry: Registry, mosquitto: MosquittoProcess
) -> None:
    where = topics()
    service = FleetService(registry, KEY, MqttSettings.from_url(mosquitto.url), where, tick_s=0.05)
    app = create_app(
        registry=registry,
        store=LocalBlobStore(tmp_path / "blobs"),
        admin_token="admin-secret",
        controller=service.controller,
    )
    with service, serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN) as http:
        doc = make_assignment_doc(KEY, "cam-9", "mnist", 1)
        put = http.put("/v1/devices/cam-9/assignments/mnist", json=doc)
        assert put.status_code == 200, put.text
        assert put.json()["published"] is True
        assert service.link.stats.published == 1
        assert service.link.stats.acked >= 1  # the PUT waited for the broker's PUBACK
        started = http.post("/v1/rollouts", json={"model": "mnist", "version": 2, "waves": "100%"})
        assert started.status_code == 201, started.text
        rollout = started.json()["id"]
        # one link carried the PUT's assignment and every one of the rollout's
        assert service.link.stats.published == 1 + len(DEVICES)
        assert wait_until(lambda: service.link.stats.unacked == 0)
    assert json.loads(receive_retained(mosquitto.url, where.assign("cam-9")).payload) == doc
    for device in DEVICES:
        message = receive_retained(mosquitto.url, where.assign(device))
        assert message.retain
        got = verify_assignment(message.payload, [KEY.public_key])
        assert (got.device, got.version, got.rollout) == (device, 2, rollout)
        assert registry.get_assignment(device, "mnist") == json.loads(message.payload)


def test_without_a_controller_the_put_route_opens_its_own_link_lazily(
    tmp_path: Path, registry: Registry, mosquitto: MosquittoProcess
) -> None:
    where = topics()
    app = create_app(
        registry=registry,
        store=LocalBlobStore(tmp_path / "blobs"),
        admin_token="admin-secret",
        mqtt=MqttSettings.from_url(mosquitto.url),
        topics=where,
    )
    sender = app.state.sender
    assert isinstance(sender, AssignmentSender)
    link = sender.link
    assert isinstance(link, FleetLink)
    try:
        with (
            serve_in_thread(app, lifespan="on") as url,
            httpx.Client(base_url=url, headers=ADMIN) as http,
        ):
            assert not link.started  # connects at the first assignment, not before
            for device in ("cam-1", "cam-2"):
                doc = make_assignment_doc(KEY, device, "mnist", 2)
                put = http.put(f"/v1/devices/{device}/assignments/mnist", json=doc)
                assert put.json()["published"] is True
                message = receive_retained(mosquitto.url, where.assign(device))
                assert json.loads(message.payload) == doc
            assert link.stats.published == 2  # both over the one link
        assert not link.started  # the app's shutdown closed it
    finally:
        sender.close()


def test_the_controller_queues_while_the_broker_is_away_and_it_goes_out_later(
    registry: Registry, own_mosquitto: MosquittoProcess
) -> None:
    where = topics()
    doc = make_assignment_doc(KEY, "cam-1", "mnist", 2)
    with AssignmentSender.connect(MqttSettings.from_url(own_mosquitto.url), where) as sender:
        own_mosquitto.stop()
        # the controller's way: never waits, never raises for a broker that is away
        assert sender.deliver(registry, "cam-1", "mnist", doc, wait=False) is True
        assert registry.get_assignment("cam-1", "mnist") == doc
        # the admin API's way: waits, and says the assignment is stored but not published
        other = make_assignment_doc(KEY, "cam-2", "mnist", 2)
        with pytest.raises(AssignmentNotPublishedError, match="stored, but not published"):
            sender.deliver(registry, "cam-2", "mnist", other, wait=True)
        assert registry.get_assignment("cam-2", "mnist") == other
        own_mosquitto.start()
        message = receive_retained(own_mosquitto.url, where.assign("cam-1"))
    assert json.loads(message.payload) == doc


def test_an_unreachable_broker_is_one_clear_error_and_the_assignment_is_kept(
    registry: Registry,
) -> None:
    dead = MqttSettings.from_url(f"mqtt://127.0.0.1:{free_port()}", connect_timeout_s=2.0)
    with pytest.raises(BrokerError, match=r"cannot reach the MQTT broker at mqtt://127\.0\.0\.1:"):
        AssignmentSender.connect(dead, Topics())
    doc = make_assignment_doc(KEY, "cam-1", "mnist", 1)
    with AssignmentSender.connect(dead, Topics(), lazy=True) as lazy:
        for _attempt in range(2):  # a failed connect is retried at the next publish
            with pytest.raises(AssignmentNotPublishedError, match="cannot reach"):
                lazy.deliver(registry, "cam-1", "mnist", doc)
    assert registry.get_assignment("cam-1", "mnist") == doc


def test_a_publish_the_broker_refuses_is_an_error_not_a_silent_success(
    tmp_path: Path, registry: Registry
) -> None:
    """Mosquitto with an ACL that lets anonymous clients read only: MQTT 5 tells the
    sender 'not authorized' in the PUBACK, which must not pass for delivered."""
    acl = tmp_path / "acl"
    acl.write_text("topic read #\n")
    # run as root, Mosquitto drops to its own user, which cannot read pytest's 0700 tmp dirs
    as_root = "user root\n" if os.geteuid() == 0 else ""
    broker = MosquittoProcess(tmp_path, extra_config=f"acl_file {acl}\n{as_root}").start()
    try:
        settings = MqttSettings.from_url(broker.url, protocol="5")
        doc = make_assignment_doc(KEY, "cam-1", "mnist", 1)
        with (
            AssignmentSender.connect(settings, topics()) as sender,
            pytest.raises(AssignmentNotPublishedError, match="refused the assignment"),
        ):
            sender.deliver(registry, "cam-1", "mnist", doc)
    finally:
        broker.stop()
