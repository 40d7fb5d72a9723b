"""A fleet takes a new model version end to end, while it serves requests the whole time.

Real parts only: the publish pipeline on the demo's MNIST models, the CDN
server (uvicorn) over a SQLite registry and a local blob store, a real
Mosquitto carrying retained assignments and status reports, and one
``EdgeAgent`` + ``ModelUpdater`` per device.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import pytest

from edge_agent import EdgeAgent, ModelUpdater
from model_cdn import create_app, make_assignment
from shared import (
    MqttSettings,
    Topics,
    UpdateState,
    UpdateStatus,
    create_client,
)

from ._brokers import MosquittoProcess
from ._cdn import serve_in_thread
from ._demo_fleet import provision, publish_demo_versions
from ._update_kit import wait_until

MODEL = "mnist-edge"
DEVICES = [f"cam-{i}" for i in range(4)]
ADMIN = "admin-secret"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_fleet_updates_while_serving(tmp_path: Path, mosquitto: MosquittoProcess) -> None:
    import httpx

    versions = publish_demo_versions(tmp_path, MODEL)
    key, registry, store, digits = (
        versions.key,
        versions.registry,
        versions.store,
        versions.digits,
    )
    v1, v2 = versions.published
    assert (v1.manifest.version, v2.manifest.version) == (1, 2)
    assert v2.manifest.deltas and v2.manifest.deltas[0].from_version == 1

    settings = MqttSettings.from_url(mosquitto.url)
    topics = Topics("fleet/v1")
    reports: dict[str, list[UpdateStatus]] = defaultdict(list)
    listener = create_client(settings, "fleet-listener", protocol="5")
    listener.on_message = lambda _c, _u, m: reports[
        (s := UpdateStatus.from_json(bytes(m.payload))).device
    ].append(s)
    listener.connect(settings.host, settings.port)
    listener.loop_start()
    listener.subscribe(f"{topics.prefix}/dev/+/status", qos=1)

    app = create_app(
        registry=registry,
        store=store,
        admin_token=ADMIN,
        trusted_keys=[key.public_key],
        mqtt=settings,
        topics=topics,
    )
    answers: dict[str, list[str]] = defaultdict(list)
    errors: list[BaseException] = []
    stop = threading.Event()
    fleet: list[tuple[EdgeAgent, ModelUpdater]] = []

    def serve(device: str, agent: EdgeAgent) -> None:
        i = 0
        while not stop.is_set():
            image = digits.test_images[i % len(digits.test_images)][None]
            i += 1
            try:
                answers[device].append(agent.infer(image).model_versions["edge"])
            except BaseException as e:  # any failure is a dropped request
                errors.append(e)

    with serve_in_thread(app, lifespan="on") as cdn_url:  # its shutdown closes the MQTT link
        for device in DEVICES:
            store_dir = tmp_path / device
            provision(store_dir, versions)
            runtime = ModelUpdater.bootstrap(store_dir, [key.public_key], MODEL)
            agent = EdgeAgent(runtime, device_id=device)
            updater = ModelUpdater(
                agent,
                model=MODEL,
                device_id=device,
                cdn_url=cdn_url,
                trusted_keys=[key.public_key],
                store_dir=store_dir,
                mqtt=settings,
                topics=topics,
            )
            fleet.append((agent, updater.start()))
        threads = [
            threading.Thread(target=serve, args=(d, a))
            for d, (a, _) in zip(DEVICES, fleet, strict=True)
        ]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: all(len(answers[d]) > 20 for d in DEVICES), 60, "traffic on v1")
            with httpx.Client(
                base_url=cdn_url, headers={"Authorization": f"Bearer {ADMIN}"}
            ) as http:
                for device in DEVICES:
                    doc = make_assignment(key, device=device, model=MODEL, version=2)
                    http.put(
                        f"/v1/devices/{device}/assignments/{MODEL}", json=doc
                    ).raise_for_status()
            wait_until(
                lambda: all(
                    any(r.state is UpdateState.INSTALLED for r in reports[d]) for d in DEVICES
                ),
                120,
                "every device installed v2",
            )
            wait_until(
                lambda: all(answers[d][-1] == f"{MODEL}@2" for d in DEVICES), 30, "v2 serving"
            )
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            for agent, updater in fleet:
                updater.stop()
                agent.close()
            listener.disconnect()
            listener.loop_stop()

    assert errors == []  # not one request failed or was dropped during the rollout
    for device in DEVICES:
        states = [r.state for r in reports[device] if r.version == 2]
        assert states == [UpdateState.DOWNLOADING, UpdateState.VERIFYING, UpdateState.INSTALLED]
        versions = answers[device]
        switch = versions.index(f"{MODEL}@2")
        assert set(versions[:switch]) == {f"{MODEL}@1"} and set(versions[switch:]) == {f"{MODEL}@2"}
        assert reports[device][-1].running_version == 2
    delta_size = v2.manifest.deltas[0].size
    for _, updater in fleet:  # each device fetched only the delta, not the full blob
        assert updater.stats.delta_installs == 1
        assert updater.stats.blob_bytes_read == delta_size
