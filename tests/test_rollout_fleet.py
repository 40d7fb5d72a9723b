"""Rollouts end to end: a simulated fleet on a real Mosquitto, the CDN server with its
rollout controller, the admin HTTP API.

Every device is a real MQTT connection of the fleet simulator; it takes its
signed assignment from its retained topic, downloads and checks the signed
manifest and the blob from the CDN over HTTP, and reports status and
telemetry, which the CDN's fleet link hears. Nothing is stubbed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import FleetService, LocalBlobStore, create_app, open_registry
from model_cdn.registry import Registry
from shared import MqttSettings, SigningKey, Topics
from tandem.simulator import FleetSimulator, FleetSnapshot, SimulatorConfig

from ._brokers import MosquittoProcess
from ._cdn import make_manifest_doc, serve_in_thread

MODEL = "mnist"
ADMIN = {"Authorization": "Bearer admin-secret"}
TERMINAL = {"completed", "aborted", "rolled_back", "halted"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoProcess]:
    process = MosquittoProcess(tmp_path_factory.mktemp("rollout-mosquitto")).start()
    yield process
    process.stop()


@dataclass
class Cdn:
    """The CDN server with its rollout service, restartable on the same registry."""

    root: Path
    broker: MosquittoProcess
    key: SigningKey = field(default_factory=SigningKey.generate)
    topics: Topics = field(default_factory=lambda: Topics(f"t{os.urandom(4).hex()}"))
    stack: ExitStack = field(default_factory=ExitStack)
    client: httpx.Client | None = None
    service: FleetService | None = None
    registry: Registry | None = None
    port: int = 0

    def publish_versions(self, *versions: int) -> None:
        registry = open_registry(self.root / "registry.db")
        store = LocalBlobStore(self.root / "blobs")
        for v in versions:
            blob = os.urandom(4000 + v)
            store.put(blob)
            registry.add_version(make_manifest_doc(self.key, MODEL, v, blob))
        registry.close()

    @property
    def settings(self) -> MqttSettings:
        return MqttSettings(host="127.0.0.1", port=self.broker.port)

    def start(self) -> Cdn:
        self.stack = ExitStack()
        self.registry = open_registry(self.root / "registry.db")
        self.stack.callback(self.registry.close)
        self.service = FleetService(
            self.registry, self.key, self.settings, self.topics, tick_s=0.1, flush_s=0.2
        ).start()
        self.stack.callback(self.service.stop)
        app = create_app(
            registry=self.registry,
            store=LocalBlobStore(self.root / "blobs"),
            admin_token="admin-secret",
            controller=self.service.controller,
        )
        # the same port after a restart: devices keep their CDN URL
        url = self.stack.enter_context(serve_in_thread(app, port=self.port))
        self.url, self.port = url, int(url.rsplit(":", 1)[1])
        self.client = self.stack.enter_context(
            httpx.Client(base_url=url, timeout=30, headers=ADMIN)
        )
        return self

    def stop(self) -> None:
        self.stack.close()

    def simulator(self, devices: int, **options: Any) -> FleetSimulator:
        config = SimulatorConfig(
            devices=devices,
            broker=self.settings,
            topic_prefix=self.topics.prefix,
            cdn_url=self.url,
            trusted_keys=(self.key.public_key,),
            model=MODEL,
            initial_version=1,
            **{"telemetry_interval_s": 0.5, "install_delay_s": (0.01, 0.1), **options},
        )
        return FleetSimulator(config)

    def api(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        assert self.client is not None
        response = self.client.request(method, path, **kw)
        assert response.status_code < 300, response.text
        return dict(response.json())

    def wait_known(self, n: int, timeout_s: float = 60) -> None:
        wait_for(lambda: len(self.api("GET", "/v1/devices")["devices"]) >= n, timeout_s, "devices")

    def wait_state(self, rid: str, states: set[str], timeout_s: float) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.api("GET", f"/v1/rollouts/{rid}"))
            return found["state"] in states

        wait_for(reached, timeout_s, f"rollout {rid} to reach {states}", lambda: found)
        return found


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    detail: Callable[[], object] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}: {detail()}")
        time.sleep(0.1)


@pytest.fixture
def cdn(tmp_path: Path, broker: MosquittoProcess) -> Iterator[Cdn]:
    c = Cdn(tmp_path, broker)
    c.publish_versions(1, 2, 3)
    c.start()
    yield c
    c.stop()


def start(cdn: Cdn, **body: Any) -> dict[str, Any]:
    body = {"model": MODEL, "version": 2, "waves": "10%,50%,100%", "soak_s": 0.5, **body}
    return cdn.api("POST", "/v1/rollouts", json=body)


def on_version(version: int, n: int) -> Callable[[FleetSnapshot], bool]:
    return lambda f: f.versions.get(version, 0) == n and f.installing == 0


def test_a_three_wave_rollout_completes_and_every_device_runs_the_new_version(
    cdn: Cdn,
) -> None:
    with cdn.simulator(60) as fleet:
        cdn.wait_known(60)
        status = start(cdn)
        assert [w["planned"] for w in status["waves"]] == [6, 24, 30]
        done = cdn.wait_state(status["id"], TERMINAL, 60)
        assert done["state"] == "completed", done
        assert done["counts"]["installed"] == 60
        fleet.wait_until(on_version(2, 60), 20)
        on_v2 = cdn.api("GET", "/v1/devices", params={"model": MODEL, "version": 2})
        wait_for(
            lambda: (
                len(cdn.api("GET", "/v1/devices", params={"model": MODEL, "version": 2})["devices"])
                == 60
            ),
            20,
            "the fleet registry to show every device on v2",
            lambda: len(on_v2["devices"]),
        )


def test_a_bad_version_halts_in_its_first_wave_and_rolls_back(cdn: Cdn) -> None:
    with cdn.simulator(50, fail_versions=frozenset({3})) as fleet:
        cdn.wait_known(50)
        status = start(cdn, version=3, previous_version=1, max_failure_rate=0.02, min_reports=5)
        rid = status["id"]
        halted = cdn.wait_state(rid, TERMINAL, 60)
        assert halted["state"] == "halted" and halted["wave"] == 0
        assert "failure rate" in halted["reason"]
        assert halted["counts"]["total"] == halted["waves"][0]["planned"] == 5  # wave 2 never
        cdn.api("POST", f"/v1/rollouts/{rid}/rollback")
        back = cdn.wait_state(rid, {"rolled_back"}, 60)
        assert back["counts"]["rolled_back"] == 5
        snapshot = fleet.wait_until(on_version(1, 50), 20)
        assert snapshot.versions == {1: 50}


def test_the_new_versions_agreement_drop_halts_on_telemetry(cdn: Cdn) -> None:
    with cdn.simulator(40, disagree_versions=frozenset({2})):
        cdn.wait_known(40)
        status = start(
            cdn, waves="25%,100%", max_agreement_drop=0.1, min_health_samples=50, soak_s=3
        )
        halted = cdn.wait_state(status["id"], TERMINAL, 60)
        assert halted["state"] == "halted" and halted["wave"] == 0, halted
        assert "health gate: agreement" in halted["reason"]
        [agreement] = halted["gates"]["judgements"]
        assert agreement["verdict"] == "fail" and agreement["lower"] > 0.1
        assert agreement["new"]["estimate"] < agreement["control"]["estimate"] - 0.1


def test_an_offline_device_catches_up_when_it_reconnects(cdn: Cdn) -> None:
    with cdn.simulator(20) as fleet:
        cdn.wait_known(20)
        away = fleet.device_ids()[:5]
        for device in away:
            fleet.take_offline(device, 4.0)
        fleet.wait_until(lambda f: f.online == 15, 10)
        status = start(cdn, waves="100%")
        done = cdn.wait_state(status["id"], TERMINAL, 60)
        assert done["state"] == "completed" and done["counts"]["installed"] == 20
        for device in away:
            state = fleet.device(device)
            assert state.running_version == 2 and state.connects >= 2


def test_a_restarted_server_resumes_the_rollout(cdn: Cdn) -> None:
    with cdn.simulator(30) as fleet:
        cdn.wait_known(30)
        rid = start(cdn, waves="10%,50%,100%", soak_s=2)["id"]
        wait_for(lambda: cdn.api("GET", f"/v1/rollouts/{rid}")["wave"] >= 1, 30, "the second wave")
        cdn.stop()  # reports sent meanwhile are lost; heartbeats tell the new server
        time.sleep(1.0)
        cdn.start()
        resumed = cdn.api("GET", f"/v1/rollouts/{rid}")
        assert resumed["state"] == "running" and resumed["wave"] >= 1
        done = cdn.wait_state(rid, TERMINAL, 60)
        assert done["state"] == "completed", (done["reason"], done["counts"])
        assert done["counts"]["installed"] == 30
        fleet.wait_until(on_version(2, 30), 20)


@pytest.mark.slow
def test_a_thousand_devices_take_a_three_wave_rollout(cdn: Cdn) -> None:
    with cdn.simulator(1000, telemetry_interval_s=5.0) as fleet:
        fleet.wait_until(lambda f: f.online == 1000, 120)
        cdn.wait_known(1000, 60)
        began = time.monotonic()
        status = start(cdn, waves="5%,25%,100%", soak_s=1)
        done = cdn.wait_state(status["id"], TERMINAL, 240)
        took = time.monotonic() - began
        assert done["state"] == "completed", done
        assert done["counts"]["installed"] == 1000
        fleet.wait_until(on_version(2, 1000), 60)
        print(f"1,000 devices, 3 waves: completed in {took:.1f} s")
