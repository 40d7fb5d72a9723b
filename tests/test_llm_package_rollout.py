"""A staged rollout of a language model package to real devices.

Two devices (``EdgeAgent`` with a language model, ``ModelUpdater``,
``TelemetryReporter``) on a real Mosquitto run package v1, installed from the
CDN by their updaters; the CDN's rollout service takes v2 (the hub model of
the tiny family, published as the next version of the same package) to both
in waves, and each device's next turn generates from v2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_agent import EdgeAgent, ModelUpdater, TelemetryReporter
from model_cdn import FleetService, create_app
from shared import MqttSettings, Topics, UpdateState

from ._brokers import MosquittoProcess
from ._cdn import serve_in_thread
from ._package_kit import MODEL, greedy_text, package_cdn
from ._update_kit import wait_until

ADMIN = "admin-secret"
DEVICES = ("phone-a", "phone-b")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_package_versions_roll_out_to_real_devices(
    tmp_path: Path, mosquitto: MosquittoProcess, tiny_language_models: Any
) -> None:
    settings = MqttSettings.from_url(mosquitto.url)
    topics = Topics("llm-rollout/v1")
    with package_cdn(tmp_path / "cdn") as cdn:
        cdn.publish(tiny_language_models.device_model)
        cdn.publish(tiny_language_models.hub_model)
        with EdgeAgent(None, device_id="ref", language_model=tiny_language_models.hub_model) as r:
            v2_text = greedy_text(r)
        service = FleetService(cdn.registry, cdn.key, settings, topics, tick_s=0.1).start()
        app = create_app(
            registry=cdn.registry, store=cdn.store, admin_token=ADMIN, controller=service.controller
        )
        devices: list[tuple[EdgeAgent, ModelUpdater, TelemetryReporter]] = []
        try:
            with (
                serve_in_thread(app) as url,
                httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
                ) as http,
            ):
                for device in DEVICES:
                    store_dir = tmp_path / device
                    cdn.assign(device, 1)
                    agent = EdgeAgent(
                        None,
                        device_id=device,
                        broker=settings,
                        topics=topics,
                        language_model=tiny_language_models.device_model,
                        labels={"site": "north"},
                        probe_cloud=False,
                    ).start()
                    updater = ModelUpdater(
                        agent,
                        model=MODEL,
                        device_id=device,
                        cdn_url=url,
                        trusted_keys=[cdn.key.public_key],
                        store_dir=store_dir,
                        mqtt=settings,
                        topics=topics,
                    )
                    first = updater.check_now()
                    assert first is not None and first.state is UpdateState.INSTALLED, first
                    updater.start()
                    reporter = TelemetryReporter(agent, interval_s=0.3).start()
                    devices.append((agent, updater, reporter))

                def known() -> list[dict[str, Any]]:
                    return list(http.get("/v1/devices").json()["devices"])

                wait_until(lambda: len(known()) == len(DEVICES), 30, "every device's heartbeat")
                inventory = {d: {"site": "north"} for d in DEVICES}
                assert http.post("/v1/fleet/labels", json={"devices": inventory}).status_code == 200
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
                assert state()["counts"]["installed"] == len(DEVICES)
                for agent, updater, _ in devices:
                    assert agent.language is not None and agent.language.version == "2"
                    assert updater.running_version == 2
                    assert greedy_text(agent) == v2_text
        finally:
            for agent, updater, reporter in devices:
                reporter.stop()
                updater.stop()
                agent.close()
            service.stop()
