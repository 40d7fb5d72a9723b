"""The fleet simulator: simulated devices on a real Mosquitto and a real CDN server.

Real parts only: Mosquitto on a free port, the CDN app (uvicorn in a thread)
over a SQLite registry and a local blob store with signed versions 1-3, a
test MQTT client that publishes signed, retained assignments and reads
every status and telemetry report the devices send.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from model_cdn import LocalBlobStore, create_app, make_assignment, open_registry
from shared import (
    ConfigError,
    DeviceReport,
    MqttSettings,
    SigningKey,
    Topics,
    UpdateState,
    UpdateStatus,
    create_client,
)
from tandem.simulator import FleetSimulator, FleetSnapshot, SimulatorConfig, SimulatorError

from ._brokers import MosquittoProcess
from ._cdn import make_manifest_doc, serve_in_thread

MODEL = "sim-model"
_prefixes = itertools.count()


@dataclass
class Cdn:
    url: str
    key: SigningKey
    blobs: dict[int, bytes]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoProcess]:
    process = MosquittoProcess(tmp_path_factory.mktemp("sim-mosquitto")).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def cdn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cdn]:
    """The CDN server with versions 1, 2 and 3 of MODEL, signed by ``key``."""
    root = tmp_path_factory.mktemp("sim-cdn")
    key = SigningKey.generate()
    registry = open_registry(f"sqlite:///{root / 'registry.db'}")
    store = LocalBlobStore(root / "blobs")
    blobs = {}
    for version in (1, 2, 3):
        blob = os.urandom(2000 + version)
        store.put(blob)
        registry.add_version(make_manifest_doc(key, MODEL, version, blob))
        blobs[version] = blob
    app = create_app(registry=registry, store=store, admin_token=None)
    with serve_in_thread(app) as url:
        yield Cdn(url, key, blobs)
    registry.close()


@dataclass
class Probe:
    """The test's own MQTT client: publishes assignments, collects reports."""

    broker: MosquittoProcess
    topics: Topics
    statuses: dict[str, list[UpdateStatus]] = field(default_factory=lambda: defaultdict(list))
    telemetry: dict[str, list[DeviceReport]] = field(default_factory=lambda: defaultdict(list))
    bad: list[str] = field(default_factory=list)
    with_telemetry: bool = True

    def __post_init__(self) -> None:
        settings = MqttSettings.from_url(self.broker.url)
        self.client = create_client(settings, f"probe-{uuid.uuid4().hex[:8]}", protocol="5")
        subscribed: queue.Queue[int] = queue.Queue()
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda _c, _u, mid, _r, _p: subscribed.put(mid)
        self.client.connect(settings.host, settings.port)
        self.client.loop_start()
        head = f"{self.topics.prefix}/dev/+"
        wanted = [(f"{head}/status", 1)]
        if self.with_telemetry:
            wanted.append((f"{head}/telemetry", 0))
        self.client.subscribe(wanted)
        subscribed.get(timeout=10)

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        payload = bytes(message.payload)
        try:
            if message.topic.endswith("/status"):
                status = UpdateStatus.from_json(payload)
                self.statuses[status.device].append(status)
            else:
                report = DeviceReport.from_json(payload)
                self.telemetry[report.device].append(report)
        except Exception as e:  # a report that does not parse fails the test later
            self.bad.append(f"{message.topic}: {e}")

    def assign(self, documents: dict[str, dict[str, Any]]) -> None:
        """Publish each device's signed assignment, retained, QoS 1; wait for every PUBACK."""
        infos = [
            self.client.publish(
                self.topics.assign(device), json.dumps(doc).encode(), qos=1, retain=True
            )
            for device, doc in documents.items()
        ]
        for info in infos:
            info.wait_for_publish(30)

    def states(self, device: str) -> list[str]:
        return [s.state.value for s in self.statuses[device]]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _topics() -> Topics:
    return Topics(f"simtest{next(_prefixes)}/v1")


def _config(broker: MosquittoProcess, cdn: Cdn, topics: Topics, **options: Any) -> SimulatorConfig:
    defaults: dict[str, Any] = dict(
        broker=broker.url,
        topic_prefix=topics.prefix,
        cdn_url=cdn.url,
        trusted_keys=(cdn.key.public_key,),
        model=MODEL,
        initial_version=1,
        install_delay_s=(0.0, 0.05),
        telemetry_interval_s=1.0,
    )
    defaults.update(options)
    return SimulatorConfig(**defaults)


def _assignments(
    key: SigningKey, devices: list[str], version: int, **options: Any
) -> dict[str, dict[str, Any]]:
    return {
        d: make_assignment(key, device=d, model=MODEL, version=version, **options) for d in devices
    }


@pytest.fixture
def topics() -> Topics:
    return _topics()


@pytest.fixture
def probe(broker: MosquittoProcess, topics: Topics) -> Iterator[Probe]:
    p = Probe(broker, topics)
    yield p
    p.close()


def _all_online(f: FleetSnapshot) -> bool:
    return f.online == f.total


def _settled(f: FleetSnapshot, version: int) -> bool:
    """Every device has finished its install of ``version``, one way or the other."""
    return all(
        d.installing_version is None
        and d.last_status is not None
        and d.last_status.version == version
        and d.last_status.state in (UpdateState.INSTALLED, UpdateState.FAILED)
        for d in f.devices.values()
    )


def test_fifty_devices_install_an_assigned_version(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, probe: Probe
) -> None:
    config = _config(broker, cdn, topics, devices=50, labels={"fleet": "test"})
    with FleetSimulator(config) as sim:
        sim.wait_until(_all_online, 20)
        devices = sim.device_ids()
        assert len(set(devices)) == 50 and devices[0] == "sim-0001"
        probe.assign(_assignments(cdn.key, devices, 2, rollout="ro-0123456789ab"))
        final = sim.wait_until(lambda f: f.versions[2] == 50 and f.installing == 0, 30)

        assert final.installs == 50 and final.failures == 0
        assert final.http_requests >= 100  # a manifest and a blob per device, really fetched
        for device in devices:
            state = sim.device(device)
            assert state.running_version == 2 and state.online
            assert state.last_status is not None
            assert state.last_status.state == UpdateState.INSTALLED
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            probe.states(d)[-1:] != ["installed"] for d in devices
        ):
            time.sleep(0.05)
        for device in devices:
            assert probe.states(device) == ["downloading", "verifying", "installed"], device
            last = probe.statuses[device][-1]
            assert (last.version, last.running_version, last.rollout) == (2, 2, "ro-0123456789ab")
        labels = {(sim.device(d).labels["site"], sim.device(d).labels["hw"]) for d in devices}
        assert len(labels) == 6  # every site and hardware pair
        assert all(sim.device(d).labels["fleet"] == "test" for d in devices)
    assert sim.snapshot().online == 0
    assert not probe.bad


def test_failing_devices_and_a_bad_version_report_failed(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, probe: Probe
) -> None:
    config = _config(broker, cdn, topics, devices=20, fail_rate=0.25, fail_versions={3}, seed=7)
    with FleetSimulator(config) as sim:
        sim.wait_until(_all_online, 20)
        devices = sim.device_ids()
        failing = {d for d in devices if sim.device(d).traits.fails_installs}
        assert len(failing) == 5  # exactly a quarter, chosen by the seed

        probe.assign(_assignments(cdn.key, devices, 2))
        after_v2 = sim.wait_until(lambda f: _settled(f, 2), 30)
        for device, state in after_v2.devices.items():
            assert state.last_status is not None
            if device in failing:
                assert state.last_status.state == UpdateState.FAILED
                assert state.last_status.running_version == 1
                assert "simulated" in state.last_status.reason
                assert state.running_version == 1
            else:
                assert state.last_status.state == UpdateState.INSTALLED
                assert state.running_version == 2

        probe.assign(_assignments(cdn.key, devices, 3))  # the bad version: fails everywhere
        after_v3 = sim.wait_until(lambda f: _settled(f, 3), 30)
        assert after_v3.last_states() == {"failed": 20}
        assert after_v3.versions == {2: 15, 1: 5}
        with pytest.raises(SimulatorError, match="did not get there"):
            sim.wait_until(lambda f: f.versions[3] > 0, 0.2)


def test_a_bad_signature_or_a_downgrade_is_refused_and_a_rollback_is_not(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, probe: Probe
) -> None:
    config = _config(broker, cdn, topics, devices=3)
    with FleetSimulator(config) as sim:
        sim.wait_until(_all_online, 20)
        a, b, c = sim.device_ids()
        stranger = SigningKey.generate()
        tampered = make_assignment(cdn.key, device=b, model=MODEL, version=2)
        tampered["signed"]["version"] = 3  # altered after signing
        probe.assign(
            {
                a: make_assignment(stranger, device=a, model=MODEL, version=2),
                b: tampered,
                c: make_assignment(cdn.key, device=a, model=MODEL, version=2),  # a's, not c's
            }
        )
        refused = sim.wait_until(lambda f: f.failures == 3, 20)
        for device in (a, b, c):
            state = refused.devices[device]
            assert state.running_version == 1 and state.installing_version is None
            assert state.last_status is not None
            assert state.last_status.state == UpdateState.FAILED
            assert state.last_status.reason.startswith("assignment refused")
        assert "for device" in refused.devices[c].last_status.reason  # type: ignore[union-attr]
        assert refused.http_requests == 0  # nothing was fetched for a refused assignment

        # The same devices still take a good assignment, and refuse a plain downgrade.
        probe.assign(_assignments(cdn.key, [a], 3))
        sim.wait_until(lambda f: f.devices[a].running_version == 3, 20)
        probe.assign(_assignments(cdn.key, [a], 2))
        sim.wait_until(lambda f: f.devices[a].failures == 2, 20)
        assert "below the highest accepted" in sim.device(a).last_status.reason  # type: ignore[union-attr]
        assert sim.device(a).running_version == 3

        # A signed rollback goes down.
        # issued_at has whole seconds: wait for a later second than the install's
        second = int(time.time())
        while int(time.time()) == second:
            time.sleep(0.01)
        probe.assign(_assignments(cdn.key, [a], 1, rollback=True, rollout="ro-back"))
        back = sim.wait_until(lambda f: f.devices[a].running_version == 1, 20)
        status = back.devices[a].last_status
        assert status is not None and status.state == UpdateState.ROLLED_BACK
        assert status.rollout == "ro-back"


def test_an_offline_device_takes_its_retained_assignment_after_reconnecting(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, probe: Probe
) -> None:
    config = _config(
        broker, cdn, topics, devices=4, offline_rate=0.5, offline_after_s=0.0, offline_for_s=3.0
    )
    with FleetSimulator(config) as sim:
        devices = sim.device_ids()
        away = {d for d in devices if sim.device(d).traits.offline_at_s is not None}
        assert len(away) == 2
        # Everyone connected once, and the two drop off at once.
        sim.wait_until(
            lambda f: (
                all(d.connects >= 1 for d in f.devices.values())
                and all(not f.devices[d].online for d in away)
            ),
            20,
        )
        probe.assign(_assignments(cdn.key, devices, 2))  # while two devices are away
        final = sim.wait_until(lambda f: f.versions[2] == 4 and f.installing == 0, 30)
        for device in devices:
            state = final.devices[device]
            assert state.online
            assert state.connects == (2 if device in away else 1)
            assert state.last_status is not None
            assert state.last_status.state == UpdateState.INSTALLED


def test_devices_come_back_after_the_broker_restarts(
    tmp_path: Path, cdn: Cdn, topics: Topics
) -> None:
    own = MosquittoProcess(tmp_path).start()
    try:
        config = _config(own, cdn, topics, devices=10, reconnect_delay_s=(0.1, 0.3))
        with FleetSimulator(config) as sim:
            sim.wait_until(_all_online, 20)
            own.stop()
            sim.wait_until(lambda f: f.online == 0, 20)
            own.start()  # the same port, and no sessions or retained messages left
            back = sim.wait_until(lambda f: all(d.connects >= 2 for d in f.devices.values()), 30)
            assert back.online == 10
            probe = Probe(own, topics)
            try:
                probe.assign(_assignments(cdn.key, sim.device_ids(), 2))
                sim.wait_until(lambda f: f.versions[2] == 10, 30)
            finally:
                probe.close()
    finally:
        own.stop()


def test_telemetry_parses_and_reflects_the_version_and_disagreement(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, probe: Probe
) -> None:
    config = _config(
        broker,
        cdn,
        topics,
        devices=6,
        telemetry_interval_s=0.2,
        requests_per_s=(1500.0, 2500.0),
        disagree_rate=0.5,
        disagree_versions={2},
        labels={"line": "7"},
    )
    with FleetSimulator(config) as sim:
        sim.wait_until(_all_online, 20)
        devices = sim.device_ids()
        disagreeing = {d for d in devices if sim.device(d).traits.disagrees}
        assert len(disagreeing) == 3

        def latest(device: str, version: int) -> DeviceReport | None:
            reports = [r for r in probe.telemetry[device] if r.version == version]
            return reports[-1] if reports else None

        def enough(version: int) -> bool:
            return all(
                (r := latest(d, version)) is not None and r.agreement_samples >= 200
                for d in devices
            )

        _wait(lambda: enough(1), 20, "telemetry on version 1")
        for device in devices:
            report = latest(device, 1)
            assert report is not None
            assert report.model == MODEL and report.capabilities["runtime"] == "simulated"
            assert set(report.labels) == {"site", "hw", "line"} and report.labels["line"] == "7"
            assert report.agreement_samples == report.offloads <= report.requests
            assert report.p50_ms is not None and report.p99_ms is not None
            assert report.agreement is not None
            if device in disagreeing:
                assert report.agreement < 0.8, (device, report.agreement)
            else:
                assert report.agreement > 0.9, (device, report.agreement)
        before = {d: latest(d, 1).requests for d in devices}  # type: ignore[union-attr]

        probe.assign(_assignments(cdn.key, devices, 2))  # version 2 disagrees everywhere
        sim.wait_until(lambda f: f.versions[2] == 6, 30)
        _wait(lambda: enough(2), 20, "telemetry on version 2")
        for device in devices:
            report = latest(device, 2)
            assert report is not None and report.agreement is not None
            assert report.agreement < 0.8, (device, report.agreement)
            first_v2 = next(r for r in probe.telemetry[device] if r.version == 2)
            assert first_v2.requests < before[device]  # counters started again on the swap
    assert not probe.bad


def test_the_config_refuses_nonsense(broker: MosquittoProcess, cdn: Cdn, topics: Topics) -> None:
    with pytest.raises(ConfigError, match="fraction"):
        _config(broker, cdn, topics, fail_rate=1.5)
    with pytest.raises(ConfigError, match="trusted"):
        _config(broker, cdn, topics, trusted_keys=())
    with pytest.raises(ConfigError, match="install_delay_s"):
        _config(broker, cdn, topics, install_delay_s=(2.0, 1.0))
    with pytest.raises(ConfigError, match="device id prefix"):
        _config(broker, cdn, topics, id_prefix="a/b")
    lonely = dataclasses.replace(_config(broker, cdn, topics), broker="mqtt://127.0.0.1:1")
    with pytest.raises(SimulatorError, match="cannot reach the MQTT broker"):
        FleetSimulator(lonely).start()


def test_the_command_runs_a_fleet_for_a_while_and_exits_0(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, tmp_path: Path
) -> None:
    from tandem.cli._fleet_simulate import fleet_simulate

    key_file = tmp_path / "publisher.pub"
    key_file.write_text(cdn.key.public_key.to_text())
    app = _command(fleet_simulate)
    common = ["--trusted-key", str(key_file), "--cdn", cdn.url, "--model", MODEL]
    fleet = ["--devices", "5", "--broker", broker.url, "--prefix", topics.prefix]
    result = CliRunner().invoke(
        app, [*common, *fleet, "--duration", "1.5", "--label", "zone=north"]
    )
    assert result.exit_code == 0, result.output
    assert "simulated 5 devices" in result.output

    result = CliRunner().invoke(app, [*common, "--broker", "mqtt://127.0.0.1:1"])
    assert result.exit_code == 1
    assert "tandem fleet simulate: cannot reach the MQTT broker" in result.output
    result = CliRunner().invoke(app, [*common, "--fail-rate", "0.5", "--label", "oops"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_the_command_stops_cleanly_on_sigterm(
    broker: MosquittoProcess, cdn: Cdn, topics: Topics, tmp_path: Path
) -> None:
    key_file = tmp_path / "publisher.pub"
    key_file.write_text(cdn.key.public_key.to_text())
    code = (
        "import typer; from tandem.cli._fleet_simulate import fleet_simulate; "
        "typer.run(fleet_simulate)"
    )
    args = ["--trusted-key", str(key_file), "--cdn", cdn.url, "--model", MODEL, "--devices", "3"]
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args, "--broker", broker.url, "--prefix", topics.prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        probe = Probe(broker, topics)
        try:
            _wait(lambda: len(probe.telemetry) == 3, 60, "telemetry from the three devices")
        finally:
            probe.close()
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err.decode()
    assert b"simulated 3 devices" in err


# 1,000 devices end to end: tests/test_rollout_fleet.py (a 3-wave rollout through the CDN).


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def _command(function: Any) -> Any:
    import typer

    app = typer.Typer(add_completion=False)
    app.command()(function)
    return app


def test_stop_leaves_no_thread_behind(broker: MosquittoProcess, cdn: Cdn, topics: Topics) -> None:
    before = {t.ident for t in threading.enumerate()}
    with FleetSimulator(_config(broker, cdn, topics, devices=5)) as sim:
        sim.wait_until(_all_online, 20)
        sim.take_offline(sim.device_ids()[0], 0.2)
        sim.wait_until(lambda f: f.devices[sim.device_ids()[0]].connects == 2, 20)
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not left, left
