"""The main job, end to end: `tandem demo` as a user runs it, on the embedded broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared import digest
from tandem.demo import DemoConfig
from tandem.demo.models import build_demo_models

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_collaboration_beats_edge_within_the_budget(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    run = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "demo", "--output", str(out), "--devices", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    modes = {m["name"]: m for m in report["modes"]}
    edge, cloud, collab = modes["edge-only"], modes["cloud-only"], modes["collaborative"]
    assert edge["offload_rate"] == 0 and cloud["offload_rate"] == 1
    assert cloud["accuracy"] > edge["accuracy"]  # the gap collaboration can recover
    assert collab["accuracy"] > edge["accuracy"]
    assert abs(collab["offload_rate"] - report["budget"]) <= 0.03
    assert sum(collab["sources"].values()) == 1500  # every digit answered
    assert (out / "accuracy_vs_offload.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "collaborative" in run.stdout
    _assert_the_edge_model_came_through_the_cdn(report, run.stdout)


def _assert_the_edge_model_came_through_the_cdn(report: dict[str, Any], stdout: str) -> None:
    """Every device installed the published version, and every answer ran that version."""
    delivery = report["delivery"]
    published = f"{delivery['model']}@{delivery['version']}"
    assert [d["device"] for d in delivery["devices"]] == [f"demo-{i:03d}" for i in range(4)]
    for device in delivery["devices"]:
        assert device["state"] == "installed"
        assert device["version"] == delivery["version"]
        assert device["manifest_digest"] == delivery["manifest_digest"]
        assert device["downloaded_bytes"] == delivery["blob_bytes"] > 0
    for mode in report["modes"]:  # the edge model each request's device held
        assert mode["edge_versions"] == {published: 1500}, mode["name"]
    # the INT8 model the demo reports on is the one the pipeline published (one quantizer)
    assert delivery["model_digest"] == digest(build_demo_models().edge_int8_onnx.read_bytes())
    text = " ".join(stdout.split())  # rich wraps lines at the terminal's width
    assert f"published {published}" in text and "4/4 devices installed" in text


def test_demo_settings_are_checked() -> None:
    DemoConfig(devices=1, budget=0.0, limit=1)
    for bad in ({"devices": 0}, {"budget": 1.5}, {"deadline_ms": 0.0}, {"limit": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DemoConfig(**bad)  # type: ignore[arg-type]


def test_demo_rejects_an_unknown_score(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "demo", "--score", "vibes", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "margin" in run.stdout + run.stderr
    assert not (tmp_path / "report.json").exists()
