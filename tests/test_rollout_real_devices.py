"""Real devices under a staged rollout: EdgeAgent + ModelUpdater + TelemetryReporter.

The SDK's own pieces, not the simulator: each device serves MNIST digits
the whole time, reports telemetry with its labels, follows the retained
assignment the rollout controller signs, and swaps models between requests.
The CDN runs with its rollout service on a real Mosquitto.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_agent import EdgeAgent, ModelUpdater, TelemetryReporter
from model_cdn import FleetService, create_app
from shared import MqttSettings, Topics

from ._brokers import MosquittoProcess
from ._cdn import serve_in_thread
from ._demo_fleet import provision, publish_demo_versions
from ._update_kit import wait_until

MODEL = "mnist-edge"
ADMIN = "admin-secret"
SITES = {"cam-0": "north", "cam-1": "north", "cam-2": "north", "cam-3": "south"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_devices_take_a_staged_rollout_of_their_target_only(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    versions = publish_demo_versions(tmp_path, MODEL)
    key, registry, store, digits = (
        versions.key,
        versions.registry,
        versions.store,
        versions.digits,
    )

    settings = MqttSettings.from_url(mosquitto.url)
    topics = Topics("rollout-real/v1")
    service = FleetService(registry, key, settings, topics, tick_s=0.1).start()
    app = create_app(
        registry=registry, store=store, admin_token=ADMIN, controller=service.controller
    )
    answers: dict[str, list[str]] = defaultdict(list)
    errors: list[BaseException] = []
    stop = threading.Event()
    devices: list[tuple[EdgeAgent, ModelUpdater, TelemetryReporter]] = []

    def serve(device: str, agent: EdgeAgent) -> None:
        i = 0
        while not stop.is_set():
            image = digits.test_images[i % len(digits.test_images)][None]
            i += 1
            try:
                answers[device].append(agent.infer(image).model_versions["edge"])
            except BaseException as e:  # any failure is a dropped request
                errors.append(e)
            time.sleep(0.002)

    threads: list[threading.Thread] = []
    try:
        with (
            serve_in_thread(app) as cdn_url,
            httpx.Client(
                base_url=cdn_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
            ) as http,
        ):
            for device, site in SITES.items():
                store_dir = tmp_path / device
                provision(store_dir, versions)
                runtime = ModelUpdater.bootstrap(store_dir, [key.public_key], MODEL)
                agent = EdgeAgent(
                    runtime,
                    device_id=device,
                    broker=settings,
                    topics=topics,
                    labels={"site": site},
                ).start()
                updater = ModelUpdater(
                    agent,
                    model=MODEL,
                    device_id=device,
                    cdn_url=cdn_url,
                    trusted_keys=[key.public_key],
                    store_dir=store_dir,
                    mqtt=settings,
                    topics=topics,
                ).start()
                reporter = TelemetryReporter(agent, interval_s=0.3).start()
                devices.append((agent, updater, reporter))
                threads.append(threading.Thread(target=serve, args=(device, agent)))
            for t in threads:
                t.start()

            def known() -> list[dict[str, Any]]:
                return list(http.get("/v1/devices").json()["devices"])

            wait_until(lambda: len(known()) == len(SITES), 30, "every device's heartbeat")
            # the operator's labels: what a rollout targets (a heartbeat's are only claims)
            inventory = {d: {"site": site} for d, site in SITES.items()}
            assert http.post("/v1/fleet/labels", json={"devices": inventory}).status_code == 200
            north = [d for d in known() if d["labels"] == {"site": "north"}]
            assert len(north) == 3 and all(d["models"] == {MODEL: 1} for d in north)
            created = http.post(
                "/v1/rollouts",
                json={
                    "model": MODEL,
                    "version": 2,
                    "target": {"site": "north"},
                    "waves": "1,100%",
                    "soak_s": 0.5,
                },
            )
            assert created.status_code == 201, created.text
            rid = created.json()["id"]

            def state() -> dict[str, Any]:
                return dict(http.get(f"/v1/rollouts/{rid}").json())

            wait_until(lambda: state()["state"] == "completed", 120, "the rollout to complete")
            assert state()["counts"]["installed"] == 3
            wait_until(
                lambda: all(answers[d][-1] == f"{MODEL}@2" for d in SITES if SITES[d] == "north"),
                30,
                "v2 serving in the north",
            )
            # the south device keeps v1: the completed rollout assigned it nothing (so nothing
            # can move it later), and it goes on answering with v1 meanwhile
            south = registry.get_assignment("cam-3", MODEL)
            assert south is None or south["signed"]["version"] == 1, south
            seen = len(answers["cam-3"])
            wait_until(lambda: len(answers["cam-3"]) >= seen + 20, 30, "more answers in the south")
            assert set(answers["cam-3"][seen:]) == {f"{MODEL}@1"}
            shown = http.get("/v1/devices/cam-0").json()
            wait_until(
                lambda: http.get("/v1/devices/cam-0").json()["models"] == {MODEL: 2},
                10,
                "the fleet registry to show cam-0 on v2",
            )
            assert shown["telemetry"]["capabilities"]["runtime"]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for agent, updater, reporter in devices:
            reporter.stop()
            updater.stop()
            agent.close()
        service.stop()
        registry.close()
    assert errors == []  # not one request failed or was dropped during the rollout
