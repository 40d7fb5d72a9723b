"""``tandem demo --llm``: progress, one table per mode (a row per preset) and the files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from ..demo.language import LlmDemoConfig, LlmDemoReport, PresetSummary

__all__ = ["LLM_MODES", "LLM_MODE_HELP", "LLM_PAIRS", "LLM_PAIR_HELP", "run_llm"]

# tandem.demo.language.MODES, named here so that the CLI's help does not import the demo
LLM_MODES = ("presets", "collaborative", "speculative", "all")
LLM_MODE_HELP = (
    "With --llm: presets = edge_only, cloud_only, prefer_edge (heavy turns to the hub); "
    "collaborative = edge_only, cloud_only, handoff (the device hands a turn to the hub "
    "mid-turn, the hub's share of tokens held to --budget); speculative = cloud_only vs "
    "speculative (the device drafts, the hub verifies: the same text, fewer hub passes); "
    "all = the three (the default; about 6 s on 2 cores from the cached pair, presets alone 1 s)."
)
LLM_BUDGET = 0.3
LLM_PAIRS = ("demo", "speculative")
LLM_PAIR_HELP = (
    "With --llm: the model pair. demo (the default) = the default pair; speculative = a heavy "
    "hub and a device model distilled from it (tandem.demo.language.SPECULATIVE_RECIPE, "
    "about 6 minutes to build once on 2 cores), a hub slow enough here for speculation to pay."
)


def run_llm(
    prompts: int,
    max_tokens: int,
    deadline_ms: float | None,
    broker: str | None,
    cache_dir: Path | None,
    output: Path,
    console: Console,
    *,
    mode: str = "presets",
    budget: float | None = None,
    pair: str = "demo",
) -> None:
    """Run the language demo, render it, write its files; one-line errors, exit status 1."""
    from ..broker import BrokerStartError
    from ..demo import DemoError
    from ..demo.language import SPECULATIVE_RECIPE, LlmDemoConfig, write_llm_outputs

    if mode not in LLM_MODES:
        raise typer.BadParameter(f"use one of {', '.join(LLM_MODES)}", param_hint="--mode")
    if pair not in LLM_PAIRS:
        raise typer.BadParameter(f"use one of {', '.join(LLM_PAIRS)}", param_hint="--pair")
    try:
        config = LlmDemoConfig(
            prompts=prompts,
            max_tokens=max_tokens,
            deadline_ms=deadline_ms,
            broker_url=broker,
            cache_dir=cache_dir,
            mode=mode,
            budget=LLM_BUDGET if budget is None else budget,
            recipe=SPECULATIVE_RECIPE if pair == "speculative" else None,
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
    plots = ", ".join(str(p) for p in files.plots)
    console.print(f"plots: {plots}   report: {files.report}   took {report.elapsed_s:.1f} s")


def _run_with_progress(config: LlmDemoConfig, console: Console) -> LlmDemoReport:
    from ..demo.language import run_llm_demo
    from ._stage_bars import stage_bars

    with stage_bars(console, width=30) as progress:
        return run_llm_demo(config, progress)


def render_llm(report: LlmDemoReport, console: Console) -> None:
    """Per mode shown: its table (a row per preset, the presets' columns), the figures the
    mode adds (a second table), and what they mean; then what the common columns mean."""
    for mode in report.modes:
        console.print(_table(report, mode))
        extra = _extra_table(report, mode)
        if extra is not None:
            console.print(extra)
        console.print(_legend(report, mode))
    console.print(
        f"agree: {report.quality_measure}. e/c/b: edge/cloud/both; "
        "TTFT and tok/s: p50/p99 (tok/s p99 is the slow tail)."
    )


_COLUMNS = ("preset", "agree", "tok e/c", "turns e/c/b", "heavy", "late", "TTFT ms", "tok/s")
_EXTRA = {
    "collaborative": ("preset", "agree hub", "hub share", "handed off"),
    "speculative": ("preset", "agree hub", "same text", "rounds", "acc/round", "hub fwd/tok",
                    "total ms"),
}  # fmt: skip


def _new_table(columns: tuple[str, ...], title: str | None = None) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column == "preset" else "right", no_wrap=True)
    return table


def _table(report: LlmDemoReport, mode: str) -> Any:
    table = _new_table(
        _COLUMNS,
        f"{mode}: {len(report.prompts)} held-out prompts x {report.max_tokens} tokens, "
        f"broker: {report.broker}",
    )
    for p in report.rows(mode):
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
    return table


def _extra_table(report: LlmDemoReport, mode: str) -> Any:
    """The figures ``mode`` adds, a row per preset (``None`` for the presets mode)."""
    if mode not in _EXTRA:
        return None
    table = _new_table(_EXTRA[mode])
    for p in report.rows(mode):
        if mode == "collaborative":
            share = p.cloud_tokens / p.tokens if p.tokens else math.nan
            cells = [_pct(p.hub_agreement), _pct(share), f"{p.handed_off_turns}/{p.turns}"]
        else:
            cells = [_pct(p.hub_agreement), *_spec_cells(report, p)]
        table.add_row(p.preset, *cells)
    return table


def _spec_cells(report: LlmDemoReport, row: PresetSummary) -> list[str]:
    total = f"{_ms(row.total_p50_ms)}/{_ms(row.total_p99_ms)}"
    s = report.speculative
    if row.preset != "speculative" or s is None:  # cloud_only: the reference, a pass a token
        return ["ref", "-", "-", "1.00", total]
    same = sum(s.identical)
    return [
        f"{'yes' if s.all_identical else 'NO'} {same}/{len(s.identical)}",
        str(s.rounds),
        f"{s.accepted_per_round:.2f}",
        f"{s.passes_per_token:.2f}",
        total,
    ]


def _legend(report: LlmDemoReport, mode: str) -> str:
    if mode == "presets":
        how = (
            "auto: 40th percentile of the prompts' predicted times"
            if report.deadline_auto
            else "given"
        )
        rates = report.device_rates
        return (
            f"prefer_edge's deadline {report.deadline_ms:.2f} ms ({how}; device "
            f"measured {rates['prefill']:,.0f} prompt tok/s, {rates['decode']:,.0f} decode "
            "tok/s): heavy = predicted to miss it, sent to the hub; late = ended at the "
            "deadline. edge_only and cloud_only run without a deadline."
        )
    if mode == "collaborative" and report.collaborative is not None:
        c = report.collaborative
        return (
            "agree hub: token agreement with cloud_only's text on the same prompt. handoff: "
            f"a {c.score} window of {c.window} tokens, its threshold calibrated on "
            f"{c.calibration_prompts} other held-out prompts to a hub token budget of "
            f"{c.budget:.0%}, then adapting: hub share spent {_pct(c.realized_share)}; gap "
            f"recovered {_pct(c.gap_recovered_hub)} (agree hub), "
            f"{_pct(c.gap_recovered_heldout)} (agree). No deadline in this mode."
        )
    if mode == "speculative" and report.speculative is not None:
        s = report.speculative
        counted = "verifier" if s.passes_source == "hub" else "rounds"
        return (
            "same text: speculative's greedy tokens equal cloud_only's (prompts alike / "
            f"prompts); acc/round: drafts accepted per round (k {s.mean_k:.1f} on average); "
            f"hub fwd/tok: the hub's forward passes per generated token (counted by its "
            f"{counted}; cloud_only takes one a token); total ms: a turn end to end, "
            f"p50/p99. No deadline in this mode.\n{s.verdict()}"
        )
    return ""


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"
