"""``tandem rollout`` and ``tandem fleet list/show`` end to end against the real CDN.

The real CDN app (uvicorn on loopback) runs with the real rollout controller,
its MQTT link on a real Mosquitto and a SQLite registry; devices' update
reports are published to it as the updater does. Commands run through typer's
test runner in this process (exit code, stdout and stderr apart); Ctrl-C under
a terminal runs in a real process. The admin client beneath the commands is
checked against the same server. Input validation, help and rendering, which
need no server, are in ``test_rollout_cli.py``.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from model_cdn import AdminApiError
from model_cdn.admin_client import AdminClient
from model_cdn.registry import DeviceRecord, Registry, open_registry
from shared import (
    MqttSettings,
    SigningKey,
    Topics,
    UpdateState,
    UpdateStatus,
    create_client,
    format_time,
    verify_assignment,
)
from shared.server.store import LocalBlobStore

from ._brokers import MosquittoProcess, free_port
from ._cdn import make_manifest_doc, serve_in_thread
from ._cli import one_error_line, tandem, tandem_env

TOKEN = "t0ken-for-tests"


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of the first rich table's body rows (the lines after its ─── rule)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "───" in line)
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


@dataclass
class Cdn:
    url: str
    registry: Registry
    key: SigningKey
    mqtt_url: str
    topics: Topics

    def run(
        self, *args: str, cwd: Path, token: str | None = TOKEN
    ) -> subprocess.CompletedProcess[str]:
        auth = ["--token", token] if token is not None else []
        return tandem(*args, "--cdn", self.url, *auth, cwd=cwd)

    def report(
        self,
        device: str,
        model: str,
        version: int,
        rollout: str,
        state: UpdateState = UpdateState.INSTALLED,
        running_version: int | None = None,
    ) -> None:
        """Publish a device's update report, as the updater does."""
        status = UpdateStatus(
            device=device,
            model=model,
            version=version,
            state=state,
            at=format_time(datetime.now(UTC)),
            running_version=version if running_version is None else running_version,
            rollout=rollout,
        )
        settings = MqttSettings.from_url(self.mqtt_url)
        client = create_client(settings, f"test-dev-{uuid.uuid4().hex[:8]}", protocol="3.1.1")
        client.connect("127.0.0.1", settings.port)
        client.loop_start()
        try:
            client.publish(self.topics.status(device), status.to_json(), qos=1).wait_for_publish(
                timeout=15
            )
        finally:
            client.disconnect()
            client.loop_stop()


DEVICES = {
    "cam-1": "factory-a",
    "cam-2": "factory-a",
    "cam-3": "factory-a",
    "cam-4": "factory-a",
    "cam-5": "factory-b",
}


@pytest.fixture
def cdn(tmp_path: Path, mosquitto: MosquittoProcess) -> Iterator[Cdn]:
    from model_cdn import FleetService, create_app

    key = SigningKey.generate()
    registry = open_registry(tmp_path / "registry.db")
    for version in (1, 2, 3):
        registry.add_version(make_manifest_doc(key, "mnist", version))
    registry.add_version(make_manifest_doc(key, "kws", 1))
    now = time.time()
    registry.upsert_devices(
        DeviceRecord(
            device=device,
            labels={"site": site, "hw": "npu"},
            capabilities={"runtime": "onnxruntime"},
            models={"mnist": 2},
            first_seen=now - 3600,
            last_seen=now,
            telemetry=None,
        )
        for device, site in DEVICES.items()
    )
    topics = Topics(f"test-{uuid.uuid4().hex[:8]}")
    service = FleetService(
        registry, key, MqttSettings.from_url(mosquitto.url), topics, tick_s=0.05, flush_s=0.1
    )
    app = create_app(
        registry=registry,
        store=LocalBlobStore(tmp_path / "blobs"),
        admin_token=TOKEN,
        controller=service.controller,
    )
    try:
        with service, serve_in_thread(app) as url:
            yield Cdn(url, registry, key, mosquitto.url, topics)
    finally:
        registry.close()


def rollouts_on(cdn: Cdn, tmp_path: Path) -> list[dict[str, object]]:
    listed = cdn.run("rollout", "list", "--all", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rollouts: list[dict[str, object]] = json.loads(listed.stdout)["rollouts"]
    return rollouts


@pytest.mark.slow
def test_a_rollout_the_cdn_refuses_is_one_line_and_changes_nothing(
    cdn: Cdn, tmp_path: Path
) -> None:
    base = ["rollout", "start"]
    unknown = cdn.run(*base, "nope@1", "--waves", "100%", cwd=tmp_path)
    one_error_line(unknown, 1, "rollout start:", "nope")
    missing = cdn.run(*base, "mnist@9", "--waves", "100%", cwd=tmp_path)
    one_error_line(missing, 1, "mnist@9")
    no_fallback = cdn.run(*base, "kws@1", "--waves", "100%", cwd=tmp_path)
    one_error_line(no_fallback, 1, "no version below 1")
    empty_wave = cdn.run(
        *base, "mnist@3", "--target", "site=factory-b", "--waves", "10%,100%", cwd=tmp_path
    )
    one_error_line(empty_wave, 1, "0 devices")
    nobody = cdn.run(*base, "mnist@3", "--target", "site=mars", "--waves", "100%", cwd=tmp_path)
    one_error_line(nobody, 1, "no device")
    no_token = cdn.run(*base, "mnist@3", "--waves", "100%", cwd=tmp_path, token=None)
    one_error_line(no_token, 1, "TANDEM_CDN_ADMIN_TOKEN")
    wrong = cdn.run(*base, "mnist@3", "--waves", "100%", cwd=tmp_path, token="wrong")
    assert wrong.returncode == 1 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert rollouts_on(cdn, tmp_path) == []
    assert cdn.registry.list_rollouts() == []
    for device in DEVICES:
        assert cdn.registry.get_assignment(device, "mnist") is None
    unknown_id = cdn.run("rollout", "status", "ro-000000000000", cwd=tmp_path)
    one_error_line(unknown_id, 1, "ro-000000000000")
    quiet = cdn.run("rollout", "status", cwd=tmp_path)
    assert quiet.returncode == 0 and "no rollouts yet" in quiet.stdout, quiet.stderr


@pytest.mark.slow
def test_start_status_pause_resume_abort_and_list(cdn: Cdn, tmp_path: Path) -> None:
    started = cdn.run(
        "rollout",
        "start",
        "mnist@3",
        "--target",
        "site=factory-a",
        "--waves",
        "1,100%",
        "--max-failure",
        "2%",
        "--soak",
        "1h",
        "--json",
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr
    status = json.loads(started.stdout)
    rid = status["id"]
    assert (status["state"], status["previous_version"], status["waves_total"]) == ("running", 2, 2)
    assert status["target"] == {"site": "factory-a"}
    assert status["spec"]["max_failure_rate"] == pytest.approx(0.02)
    assert status["spec"]["soak_s"] == 3600
    # the first wave's one device really was assigned mnist@3, signed, by the controller
    assigned = [d for d in DEVICES if cdn.registry.get_assignment(d, "mnist") is not None]
    assert len(assigned) == 1 and DEVICES[assigned[0]] == "factory-a"
    doc = cdn.registry.get_assignment(assigned[0], "mnist")
    assert verify_assignment(doc, [cdn.key.public_key]).version == 3

    shown = cdn.run("rollout", "status", rid, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert rid in shown.stdout and "state: running, wave 1 of 2 " in shown.stdout
    waves = table_rows(shown.stdout)
    # wave, planned, installed, failed, timed out, in progress, phase
    assert waves[0] == ["1", "(1)", "1", "0", "0", "0", "1", "current"]
    assert waves[1] == ["2", "(all)", "3", "0", "0", "0", "0", "waiting"]
    newest = cdn.run("rollout", "status", "--json", cwd=tmp_path)
    assert json.loads(newest.stdout)["id"] == rid

    busy = cdn.run("rollout", "start", "mnist@3", "--waves", "100%", cwd=tmp_path)
    one_error_line(busy, 1, f"already has rollout {rid}")

    listed = cdn.run("rollout", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [row] = table_rows(listed.stdout)
    assert row[:6] == [rid, "mnist", "2", "3", "running", "1/2"]

    paused = cdn.run("rollout", "pause", rid, cwd=tmp_path)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.strip() == f"{rid}: paused (paused by operator)"
    watched = cdn.run("rollout", "status", rid, "--watch", cwd=tmp_path)
    one_error_line(watched, 4, f"{rid} is paused: paused by operator")

    resumed = cdn.run("rollout", "resume", rid, cwd=tmp_path)
    assert resumed.returncode == 0 and f"{rid}: running" in resumed.stdout, resumed.stderr

    aborted = cdn.run("rollout", "abort", rid, cwd=tmp_path)
    assert aborted.returncode == 0 and f"{rid}: aborted" in aborted.stdout, aborted.stderr
    watched = cdn.run("rollout", "status", rid, "--watch", cwd=tmp_path)
    one_error_line(watched, 3, f"{rid} is aborted")
    again = cdn.run("rollout", "pause", rid, cwd=tmp_path)
    one_error_line(again, 1, "cannot pause a rollout that is aborted")

    active = cdn.run("rollout", "list", cwd=tmp_path)
    assert active.returncode == 0 and "no active rollouts" in active.stdout
    [record] = rollouts_on(cdn, tmp_path)
    assert (record["id"], record["state"]) == (rid, "aborted")
    none_active = cdn.run("rollout", "status", cwd=tmp_path)
    assert "no active rollout" in none_active.stdout and rid in none_active.stdout


@pytest.mark.slow
def test_watch_follows_a_rollout_to_completion_then_rollback(cdn: Cdn, tmp_path: Path) -> None:
    started = cdn.run(
        "rollout",
        "start",
        "mnist@3",
        "--target",
        "site=factory-b",
        "--waves",
        "100%",
        "--soak",
        "0",
        "--json",
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr
    rid = json.loads(started.stdout)["id"]
    cdn.report("cam-5", "mnist", 3, rid)
    watched = cdn.run("rollout", "status", rid, "--watch", "--interval", "0.1s", cwd=tmp_path)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert watched.stdout.strip().endswith(f"{rid} completed")
    assert "wave 1 (all)" in watched.stdout and "1/1" in watched.stdout

    rolled = cdn.run("rollout", "rollback", rid, cwd=tmp_path)
    assert rolled.returncode == 0 and f"{rid}: rolling_back" in rolled.stdout, rolled.stderr
    doc = cdn.registry.get_assignment("cam-5", "mnist")
    got = verify_assignment(doc, [cdn.key.public_key])
    assert (got.version, got.rollback) == (2, True)


@pytest.mark.slow
def test_watch_exits_3_when_a_rollout_halts_and_0_once_resumed_to_completion(
    cdn: Cdn, tmp_path: Path
) -> None:
    started = cdn.run(
        "rollout",
        "start",
        "mnist@3",
        "--target",
        "site=factory-b",
        "--waves",
        "100%",
        "--soak",
        "0s",
        "--max-failure",
        "0",
        "--json",
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr
    rid = json.loads(started.stdout)["id"]
    cdn.report("cam-5", "mnist", 3, rid, UpdateState.FAILED, running_version=2)
    halted = cdn.run("rollout", "status", rid, "--watch", "--interval", "0.1s", cwd=tmp_path)
    one_error_line(halted, 3, f"{rid} is halted: failure rate 1/1 = 100% above max 0%")
    assert "with 1 device, 1 failure halts it" in halted.stderr
    shown = cdn.run("rollout", "status", rid, cwd=tmp_path)
    assert "state: halted, wave 1 of 1 (failure rate 1/1 = 100% above max 0%" in shown.stdout
    assert table_rows(shown.stdout)[0] == ["1", "(all)", "1", "0", "1", "0", "0", "current"]
    resumed = cdn.run("rollout", "resume", rid, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    done = cdn.run("rollout", "status", rid, "--watch", "--interval", "0.1s", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(f"{rid} completed")


@pytest.mark.slow
def test_ctrl_c_stops_watching_cleanly_and_the_rollout_goes_on(cdn: Cdn, tmp_path: Path) -> None:
    started = cdn.run("rollout", "start", "mnist@3", "--waves", "1,100%", "--json", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    rid = json.loads(started.stdout)["id"]
    env = tandem_env()
    env.update(COLUMNS="120", TANDEM_CDN_URL=cdn.url)
    env["TANDEM_CDN_ADMIN_TOKEN"] = TOKEN
    controller, terminal = pty.openpty()  # a terminal, so the live display draws at once
    watcher = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "rollout", "status", rid, "--watch"],
        # Ctrl-C as in a shell: a child inherits an ignored SIGINT (as a test worker's may
        # be), and Python then installs no KeyboardInterrupt handler.
        preexec_fn=_default_sigint,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        cwd=tmp_path,
        env=env,
    )
    os.close(terminal)
    screen = b""
    try:
        while b"wave 2 (all)" not in screen:
            ready, _, _ = select.select([controller], [], [], 60)
            assert ready, screen.decode(errors="replace")
            screen += os.read(controller, 65536)
        watcher.send_signal(signal.SIGINT)
        # Keep reading while it stops: a terminal nobody reads fills up, and the
        # watcher's last lines would then block it forever (seen under load).
        deadline = time.monotonic() + 60
        while watcher.poll() is None and time.monotonic() < deadline:
            screen += _drain(controller, 0.2)
        assert watcher.wait(timeout=1) == 130
        screen += _drain(controller, 1)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        os.close(controller)
    text = screen.decode(errors="replace")
    assert f"stopped watching {rid}; the rollout itself goes on" in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    still = cdn.run("rollout", "status", rid, "--json", cwd=tmp_path)
    assert json.loads(still.stdout)["state"] == "running"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _drain(terminal: int, wait_s: float) -> bytes:
    """What the terminal has to read now, waiting up to ``wait_s`` for the first bytes."""
    got = b""
    while select.select([terminal], [], [], wait_s)[0]:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        got += chunk
        wait_s = 0
    return got


def test_admin_client_errors_carry_the_status_and_the_servers_line(cdn: Cdn) -> None:
    client = AdminClient(cdn.url, token=TOKEN)
    with pytest.raises(AdminApiError) as refused:
        client.start_rollout({"model": "mnist", "version": 3, "waves": "5%,nope"})
    assert refused.value.status == 400 and "nope" in str(refused.value)
    with pytest.raises(AdminApiError) as unknown:
        client.get_rollout("../../models")  # one path segment: never another route
    assert unknown.value.status == 404
    status = client.start_rollout({"model": "mnist", "version": 3, "waves": "100%"})
    assert client.get_rollout(status["id"])["state"] == "running"
    assert [r["id"] for r in client.list_rollouts()] == [status["id"]]
    with pytest.raises(AdminApiError) as busy:
        client.start_rollout({"model": "mnist", "version": 3, "waves": "100%"})
    assert busy.value.status == 409
    assert client.abort(status["id"])["state"] == "aborted"
    with pytest.raises(AdminApiError) as late:
        client.resume(status["id"])
    assert late.value.status == 409 and "aborted" in str(late.value)
    site_b = client.list_devices({"site": "factory-b"}, "mnist")
    assert [d["device"] for d in site_b] == ["cam-5"]
    assert client.get_device("cam-5")["labels"] == {"site": "factory-b", "hw": "npu"}
    with pytest.raises(AdminApiError) as nobody:
        client.get_device("cam-9")
    assert nobody.value.status == 404
    with pytest.raises(AdminApiError) as anonymous:
        AdminClient(cdn.url).list_rollouts()
    assert anonymous.value.status == 401
    with pytest.raises(AdminApiError) as down:
        AdminClient(f"http://127.0.0.1:{free_port()}", token=TOKEN).list_rollouts()
    assert down.value.status is None and "connection refused" in str(down.value)


@pytest.mark.slow
def test_fleet_list_and_show_ask_the_cdn(cdn: Cdn, tmp_path: Path) -> None:
    listed = cdn.run("fleet", "list", "--label", "site=factory-a", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = table_rows(listed.stdout)
    assert [row[0] for row in rows] == ["cam-1", "cam-2", "cam-3", "cam-4"]
    # device, labels, models, last seen (n unit ago), online, offloads, agreement
    assert rows[0][1:3] == ["hw=npu,site=factory-a", "mnist@2"]
    assert rows[0][-3:] == ["yes", "—", "—"]
    as_json = cdn.run("fleet", "list", "--model", "mnist", "--version", "2", "--json", cwd=tmp_path)
    devices = json.loads(as_json.stdout)["devices"]
    assert sorted(d["device"] for d in devices) == sorted(DEVICES)
    none = cdn.run("fleet", "list", "--model", "kws", cwd=tmp_path)
    assert none.returncode == 0 and "no devices match" in none.stdout
    shown = cdn.run("fleet", "show", "cam-5", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for text in ("cam-5", "hw=npu,site=factory-b", "runtime=onnxruntime", "mnist@2", "none yet"):
        assert text in shown.stdout, text
    missing = cdn.run("fleet", "show", "cam-9", cwd=tmp_path)
    one_error_line(missing, 1, "cam-9")
    unauthorised = cdn.run("fleet", "list", cwd=tmp_path, token=None)
    one_error_line(unauthorised, 1, "--token")


def test_start_tells_what_a_plan_can_decide_and_skip_gate_asks_and_is_recorded(
    cdn: Cdn, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from tandem.cli import app

    gated = ("rollout", "start", "mnist@3", "--target", "site=factory-a", "--waves", "1,100%")
    gated += ("--soak", "1h", "--max-agreement-drop", "2%")
    refused = cdn.run(*gated, cwd=tmp_path)  # 1 device against 1 control cannot decide
    one_error_line(refused, 1, "wave 1: 1 devices vs 1 controls")
    assert "--accept-inconclusive" in refused.stderr and rollouts_on(cdn, tmp_path) == []
    dry = cdn.run(*gated, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "wave 1: 1 devices vs 1 controls; 1 failure(s) halt it" in dry.stdout
    assert "CANNOT DECIDE" in dry.stdout and "dry run: nothing started" in dry.stdout
    assert rollouts_on(cdn, tmp_path) == []
    started = cdn.run(*gated, "--accept-inconclusive", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert "plan (what each wave can decide)" in started.stdout
    [record] = rollouts_on(cdn, tmp_path)
    rid = str(record["id"])

    no_reason = cdn.run("rollout", "skip-gate", rid, cwd=tmp_path)
    one_error_line(no_reason, 2, "--reason is required")
    args = ["rollout", "skip-gate", rid, "--reason", "known label fix", "--cdn", cdn.url]
    declined = CliRunner().invoke(app, [*args, "--token", TOKEN], input="n\n")
    assert declined.exit_code == 1, declined.output
    assert "skip the health gate of wave 1" in declined.output
    assert "not confirmed: nothing changed" in declined.output
    assert [
        e["action"]
        for e in json.loads(cdn.run("rollout", "status", rid, "--json", cwd=tmp_path).stdout)[
            "history"
        ]
    ] == ["start"]
    skipped = cdn.run(*args[:-2], "--yes", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr
    assert "gate of wave 1 skipped by admin token: known label fix" in skipped.stdout
    shown = cdn.run("rollout", "status", rid, cwd=tmp_path)
    assert "history:" in shown.stdout
    assert "skip-gate wave 1 by admin token: known label fix" in shown.stdout
