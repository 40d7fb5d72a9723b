"""``tandem fleet simulate`` against a secured broker: each device connects as itself.

Issue 21 (item 9): the simulator could not authenticate to a broker secured
as ``tandem fleet provision`` secures it (a user per device, topic rules by
user, with the dynamic-security plugin client ids bound to users). Here a
real Mosquitto is configured from the provisioning command's own files, the
devices take ``--password-file`` (the provisioning command's
``--password-out``), and a signed assignment published as the CDN's user
must be installed and reported by every device. Without the passwords the
broker lets no device in.
"""

from __future__ import annotations

import json
import os
import queue
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from model_cdn import LocalBlobStore, create_app, make_assignment, open_registry
from shared import MqttSettings, SigningKey, Topics, UpdateStatus, create_client
from tandem.simulator import FleetSimulator, SimulatorConfig

from ._brokers import MosquittoProcess, dynsec_plugin
from ._cdn import make_manifest_doc, serve_in_thread
from ._cli import tandem
from ._needs import need

MODEL = "sim-model"
PREFIX = "simauth/v1"
DEVICES = ["sim-0001", "sim-0002", "sim-0003"]


@pytest.fixture(scope="module")
def cdn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SigningKey]]:
    root = tmp_path_factory.mktemp("auth-cdn")
    key = SigningKey.generate()
    registry = open_registry(f"sqlite:///{root / 'registry.db'}")
    store = LocalBlobStore(root / "blobs")
    for version in (1, 2):
        blob = os.urandom(1000 + version)
        store.put(blob)
        registry.add_version(make_manifest_doc(key, MODEL, version, blob))
    try:
        with serve_in_thread(create_app(registry=registry, store=store, admin_token=None)) as url:
            yield url, key
    finally:
        registry.close()


@pytest.fixture(params=["passwd+acl", "dynsec"])
def secured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MosquittoProcess]:
    """A Mosquitto secured by the files 'tandem fleet provision' writes; passwords in pw.txt."""
    if request.param == "dynsec" and dynsec_plugin() is None:
        need("Mosquitto's dynamic-security plugin is not installed")
    out = ["--prefix", PREFIX, "--password-out", str(tmp_path / "pw.txt")]
    if request.param == "dynsec":
        files = ["--dynsec-file", str(tmp_path / "dynsec.json")]
    else:
        files = ["--passwd-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl")]
    made = tandem("fleet", "provision", *DEVICES, "cdn", *files, *out, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    if request.param == "dynsec":
        broker = MosquittoProcess(tmp_path, dynsec_file=tmp_path / "dynsec.json")
    else:
        broker = MosquittoProcess(
            tmp_path, password_file=tmp_path / "passwd", extra_config=f"acl_file {tmp_path}/acl\n"
        )
    broker.start()
    yield broker
    broker.stop()


def _passwords(path: Path) -> dict[str, str]:
    return dict(line.split() for line in path.read_text().splitlines() if line.strip())


class CdnUser:
    """The CDN's MQTT user: publishes signed assignments, reads the devices' status."""

    def __init__(self, broker: MosquittoProcess, password: str) -> None:
        settings = MqttSettings.from_url(broker.url, username="cdn", password=password)
        self.statuses: dict[str, list[UpdateStatus]] = defaultdict(list)
        self.client = create_client(settings, f"cdn-{uuid.uuid4().hex[:6]}", protocol="5")
        subscribed: queue.Queue[int] = queue.Queue()
        self.client.on_subscribe = lambda _c, _u, mid, _r, _p: subscribed.put(mid)
        self.client.on_message = self._on_message
        self.client.connect(settings.host, settings.port)
        self.client.loop_start()
        self.client.subscribe(f"{PREFIX}/dev/+/status", qos=1)
        subscribed.get(timeout=10)

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        status = UpdateStatus.from_json(bytes(message.payload))
        self.statuses[status.device].append(status)

    def assign(self, key: SigningKey, version: int) -> None:
        topics = Topics(PREFIX)
        for device in DEVICES:
            doc = make_assignment(key, device=device, model=MODEL, version=version)
            info = self.client.publish(topics.assign(device), json.dumps(doc), qos=1, retain=True)
            info.wait_for_publish(30)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _config(broker: MosquittoProcess, url: str, key: SigningKey, **options: Any) -> SimulatorConfig:
    return SimulatorConfig(
        devices=len(DEVICES),
        broker=broker.url,
        topic_prefix=PREFIX,
        cdn_url=url,
        trusted_keys=(key.public_key,),
        model=MODEL,
        install_delay_s=(0.0, 0.05),
        telemetry_interval_s=0.5,
        reconnect_delay_s=(0.2, 0.5),
        **options,
    )


def test_devices_with_their_passwords_connect_as_themselves_and_install(
    secured: MosquittoProcess, cdn: tuple[str, SigningKey], tmp_path: Path
) -> None:
    url, key = cdn
    passwords = _passwords(tmp_path / "pw.txt")
    refused = _config(secured, url, key)  # the URL's (absent) user: the broker refuses them
    with FleetSimulator(refused) as sim:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert sim.snapshot().online == 0
            time.sleep(0.1)
        assert "refused" in (sim.snapshot().last_error or ""), sim.snapshot().last_error
    cdn_user = CdnUser(secured, passwords["cdn"])
    try:
        config = _config(secured, url, key, passwords=passwords)
        assert passwords["sim-0001"] not in repr(config)  # secrets stay out of logs
        with FleetSimulator(config) as sim:
            sim.wait_until(lambda f: f.online == f.total, 20)
            cdn_user.assign(key, 2)
            final = sim.wait_until(lambda f: f.versions[2] == len(DEVICES), 30)
            assert final.failures == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(
                not cdn_user.statuses[d] or cdn_user.statuses[d][-1].state.value != "installed"
                for d in DEVICES
            ):
                time.sleep(0.05)
            for device in DEVICES:  # each report reached the CDN's user through the rules
                assert cdn_user.statuses[device][-1].state.value == "installed", device
    finally:
        cdn_user.close()


def test_the_command_takes_the_password_file_and_names_a_device_without_one(
    secured: MosquittoProcess, cdn: tuple[str, SigningKey], tmp_path: Path
) -> None:
    from tandem.cli._fleet_simulate import fleet_simulate

    url, key = cdn
    (tmp_path / "publisher.pub").write_text(key.public_key.to_text())
    app = _command(fleet_simulate)
    common = [
        "--trusted-key", str(tmp_path / "publisher.pub"), "--cdn", url, "--model", MODEL,
        "--broker", secured.url, "--prefix", PREFIX, "--devices", "3",
        "--password-file", str(tmp_path / "pw.txt"),
    ]  # fmt: skip
    done = CliRunner().invoke(app, [*common, "--duration", "3", "--progress-every", "1"])
    assert done.exit_code == 0, done.output
    assert "simulated 3 devices" in done.output and "3/3 online" in done.output, done.output
    short = CliRunner().invoke(app, [*common, "--devices", "4"])
    assert short.exit_code == 2, short.output
    assert "no password for 1 of the 4 devices (the first: sim-0004)" in short.output
    (tmp_path / "bad.txt").write_text("sim-0001\n")
    bad = CliRunner().invoke(app, [*common[:-1], str(tmp_path / "bad.txt")])
    assert bad.exit_code == 2 and "line 1: expected 'DEVICE PASSWORD'" in bad.output


def _command(function: Any) -> Any:
    import typer

    app = typer.Typer(add_completion=False)
    app.command()(function)
    return app
