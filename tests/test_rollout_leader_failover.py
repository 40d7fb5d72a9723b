"""Two real ``tandem cdn serve`` processes on one PostgreSQL registry: kill -9 the leader.

A simulated fleet (real MQTT connections, real signed downloads) runs on a
Mosquitto of the test's own; the CDN replicas are real processes started
from the CLI, exactly as a Deployment runs them, with the default lease
(10 s). A recorder subscribed to every device's assignment topic keeps every
assignment the broker carried. The rollout is started and paused through the
follower (its commands reach the leader through the registry), the leader is
killed with SIGKILL in the middle of it, and the follower must take over,
resume it, and complete it, with each device sent exactly one signed
assignment of the new version (the same stored document may be re-sent
after the take-over; a second, different one would be a wave assigned twice).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import LocalBlobStore, open_registry
from shared import MqttSettings, SigningKey, create_client, verify_assignment
from tandem.simulator import FleetSimulator, SimulatorConfig

from ._brokers import MosquittoProcess, free_port, wait_for_port
from ._cdn import make_manifest_doc
from ._cli import tandem_env

pytestmark = pytest.mark.slow

MODEL = "mnist"
ADMIN = {"Authorization": "Bearer admin-secret"}
DEVICES = 24


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


class Replica:
    """One ``python -m tandem.cli cdn serve`` process; its log goes to a file."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tandem.cli",
                    "cdn",
                    "serve",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                    *args,
                ],
                env=tandem_env(TANDEM_CDN_ADMIN_TOKEN="admin-secret"),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for_port(self.port, 60)
        self.client = httpx.Client(base_url=self.url, timeout=30, headers=ADMIN)

    def leads(self) -> bool:
        text = self.client.get("/metrics").text
        match = re.search(r"^tandem_cdn_rollout_leader (\S+)$", text, re.M)
        return match is not None and float(match.group(1)) == 1.0

    def api(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        response = self.client.request(method, path, **kw)
        assert response.status_code < 300, (response.status_code, response.text)
        return dict(response.json())

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class AssignmentRecorder:
    """Every assignment the broker delivers on ``{prefix}/dev/+/assign``, retained or not."""

    def __init__(self, broker: MosquittoProcess, prefix: str) -> None:
        self.docs: list[tuple[str, dict[str, Any]]] = []
        settings = MqttSettings(host="127.0.0.1", port=broker.port)
        self.client = create_client(settings, f"rec-{uuid.uuid4().hex[:8]}", protocol="3.1.1")
        topic = f"{prefix}/dev/+/assign"
        self.client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(topic, qos=1)
        self.client.on_message = lambda _c, _u, m: self.docs.append(
            (m.topic.split("/")[-2], json.loads(m.payload))
        )
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def distinct(self, key: SigningKey) -> dict[tuple[str, int, bool], set[str]]:
        """(device, version, rollback) -> the distinct signed documents received."""
        out: dict[tuple[str, int, bool], set[str]] = defaultdict(set)
        for device, doc in list(self.docs):
            a = verify_assignment(doc, [key.public_key])
            assert a.device == device
            out[(device, a.version, a.rollback)].add(json.dumps(doc, sort_keys=True))
        return out

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def stack(tmp_path: Path, registry_url: str) -> Iterator[dict[str, Any]]:
    broker = MosquittoProcess(tmp_path).start()
    key = SigningKey.generate()
    (tmp_path / "assign.key").write_text(key.to_text() + "\n")
    (tmp_path / "assign.key").chmod(0o600)
    registry, store = open_registry(registry_url), LocalBlobStore(tmp_path / "blobs")
    for v in (1, 2):
        blob = os.urandom(3000 + v)
        store.put(blob)
        registry.add_version(make_manifest_doc(key, MODEL, v, blob))
    registry.close()
    prefix = f"t{uuid.uuid4().hex[:8]}"
    args = [
        "--registry",
        registry_url,
        "--store",
        str(tmp_path / "blobs"),
        "--broker",
        f"mqtt://127.0.0.1:{broker.port}",
        "--prefix",
        prefix,
        "--sign-key",
        str(tmp_path / "assign.key"),
    ]
    started: list[Replica] = []
    try:
        yield {
            "broker": broker,
            "key": key,
            "prefix": prefix,
            "args": args,
            "logs": tmp_path,
            "started": started,
        }
    finally:
        for replica in started:
            replica.stop()
        broker.stop()


@pytest.mark.parametrize("registry_url", ["postgres"], indirect=True)
def test_killing_the_leader_mid_rollout_hands_it_to_the_other_replica_which_completes_it(
    stack: dict[str, Any],
) -> None:
    first = Replica("cdn-a", stack["args"], stack["logs"])
    stack["started"].append(first)
    wait_for(first.leads, 30, "the first replica to lead")
    second = Replica("cdn-b", stack["args"], stack["logs"])
    stack["started"].append(second)
    assert not second.leads()
    recorder = AssignmentRecorder(stack["broker"], stack["prefix"])
    config = SimulatorConfig(
        devices=DEVICES,
        broker=MqttSettings(host="127.0.0.1", port=stack["broker"].port),
        topic_prefix=stack["prefix"],
        cdn_url=second.url,  # devices download from the replica that survives
        trusted_keys=(stack["key"].public_key,),
        model=MODEL,
        initial_version=1,
        telemetry_interval_s=0.5,
        install_delay_s=(0.01, 0.1),
    )
    try:
        with FleetSimulator(config) as fleet:
            for replica in (first, second):  # the follower hears the fleet too
                wait_for(
                    lambda r=replica: len(r.api("GET", "/v1/devices")["devices"]) == DEVICES,
                    60,
                    f"{replica.url} to know the fleet",
                )
            body = {"model": MODEL, "version": 2, "waves": "25%,50%,100%", "soak_s": 3}
            rid = second.api("POST", "/v1/rollouts", json=body)["id"]  # queued for the leader
            assert second.api("POST", f"/v1/rollouts/{rid}/pause")["state"] == "paused"
            assert second.api("POST", f"/v1/rollouts/{rid}/resume")["state"] == "running"
            wait_for(
                lambda: second.api("GET", f"/v1/rollouts/{rid}")["wave"] >= 1,
                60,
                "the second wave",
            )

            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
            killed = time.monotonic()
            wait_for(second.leads, 60, "the second replica to take over")
            print(f"take-over {time.monotonic() - killed:.1f} s after kill -9 (lease 10 s)")

            wait_for(
                lambda: second.api("GET", f"/v1/rollouts/{rid}")["state"] == "completed",
                90,
                "the rollout to complete",
            )
            done = second.api("GET", f"/v1/rollouts/{rid}")
            assert done["counts"]["installed"] == DEVICES, done
            fleet.wait_until(lambda f: f.versions.get(2, 0) == DEVICES, 30)
            devices = set(fleet.device_ids())
    finally:
        recorder.close()

    sent = recorder.distinct(stack["key"])
    assert not [k for k in sent if k[2]], "no device was ever sent back"
    assert {device for device, version, _rb in sent if version == 2} == devices
    twice = {k: len(v) for k, v in sent.items() if len(v) != 1}
    assert not twice, f"devices sent two different assignments of one version: {twice}"
