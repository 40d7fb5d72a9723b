"""``tandem demo``: the rich front end of ``tandem.demo.run_demo``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._llm_view import LLM_MODE_HELP, LLM_PAIR_HELP

if TYPE_CHECKING:
    from rich.console import Console

    from ..demo import DemoConfig, DemoReport

__all__ = ["demo"]

# The longer options' types, kept out of demo's signature.
_Budget = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        max=1.0,
        help="Share of requests the collaborative mode may offload (default 0.20). With "
        "--llm --mode collaborative: the hub's share of generated tokens (default 0.30).",
        show_default=False,
    ),
]

_DeadlineMs = Annotated[
    float | None,
    typer.Option(
        min=0.001,
        help="Deadline of each request (default 250). With --llm: prefer_edge's deadline "
        "(default: the 40th percentile of the prompts' predicted times on this device).",
        show_default=False,
    ),
]

_Drift = Annotated[
    bool,
    typer.Option(
        "--drift",
        help="Instead: the inputs drift and one learning loop runs unattended (collect "
        "hard examples, refine, publish, roll out); writes OUTPUT/learning_loop.png.",
    ),
]

_Llm = Annotated[
    bool,
    typer.Option(
        "--llm",
        help="Instead: the language models (trained here on Python's own docs on the first "
        "run: a few minutes, then cached) on held-out prompts, as edge_only, cloud_only and "
        "prefer_edge (heavy turns to the hub), handoff under a budget and speculative "
        "decoding (--mode); writes OUTPUT/llm_<mode>.png (one per mode) and "
        "OUTPUT/llm_report.json.",
    ),
]


def demo(
    devices: Annotated[
        int, typer.Option(min=1, max=256, help="Edge agents in the simulated fleet.")
    ] = 8,
    budget: _Budget = None,
    score: Annotated[
        str, typer.Option(help="Uncertainty score: margin, max_probability or entropy.")
    ] = "margin",
    deadline_ms: _DeadlineMs = None,
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
    drift: _Drift = False,
    llm: _Llm = False,
    mode: Annotated[str | None, typer.Option(help=LLM_MODE_HELP, show_default=False)] = None,
    pair: Annotated[str | None, typer.Option(help=LLM_PAIR_HELP, show_default=False)] = None,
    prompts: Annotated[
        int, typer.Option(min=1, max=1000, help="With --llm: held-out prompts per preset.")
    ] = 24,
    max_tokens: Annotated[
        int, typer.Option(min=1, max=100, help="With --llm: tokens to generate per prompt.")
    ] = 24,
) -> None:
    """Train (or load) an edge model and a cloud model on real MNIST digits, start a broker,
    a model CDN, a hub and a fleet of edge agents on this machine, deliver the INT8 edge
    model to every agent through the CDN (published, signed, installed), stream the test
    digits through them as edge-only, cloud-only and collaborative, and compare.

    Writes OUTPUT/accuracy_vs_offload.png and OUTPUT/report.json. With --drift,
    the fleet's digits shift and one learning loop runs instead (OUTPUT/learning_loop.png).

    With --llm, a small device model (INT4) and a larger hub model, trained on
    pydoc_data.topics (nothing downloaded), continue held-out text. --mode presets:
    edge_only, cloud_only, and prefer_edge, where a prompt whose predicted prefill +
    decode time on this device would miss --deadline-ms goes to the hub; --mode
    collaborative hands turns to the hub mid-turn within a budget of hub tokens
    (--budget); --mode speculative lets the device draft and the hub verify (the hub's
    own text); --mode all (the default) runs the three. Quality is token agreement with
    the held-out continuation. --pair speculative uses a heavy hub, where speculation
    pays. Example:
    tandem demo --llm --mode speculative --prompts 12 --max-tokens 16 --output demo-llm
    """
    from rich.console import Console

    _check_options(score, llm, mode=mode, pair=pair)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    if llm:
        from ._llm_view import run_llm

        run_llm(prompts, max_tokens, deadline_ms, broker, cache_dir, output, console,
                mode=mode or "all", budget=budget, pair=pair or "demo")  # fmt: skip
        return
    budget = 0.20 if budget is None else budget
    if drift:
        _drift(devices, budget, score, broker, cache_dir, output, console)
        return
    tensor = dict(devices=devices, budget=budget, score=score, broker_url=broker,
                  cache_dir=cache_dir, limit=limit)  # fmt: skip
    _tensor_demo(tensor, 250.0 if deadline_ms is None else deadline_ms, output, console)


def _check_options(score: str, llm: bool, *, mode: str | None, pair: str | None) -> None:
    """``typer.BadParameter`` for an unknown score, or ``--mode``/``--pair`` without ``--llm``."""
    from edge_agent import SCORES

    if score not in SCORES:
        raise typer.BadParameter(f"use one of {', '.join(SCORES)}", param_hint="--score")
    for name, value in (("--mode", mode), ("--pair", pair)):
        if value is not None and not llm:
            raise typer.BadParameter("goes with --llm", param_hint=name)


def _tensor_demo(
    settings: dict[str, Any], deadline_ms: float, output: Path, console: Console
) -> None:
    """The default demo: the fleet's three modes, rendered and written to ``output``."""
    from ..demo import BrokerStartError, DemoConfig, DemoError, write_demo_outputs

    config = DemoConfig(deadline_ms=deadline_ms, **settings)

    try:
        report = _run_with_progress(config, console)
    except (DemoError, BrokerStartError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from e
    files = write_demo_outputs(report, output)
    _render(report, console)
    console.print(f"plot: {files.plot}   report: {files.report}   took {report.elapsed_s:.1f} s")


def _drift(
    devices: int,
    budget: float,
    score: str,
    broker: str | None,
    cache_dir: Path | None,
    output: Path,
    console: Console,
) -> None:
    from ..demo import BrokerStartError, DemoError
    from ..demo.drift import DriftConfig
    from ._drift_view import run_drift

    try:
        config = DriftConfig(
            devices=devices, budget=budget, score=score, broker_url=broker, cache_dir=cache_dir
        )
        run_drift(config, output, console)
    except (DemoError, BrokerStartError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from e


def _run_with_progress(config: DemoConfig, console: Console) -> DemoReport:
    """``run_demo`` with one progress bar per stage."""
    from ..demo import run_demo
    from ._stage_bars import stage_bars

    with stage_bars(console) as progress:
        return run_demo(config, progress)


def _render(report: DemoReport, console: Console) -> None:
    """The delivery line, the results table and the one-line verdict."""
    from rich.table import Table

    delivery = report.delivery
    installed = sum(d.state == "installed" for d in delivery.devices)
    console.print(
        f"CDN: published {delivery.label}, signed: {delivery.blob_bytes:,} bytes "
        f"(INT8 ONNX {delivery.model_bytes:,}, zstd)\n"
        f"     {installed}/{len(delivery.devices)} devices installed it: signature, digest "
        "and smoke test checked"
    )
    table = Table(
        title=f"{len(report.labels)} test digits, {len(delivery.devices)} edge agents, "
        f"broker: {report.broker}"
    )
    columns = ("mode", "accuracy", "offloaded", "p50 ms", "p99 ms", "fallbacks", "late")
    for column in columns:
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
    edge, cloud, collab = (report.mode(n) for n in ("edge-only", "cloud-only", "collaborative"))
    console.print(
        f"collaborative: {collab.accuracy:.2%} accuracy at {collab.offload_rate:.1%} offloaded "
        f"(edge-only {edge.accuracy:.2%}, cloud-only {cloud.accuracy:.2%}; "
        f"{report.gap_recovered:.0%} of the gap recovered at a {report.budget:.0%} budget)"
    )
