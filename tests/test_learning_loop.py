"""One learning loop, end to end, as a user runs it: ``tandem demo --drift`` on its default fleet.

Real parts throughout: Mosquitto, the hub collecting what the devices share,
the CDN with its rollout service, devices (``EdgeAgent`` + ``ModelUpdater`` +
``TelemetryReporter``) that install v1 from the CDN, the refine job, and a
staged rollout of v2 with the agreement gate. The figures the issue targets
are measured by the bench (``python -m bench learning-loop``); this test
holds what must be true of any run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tandem.demo.drift import MIN_DRIFT_DEVICES

from ._cli import tandem

ROOT = Path(__file__).resolve().parents[1]
V1, V2 = "mnist-edge@1", "mnist-edge@2"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_loop_collects_refines_publishes_and_rolls_out_a_better_edge_model(
    tmp_path: Path, mosquitto: Any
) -> None:
    out = tmp_path / "loop"
    run = subprocess.run(
        # 8 devices, the default: smaller cohorts often leave the rollout's gate undecided
        [sys.executable, "-m", "tandem.cli", "demo", "--drift", "--devices", "8",
         "--broker", mosquitto.url, "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((out / "learning_loop.json").read_text())
    phases = report["phases"]

    # Every digit of every measured phase was answered, by the version that phase is about.
    for name, version in (("original", V1), ("drifted v1", V1), ("drifted v2", V2)):
        assert phases[name]["requests"] == 1500, name
        assert phases[name]["edge_versions"] == {version: 1500}, name
    assert set(phases["rollout"]["edge_versions"]) == {V1, V2}  # both served while it ran

    # What the hub kept: the edge's mistakes on the drifted digits, and a sample, from all.
    collected = report["collected"]
    assert collected["devices"] == 8
    assert collected["reasons"]["disagree"] > collected["reasons"].get("sample", 0) > 0
    assert collected["rows"] == report["refine"]["examples"]["collected"]

    # The refined model was judged better, published as v2 and rolled out to every device.
    refine = report["refine"]
    assert refine["version"] == 2 and refine["refused"] is False
    assert refine["candidate"]["held_out_agreement"] > refine["current"]["held_out_agreement"]
    assert report["rollout"]["state"] == "completed"

    # It answers the drifted digits better, alone and with the cloud at the same budget.
    edge = report["edge_only"]
    assert edge["v2"]["drifted"] > edge["v1"]["drifted"]
    assert edge["v2"]["original"] >= edge["v1"]["original"] - 0.01
    exact = report["collaborative_exact"]
    assert exact["drifted v2"] > exact["drifted v1"]
    assert phases["drifted v2"]["accuracy"] > phases["drifted v1"]["accuracy"]
    assert (out / "learning_loop.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "targets" in run.stdout


def test_too_small_a_fleet_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    run = tandem("demo", "--drift", "--devices", "4", "--output", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    said = " ".join((run.stdout + run.stderr).split())  # rich wraps the line
    assert f"needs >= {MIN_DRIFT_DEVICES} devices (got 4)" in said
    assert not out.exists()  # nothing ran, nothing written
