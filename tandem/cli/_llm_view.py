"""``tandem demo --llm``: progress, the per-preset table and the files, for a terminal."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from ..demo.language import LlmDemoConfig, LlmDemoReport

__all__ = ["run_llm"]


def run_llm(
    prompts: int,
    max_tokens: int,
    deadline_ms: float | None,
    broker: str | None,
    cache_dir: Path | None,
    output: Path,
    console: Console,
) -> None:
    """Run the language demo, render it, write its files; one-line errors, exit status 1."""
    from ..broker import BrokerStartError
    from ..demo import DemoError
    from ..demo.language import LlmDemoConfig, write_llm_outputs

    try:
        config = LlmDemoConfig(
            prompts=prompts,
            max_tokens=max_tokens,
            deadline_ms=deadline_ms,
            broker_url=broker,
            cache_dir=cache_dir,
        )
        console.print(
            "language models: loaded from the cache, or trained on this machine first "
            "(a few minutes on the first run)"
        )
        report = _run_with_progress(config, console)
        files = write_llm_outputs(report, output)
    except (DemoError, BrokerStartError, ValueError, OSError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from e
    render_llm(report, console)
    console.print(f"plot: {files.plot}   report: {files.report}   took {report.elapsed_s:.1f} s")


def _run_with_progress(config: LlmDemoConfig, console: Console) -> LlmDemoReport:
    from ..demo.language import run_llm_demo
    from ._stage_bars import stage_bars

    with stage_bars(console, width=30) as progress:
        return run_llm_demo(config, progress)


def render_llm(report: LlmDemoReport, console: Console) -> None:
    """The table (one row per preset) and what its columns mean."""
    from rich.table import Table

    table = Table(
        title=f"{len(report.prompts)} held-out prompts x {report.max_tokens} tokens, "
        f"broker: {report.broker}"
    )
    columns = (
        "preset", "agree", "tok e/c", "turns e/c/b", "heavy", "late", "TTFT ms", "tok/s",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "preset" else "right", no_wrap=True)
    for p in report.presets:
        table.add_row(
            p.preset,
            f"{p.agreement:.1%}",
            f"{p.edge_tokens}/{p.cloud_tokens}",
            f"{p.edge_turns}/{p.cloud_turns}/{p.both_turns}",
            str(p.heavy_turns),
            str(p.deadline_turns),
            f"{_ms(p.ttft_p50_ms)}/{_ms(p.ttft_p99_ms)}",
            f"{_rate(p.tokens_per_s_p50)}/{_rate(p.tokens_per_s_p99)}",
        )
    console.print(table)
    how = (
        "auto: 40th percentile of the prompts' predicted times" if report.deadline_auto else "given"
    )
    rates = report.device_rates
    console.print(
        f"agreement: {report.quality_measure}.\n"
        f"prefer_edge's deadline {report.deadline_ms:.2f} ms ({how}; device measured "
        f"{rates['prefill']:,.0f} prompt tok/s, {rates['decode']:,.0f} decode tok/s): "
        "heavy = predicted to miss it, sent to the hub; late = ended at the deadline. "
        "edge_only and cloud_only run without a deadline. e/c/b: edge/cloud/both; "
        "TTFT and tok/s: p50/p99 (tok/s p99 is the slow tail)."
    )


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"
