"""Part (e), fleet rollout: how long a 1,000-device simulated fleet takes to roll a version out.

Everything runs as shipped, on loopback: a Mosquitto (``BrokerProcess``),
``tandem cdn serve --broker … --sign-key … --admin-token …`` as a subprocess
(the rollout controller and the fleet registry inside it) on a copy of a
registry that already holds versions 1 and 2 of the model, and, in this
process, ``FleetSimulator`` with 1,000 devices, each its own MQTT
connection, downloading the signed manifest and blob from the CDN over HTTP
and reporting status and telemetry. Each run starts all three afresh.

The clock starts just before ``POST /v1/rollouts`` (waves 5%, 25%, 100%,
one second of soak each) and stops when ``GET /v1/rollouts/{id}`` says
``completed`` and the simulator has every device on version 2, nothing
installing. Polling the status every 0.2 s gives each wave's start and the
moment its last device reported installed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._procs import BrokerProcess, _Process, cpu_ns, mosquitto_version, wait_http_ok

if TYPE_CHECKING:
    from shared import SigningKey

__all__ = ["FLEET_DEVICES", "TARGET_ROLLOUT_S", "fleet_rollout", "rollout_section"]

TARGET_ROLLOUT_S = 60.0
FLEET_DEVICES = 1000
WAVES = "5%,25%,100%"
SOAK_S = 1.0
TELEMETRY_INTERVAL_S = 5.0
_RUNS = 3
_ADMIN_TOKEN = "bench-admin"
_POLL_S = 0.2
_FILES_NEEDED = 4 * FLEET_DEVICES + 512  # the broker's sockets and the simulator's, and spare


class CdnProcess(_Process):
    """``tandem cdn serve`` with the rollout controller, on a free port."""

    log_name = "cdn.log"

    def __init__(self, workdir: Path, *, registry: Path, store: Path, broker: str, key: Path):
        self.args = [
            "--registry",
            f"sqlite:///{registry}",
            "--store",
            str(store),
            "--broker",
            broker,
            "--sign-key",
            str(key),
            "--admin-token",
            _ADMIN_TOKEN,
            "--log-level",
            "warning",
        ]
        super().__init__(workdir)

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "tandem.cli", "cdn", "serve", "--port", str(port), *self.args]

    def _ready(self) -> None:
        wait_http_ok(self.port, "/healthz", 60.0, self)

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": f"Bearer {_ADMIN_TOKEN}"}
            data = None
            if body is not None:
                data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        finally:
            conn.close()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
        return dict(json.loads(payload))


def fleet_rollout(
    work: Path, *, registry: Path, store: Path, key: SigningKey, model: str, runs: int = _RUNS
) -> dict[str, Any]:
    """Time ``runs`` rollouts of ``model`` v1 -> v2 (both in ``registry`` and ``store``).

    ``key`` signed the manifests; the CDN signs assignments with it too, and
    the simulated devices trust it. Returns the runs, or ``{"skipped": why}``.
    """
    if mosquitto_version() is None:
        return {"skipped": "mosquitto is not installed (scripts/ensure-broker installs it)"}
    try:
        _raise_file_limit(_FILES_NEEDED)  # before the broker starts: it inherits the limit
    except (ValueError, OSError) as e:
        return {"skipped": f"{_FILES_NEEDED} open files are needed: {e}"}
    work.mkdir(parents=True, exist_ok=True)
    key_file = work / "publisher.key"
    key_file.write_text(key.to_text())
    key_file.chmod(0o600)
    measured = []
    for i in range(runs):
        run_dir = work / f"run-{i + 1}"
        run_dir.mkdir()
        db = run_dir / "registry.db"
        shutil.copyfile(registry, db)  # a fresh fleet registry and no rollout state each run
        measured.append(_one_rollout(run_dir, db, store, key, key_file, model))
    seconds = [r["seconds"] for r in measured]
    return {
        "devices": FLEET_DEVICES,
        "waves": WAVES,
        "soak_s": SOAK_S,
        "telemetry_interval_s": TELEMETRY_INTERVAL_S,
        "mosquitto": mosquitto_version(),
        "seconds": statistics.median(seconds),
        "runs": measured,
    }


def _one_rollout(
    work: Path, db: Path, store: Path, key: SigningKey, key_file: Path, model: str
) -> dict[str, Any]:
    from tandem.simulator import FleetSimulator, SimulatorConfig

    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(BrokerProcess(work).start())
        cdn = stack.enter_context(
            CdnProcess(work, registry=db, store=store, broker=broker.url, key=key_file).start()
        )
        config = SimulatorConfig(
            devices=FLEET_DEVICES,
            broker=broker.url,
            cdn_url=f"http://127.0.0.1:{cdn.port}",
            trusted_keys=(key.public_key,),
            model=model,
            initial_version=1,
            telemetry_interval_s=TELEMETRY_INTERVAL_S,
        )
        started = time.monotonic()
        fleet = stack.enter_context(FleetSimulator(config))
        fleet.wait_until(lambda f: f.online == FLEET_DEVICES, 180)
        online_s = time.monotonic() - started
        _wait(lambda: len(cdn.api("GET", "/v1/devices")["devices"]) >= FLEET_DEVICES, 120, cdn)
        known_s = time.monotonic() - started
        cpu_before = _cpu_s(broker, cdn)
        began = time.monotonic()
        body = {"model": model, "version": 2, "waves": WAVES, "soak_s": SOAK_S}
        rollout_id = cdn.api("POST", "/v1/rollouts", body)["id"]
        waves: dict[int, dict[str, float]] = {}
        slowest = 0.0
        while True:
            asked = time.monotonic() - began
            status = cdn.api("GET", f"/v1/rollouts/{rollout_id}")
            at = time.monotonic() - began  # when the answer came: a wave began before that
            slowest = max(slowest, at - asked)
            for w in status["waves"]:
                seen = waves.setdefault(int(w["index"]), {})
                if w["index"] <= status["wave"] or w["assigned"] or w["installed"]:
                    seen.setdefault("started_s", at)
                if w["planned"] and w["installed"] >= w["planned"]:
                    seen.setdefault("installed_s", at)
            if status["state"] != "running":
                break
            if at > 10 * TARGET_ROLLOUT_S:
                raise RuntimeError(f"the rollout did not end in {at:.0f} s: {status['counts']}")
            cdn.check_alive()
            time.sleep(_POLL_S)
        if status["state"] != "completed":
            raise RuntimeError(f"the rollout ended {status['state']}: {status['reason']}")
        completed_s = time.monotonic() - began
        fleet.wait_until(lambda f: f.versions.get(2, 0) == FLEET_DEVICES and f.installing == 0, 120)
        seconds = time.monotonic() - began
        cpu = {k: round(v - cpu_before[k], 2) for k, v in _cpu_s(broker, cdn).items()}
        snapshot = fleet.snapshot()
    return {
        "seconds": round(seconds, 2),
        "completed_s": round(completed_s, 2),
        "fleet_online_s": round(online_s, 2),
        "fleet_known_s": round(known_s, 2),
        "installed": status["counts"]["installed"],
        "waves": [
            {"index": w["index"], "planned": w["planned"], **_rounded(waves.get(w["index"], {}))}
            for w in status["waves"]
        ],
        "http_requests": snapshot.http_requests,
        "status_reports": snapshot.status_reports,
        "failures": snapshot.failures,
        "cpu_s": cpu,
        "slowest_status_s": round(slowest, 2),
    }


def _cpu_s(broker: _Process, cdn: _Process) -> dict[str, float]:
    """CPU seconds so far of the broker, the CDN server and this process (the fleet)."""
    return {
        "broker": cpu_ns(broker.pid) / 1e9,
        "cdn": cpu_ns(cdn.pid) / 1e9,
        "fleet": time.process_time(),
    }


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in d.items()}


def _wait(predicate: Callable[[], bool], timeout_s: float, process: _Process) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        process.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not there after {timeout_s:g} s")
        time.sleep(0.25)


def _raise_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ValueError(f"the hard limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


# --------------------------------------------------------------------------- result


def rollout_section(
    rollout: dict[str, Any], target: Callable[..., dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(targets, tables, notes) for the result; ``target`` builds one target row."""
    name = f"a {FLEET_DEVICES:,}-device simulated fleet finishes a full rollout"
    goal = f"<= {TARGET_ROLLOUT_S:.0f} s"
    if "skipped" in rollout:
        skipped = rollout["skipped"]
        return (
            [target(name, goal, f"skipped: {skipped}", None, "")],
            [],
            [f"Fleet rollout: skipped — {skipped}."],
        )
    runs = rollout["runs"]
    seconds = float(rollout["seconds"])
    soak = float(rollout["soak_s"])
    waves = len(runs[0]["waves"])
    name += f" (waves {rollout['waves']}, {soak:g} s soak; median of {len(runs)} fresh fleets)"
    spread = ", ".join(f"{r['seconds']:.1f}" for r in runs)
    targets = [
        target(
            name,
            goal,
            f"{seconds:.1f} s (runs: {spread} s)",
            seconds <= TARGET_ROLLOUT_S,
            f"the waves' soak ({waves} x {soak:g} s), and the CDN server and the simulated "
            "fleet sharing the box's CPU while the last wave installs",
        )
    ]
    rows = []
    for i, r in enumerate(runs, 1):
        for w in r["waves"]:
            rows.append(
                [
                    i,
                    w["index"] + 1,
                    w["planned"],
                    _s(w.get("started_s")),
                    _s(w.get("installed_s")),
                    _s(w["installed_s"] - w["started_s"]) if "installed_s" in w else "—",
                ]
            )
        rows.append([i, "all", r["installed"], "0.0", _s(r["completed_s"]), _s(r["seconds"])])
    tables = [
        {
            "title": f"Rollout to {FLEET_DEVICES:,} simulated devices, per wave (seconds from "
            "POST /v1/rollouts, as the status polls first showed it; 'all': completed per the "
            "API, then every device on v2)",
            "columns": ["run", "wave", "devices", "started", "all installed", "took"],
            "rows": rows,
        }
    ]
    first, cores = runs[0], os.cpu_count() or 1
    cpu = {k: statistics.median(r["cpu_s"][k] for r in runs) for k in first["cpu_s"]}
    busy = sum(cpu.values()) / (cores * seconds)
    notes = [
        f"Fleet rollout: Mosquitto {rollout['mosquitto']}, `tandem cdn serve` (a subprocess, "
        f"rollout controller on) and `FleetSimulator` with {FLEET_DEVICES:,} devices in the "
        "bench process (one MQTT connection each, one event-loop thread for all, 16 download "
        f"threads), telemetry every {rollout['telemetry_interval_s']:g} s, each install "
        "0.05-0.5 s after its download (the simulator's default stand-in for the smoke test). "
        "A fresh broker, server and fleet per run; bringing the fleet online took "
        f"{_s(first['fleet_online_s'])} s and the CDN listed every device after "
        f"{_s(first['fleet_known_s'])} s (run 1), not counted. Per run the devices made "
        f"{first['http_requests']:,} HTTP requests (manifest and blob each) and "
        f"{first['status_reports']:,} status reports. Wave times are when a poll of the status "
        f"(every {_POLL_S:g} s) first showed them; the slowest answer took "
        f"{max(r['slowest_status_s'] for r in runs):.1f} s, as the server was busy.",
        f"What the time goes to: a wave may start once its soak ({soak:g} s) has passed and one "
        "device of the previous wave reported, so the last wave's "
        f"{runs[0]['waves'][-1]['planned']:,} installs set the pace. CPU during the rollout "
        f"(median): CDN server {cpu['cdn']:.1f} s, fleet simulator {cpu['fleet']:.1f} s, "
        f"Mosquitto {cpu['broker']:.1f} s, {busy:.0%} of the box's {cores} cores over "
        f"{seconds:.1f} s: all three share them here, so the figure carries the simulator's "
        "own cost too.",
    ]
    return targets, tables, notes


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"
