"""``tandem demo --drift``: the rich front end of ``tandem.demo.drift.run_drift_demo``.

Runs the loop behind one progress bar per stage, writes
``OUTPUT/learning_loop.png`` and ``OUTPUT/learning_loop.json``, and prints
the phases, both models' figures and the targets, each met or not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from ..demo.drift import DriftConfig, DriftReport

__all__ = ["run_drift", "write_drift_outputs"]


def run_drift(config: DriftConfig, output: Path, console: Console) -> DriftReport:
    from ..demo.drift import run_drift_demo
    from ._stage_bars import stage_bars

    with stage_bars(console, width=34) as bar:

        def progress(stage: str, fraction: float) -> None:
            bar("refine: publish" if stage.startswith("refine: publish") else stage, fraction)

        report = run_drift_demo(config, progress)
    files = write_drift_outputs(report, output)
    render(report, console)
    console.print(f"plot: {files[0]}   report: {files[1]}   took {report.seconds['total']:.1f} s")
    return report


def write_drift_outputs(report: DriftReport, output: Path) -> tuple[Path, Path]:
    from ..demo.drift import plot_learning_loop

    output.mkdir(parents=True, exist_ok=True)
    version = f"mnist-edge@{report.refine.version}"
    png = plot_learning_loop(
        report.timeline,
        version,
        output / "learning_loop.png",
        title=f"One learning loop on {report.config.devices} devices, digits "
        f"{report.config.drift.describe()}, {report.config.budget:.0%} offload budget",
    )
    path = output / "learning_loop.json"
    path.write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    return png, path


def render(report: DriftReport, console: Console) -> None:
    from rich.table import Table

    phases = Table(
        title=f"{report.config.devices} devices, drift: {report.config.drift.describe()}"
    )
    for column in ("phase", "requests", "accuracy", "offloaded", "seconds"):
        phases.add_column(column, justify="left" if column == "phase" else "right")
    for name, start, end in report.timeline.phases:
        answers = report.timeline.of(name)
        phases.add_row(
            name,
            str(len(answers)),
            f"{report.timeline.accuracy(name):.2%}" if answers else "-",
            f"{report.timeline.offload_rate(name):.1%}" if answers else "-",
            f"{end - start:.1f}",
        )
    console.print(phases)
    refine, collected = report.refine, report.collected
    console.print(
        f"collected {collected['rows']} examples in {collected['shards']} shards from "
        f"{collected['devices']} devices ({collected['reasons']}); refined "
        f"{refine.model}@{refine.current_version} -> @{refine.version}: agrees with the cloud on "
        f"{refine.candidate.held_out_agreement:.1%} of {refine.held_out} held-out examples "
        f"(was {refine.current.held_out_agreement:.1%}); rollout {report.rollout.get('id')} "
        f"{report.rollout.get('state')}"
    )
    edge = Table(title="edge-only accuracy (INT8, as devices run it) and collaborative at "
                 f"exactly {report.config.budget:.0%}")  # fmt: skip
    for column in ("model", "original digits", "drifted digits", "collaborative, drifted"):
        edge.add_column(column, justify="left" if column == "model" else "right")
    for v in ("v1", "v2"):
        edge.add_row(
            f"mnist-edge@{v[1:]}",
            f"{report.edge_only[v]['original']:.2%}",
            f"{report.edge_only[v]['drifted']:.2%}",
            f"{report.exact[f'drifted {v}']:.2%}",
        )
    console.print(edge)
    targets = Table(title="targets")
    for column in ("target", "wanted", "measured", "verdict"):
        targets.add_column(column)
    for t in report.targets():
        verdict = "[green]met[/green]" if t["met"] else "[red]not met[/red]"
        targets.add_row(t["name"], t["target"], t["measured"], verdict)
    console.print(targets)
