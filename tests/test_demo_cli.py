"""The main job, end to end: `tandem demo` as a user runs it, on the embedded broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
