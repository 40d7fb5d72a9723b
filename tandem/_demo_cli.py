"""``tandem demo``: the rich front end of ``tandem.demo.run_demo``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["demo"]


def demo(
    devices: Annotated[
        int, typer.Option(min=1, max=256, help="Edge agents in the simulated fleet.")
    ] = 8,
    budget: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Share of requests the collaborative mode may offload."
        ),
    ] = 0.20,
    score: Annotated[
        str, typer.Option(help="Uncertainty score: margin, max_probability or entropy.")
    ] = "margin",
    deadline_ms: Annotated[float, typer.Option(min=1.0, help="Deadline of each request.")] = 250.0,
    broker: Annotated[
        str | None,
        typer.Option(
            help="Use this MQTT broker (e.g. mqtt://127.0.0.1:1883) instead of the embedded one."
        ),
    ] = None,
    output: Annotated[Path, typer.Option(help="Where the plot and the JSON report go.")] = Path(
        "demo-output"
    ),
    limit: Annotated[
        int | None, typer.Option(min=1, help="Stream only the first N test digits.")
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(help="Model cache (default $TANDEM_CACHE or ~/.cache/tandem)."),
    ] = None,
) -> None:
    """Train (or load) an INT8 edge model and a cloud model on real MNIST digits, start a
    broker, a hub and a fleet of edge agents on this machine, stream the test digits
    through them as edge-only, cloud-only and collaborative, and compare.

    Writes OUTPUT/accuracy_vs_offload.png and OUTPUT/report.json.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from edge_agent import SCORES

    from ._plot import plot_accuracy_vs_offload
    from ._sweep import sweep
    from .demo import DemoConfig, run_demo

    if score not in SCORES:
        raise typer.BadParameter(f"use one of {', '.join(SCORES)}", param_hint="--score")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    config = DemoConfig(
        devices=devices,
        budget=budget,
        score=score,
        deadline_ms=deadline_ms,
        broker_url=broker,
        cache_dir=cache_dir,
        limit=limit,
    )
    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, fraction: float) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=1.0)
            bar.update(tasks[stage], completed=min(max(fraction, 0.0), 1.0))

        report = run_demo(config, progress)

    table = Table(
        title=f"{len(report.labels)} test digits, {devices} edge agents, broker: {report.broker}"
    )
    for column in (
        "mode",
        "accuracy",
        "offloaded",
        "p50 ms",
        "p99 ms",
        "fallbacks",
        "late",
    ):
        table.add_column(column, justify="left" if column == "mode" else "right", no_wrap=True)
    for m in report.modes:
        table.add_row(
            m.name,
            f"{m.accuracy:.2%}",
            f"{m.offload_rate:.1%}",
            f"{m.p50_ms:.2f}",
            f"{m.p99_ms:.2f}",
            str(m.fallbacks),
            str(m.deadline_misses),
        )
    console.print(table)

    curves = sweep(report.edge_logits, report.cloud_logits, report.labels)
    points = [(m.name, m.offload_rate, m.accuracy) for m in report.modes]
    png = plot_accuracy_vs_offload(
        curves, points, output / "accuracy_vs_offload.png", budget=budget
    )
    edge, cloud, collab = report.modes
    gap = cloud.accuracy - edge.accuracy
    recovered = (collab.accuracy - edge.accuracy) / gap if gap > 0 else float("nan")
    summary = {
        "modes": [
            {k: v for k, v in vars(m).items() if k != "sources"} | {"sources": dict(m.sources)}
            for m in report.modes
        ],
        "budget": budget,
        "score": score,
        "calibrated_threshold": report.calibration_threshold,
        "gap_recovered": recovered,
        "models": report.model_report,
        "elapsed_s": report.elapsed_s,
    }
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.json").write_text(json.dumps(summary, indent=2, default=str))
    _write_publish_inputs(output, report.edge_float_onnx, report.cloud_onnx)
    console.print(
        f"collaborative: {collab.accuracy:.2%} accuracy at {collab.offload_rate:.1%} offloaded "
        f"(edge-only {edge.accuracy:.2%}, cloud-only {cloud.accuracy:.2%}; "
        f"{recovered:.0%} of the gap recovered at a {budget:.0%} budget)"
    )
    console.print(f"plot: {png}   report: {output / 'report.json'}   took {report.elapsed_s:.1f} s")


def _write_publish_inputs(output: Path, edge_float: Path, cloud: Path) -> None:
    """What `tandem models publish` needs to publish the demo's models (see the README)."""
    import shutil

    import numpy as np

    from ._data import load_digit_splits

    splits = load_digit_splits()
    np.savez(output / "calibration.npz", inputs=splits.calibration_images)
    np.savez(output / "validation.npz", inputs=splits.test_images, labels=splits.test_labels)
    shutil.copyfile(edge_float, output / "edge_float.onnx")
    shutil.copyfile(cloud, output / "cloud_float.onnx")
