"""``tandem rollout``: start, follow and steer staged rollouts through the CDN's admin API.

The commands talk HTTP to ``tandem cdn serve`` (``--cdn`` / ``TANDEM_CDN_URL``)
with the admin token (``--token`` / ``TANDEM_CDN_ADMIN_TOKEN``); the rollout
controller runs there. Everything typed is checked here first, so a bad
command line sends nothing. Failures are one line on stderr and exit 1 (the
CDN refused or could not be reached) or 2 (the command line was wrong);
``status --watch`` exits 3 when the rollout halts or is aborted and 4 when
it is paused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._admin import (
    DEFAULT_CDN,
    CaOption,
    CdnOption,
    JsonOption,
    TokenOption,
    admin_call,
    admin_client,
    check_id,
    parse_duration,
    parse_fraction,
    parse_ratio,
    print_json,
)
from ._common import fail
from ._rollout_request import start_request
from ._rollout_view import console, list_table, progress_line, render_progress, render_status

if TYPE_CHECKING:
    from rich.console import RenderableType

    from model_cdn import AdminClient

__all__ = ["rollout_app"]

ACTIVE = ("pending", "running", "paused", "halted", "rolling_back")
EXIT_HALTED = 3  # halted or aborted: scripts gate on it
EXIT_PAUSED = 4
_STOP_CODES = {
    "completed": 0,
    "rolled_back": 0,
    "halted": EXIT_HALTED,
    "aborted": EXIT_HALTED,
    "paused": EXIT_PAUSED,
}

rollout_app = typer.Typer(no_args_is_help=True, add_completion=False)


@rollout_app.callback()
def _rollout() -> None:
    """Staged, health-gated model rollouts: start (--dry-run), status (--watch), pause,
    resume, skip-gate, abort, rollback, list. Talks to 'tandem cdn serve' (--cdn, --token)."""


# -- following a rollout ---------------------------------------------------------


def _print(renderable: RenderableType, wide: bool = False) -> None:
    console(wide=wide).print(renderable)


_LOG_EVERY_S = 30.0  # a progress line at least this often in a log, even without change


def _watch(
    command: str, client: AdminClient, status: dict[str, Any], interval_s: float, wide: bool = False
) -> None:
    """Follow the rollout until it stops; exits 0 (completed, rolled back), 3 or 4.

    On a terminal: progress bars redrawn in place. In a log: a line whenever
    the state, wave, installs or the reason to wait change (and every 30 s).
    """
    from rich.live import Live

    rollout_id = str(status.get("id"))
    out = console(wide=wide)
    try:
        if out.is_terminal:
            with Live(render_progress(status), console=out, auto_refresh=False) as live:
                while status.get("state") not in _STOP_CODES:
                    time.sleep(interval_s)
                    status = admin_call(command, client.get_rollout, rollout_id)
                    live.update(render_progress(status), refresh=True)
        else:
            last, last_at = "", 0.0
            while True:
                line = progress_line(status)
                if line != last or time.monotonic() - last_at >= _LOG_EVERY_S:
                    out.print(line)
                    last, last_at = line, time.monotonic()
                if status.get("state") in _STOP_CODES:
                    break
                time.sleep(interval_s)
                status = admin_call(command, client.get_rollout, rollout_id)
    except KeyboardInterrupt:
        typer.echo(f"stopped watching {rollout_id}; the rollout itself goes on", err=True)
        raise typer.Exit(130) from None
    state, reason = str(status.get("state")), status.get("reason") or ""
    code = _STOP_CODES[state]
    if code:
        fail(command, f"{rollout_id} is {state}" + (f": {reason}" if reason else ""), code)
    out.print(f"{rollout_id} {state}" + (f": {reason}" if reason else ""))


# -- commands --------------------------------------------------------------------


WhatArgument = Annotated[
    str,
    typer.Argument(
        metavar="MODEL@VERSION", help="What to roll out, e.g. mnist@3.", show_default=False
    ),
]
WavesOption = Annotated[
    str | None,
    typer.Option(
        "--waves",
        help="Cumulative waves: percentages, device counts or 'all', e.g. 5%,25%,100% or 5,50,all.",
        show_default=False,
    ),
]
TargetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        help="LABEL=VALUE that devices must have (repeat: all must match). Default: every device.",
        show_default=False,
    ),
]
MaxFailureOption = Annotated[
    str,
    typer.Option(
        "--max-failure",
        help="Halt when more than this share of the devices "
        "so far failed or timed out (2% or 0.02).",
    ),
]
SoakOption = Annotated[
    str, typer.Option("--soak", help="Least time per wave before the next (90s, 10m, 1h30m).")
]
MinReportsOption = Annotated[
    int, typer.Option("--min-reports", help="Devices of a wave that must report first.")
]
DeviceTimeoutOption = Annotated[
    str, typer.Option("--device-timeout", help="A device silent this long counts as failed.")
]
FromVersionOption = Annotated[
    int | None,
    typer.Option(
        "--from",
        help="The baseline the health gates compare with (default: the version most "
        "target devices run); rollback returns each device to the version it ran.",
        show_default=False,
    ),
]
MaxAgreementDropOption = Annotated[
    str | None,
    typer.Option(
        "--max-agreement-drop",
        help="Health gate: halt when edge-cloud agreement falls by more than this (2%).",
        show_default=False,
    ),
]
MaxErrorRateIncreaseOption = Annotated[
    str | None,
    typer.Option(
        "--max-error-rate-increase",
        help="Health gate: error rate rise allowed (1%).",
        show_default=False,
    ),
]
MaxP99RatioOption = Annotated[
    str | None,
    typer.Option(
        "--max-p99-ratio",
        help="Health gate: p99 latency new/old allowed (1.2).",
        show_default=False,
    ),
]
MaxOffloadIncreaseOption = Annotated[
    str | None,
    typer.Option(
        "--max-offload-increase",
        help="Health gate: offload rate rise allowed (5%).",
        show_default=False,
    ),
]
MinHealthSamplesOption = Annotated[
    int,
    typer.Option(
        "--min-health-samples", help="Samples per version before the health gates decide."
    ),
]
ConfidenceOption = Annotated[
    str,
    typer.Option(
        "--confidence",
        help="Health gates: confidence of each decision over a wave's looks (95%).",
    ),
]
MaxSoakOption = Annotated[
    str | None,
    typer.Option(
        "--max-soak",
        help="Health gates: a wave still inconclusive this long halts "
        "(default: 6 soaks, at least soak + 30m).",
        show_default=False,
    ),
]
MaxOutliersOption = Annotated[
    str,
    typer.Option(
        "--max-outliers",
        help="Health gates: share of each cohort that may be excluded as outliers (5%).",
    ),
]
WideOption = Annotated[bool, typer.Option("--wide", help="Never cut tables to the terminal.")]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print what each wave can decide (devices, controls, samples, time); start nothing.",
    ),
]
AcceptInconclusiveOption = Annotated[
    bool,
    typer.Option(
        "--accept-inconclusive",
        help="Start even when a wave cannot reach a decision before --max-soak "
        "(it will halt as inconclusive for a person to decide).",
    ),
]
WatchOption = Annotated[bool, typer.Option("--watch", help="Then follow it as 'status --watch'.")]
IntervalOption = Annotated[str, typer.Option("--interval", help="Poll period for --watch.")]


@rollout_app.command("start")
def rollout_start(
    what: WhatArgument,
    waves: WavesOption = None,
    target: TargetOption = None,
    max_failure: MaxFailureOption = "5%",
    soak: SoakOption = "10m",
    min_reports: MinReportsOption = 1,
    device_timeout: DeviceTimeoutOption = "30m",
    from_version: FromVersionOption = None,
    max_agreement_drop: MaxAgreementDropOption = None,
    max_error_rate_increase: MaxErrorRateIncreaseOption = None,
    max_p99_ratio: MaxP99RatioOption = None,
    max_offload_increase: MaxOffloadIncreaseOption = None,
    min_health_samples: MinHealthSamplesOption = 100,
    confidence: ConfidenceOption = "95%",
    max_soak: MaxSoakOption = None,
    max_outliers: MaxOutliersOption = "5%",
    dry_run: DryRunOption = False,
    accept_inconclusive: AcceptInconclusiveOption = False,
    watch: WatchOption = False,
    interval: IntervalOption = "2s",
    wide: WideOption = False,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a staged rollout of MODEL@VERSION to the devices matching --target.

    Wave by wave, each wave soaks for --soak and must stay under --max-failure
    before the next starts; with health gates (--max-agreement-drop, …) the
    wave's devices are compared with a control cohort kept on the previous
    version, and the wave goes on once each gate shows "not worse than its
    margin" at --confidence, halts when one shows "worse", and halts as
    inconclusive after --max-soak. A halt holds until 'tandem rollout resume'
    (which judges again) or 'tandem rollout skip-gate' (which does not).

    It first prints what the target can decide: devices and controls per
    wave, the failures that halt each wave, the samples each gate needs at
    --confidence and the time that takes at the traffic the devices report,
    and refuses a plan with a wave that cannot decide before --max-soak
    (--accept-inconclusive starts it anyway; --dry-run only prints the plan).
    The previous version is what the target's devices run (--from to choose);
    rollback returns each device to the version it ran.

    Example: tandem rollout start mnist@3 --target site=factory-a --waves 5%,25%,100%
    --max-failure 2% --soak 10m --max-agreement-drop 2% --cdn http://cdn:8700
    """
    command = "rollout start"
    if watch and as_json:
        fail(command, "--json and --watch do not mix: poll 'status ID --json' instead", 2)
    body = start_request(
        command, what, waves, target, from_version, min_reports, min_health_samples
    )
    body["max_failure_rate"] = parse_fraction(max_failure, "--max-failure", command)
    body["soak_s"] = parse_duration(soak, "--soak", command)
    body["device_timeout_s"] = parse_duration(
        device_timeout, "--device-timeout", command, positive=True
    )
    fraction, ratio = parse_fraction, parse_ratio
    gates = (
        ("max_agreement_drop", "--max-agreement-drop", max_agreement_drop, fraction),
        ("max_error_rate_increase", "--max-error-rate-increase", max_error_rate_increase, fraction),
        ("max_offload_rate_increase", "--max-offload-increase", max_offload_increase, fraction),
        ("max_p99_latency_ratio", "--max-p99-ratio", max_p99_ratio, ratio),
    )
    for key, option, text, parse in gates:
        body[key] = None if text is None else parse(text, option, command)
    body["confidence"] = parse_fraction(confidence, "--confidence", command)
    if not 0.5 <= body["confidence"] < 1:
        fail(command, f"--confidence must be at least 50% and below 100%, got {confidence}", 2)
    body["max_outliers"] = parse_fraction(max_outliers, "--max-outliers", command)
    if max_soak is not None:
        body["max_soak_s"] = parse_duration(max_soak, "--max-soak", command)
    interval_s = parse_duration(interval, "--interval", command, positive=True)
    client = admin_client(command, cdn, token, ca)
    if dry_run:
        body["dry_run"] = True
    if accept_inconclusive:
        body["accept_inconclusive"] = True
    status = admin_call(command, client.start_rollout, body)
    if as_json:
        print_json(status)
        return
    plan = [str(line) for line in status.get("plan_text") or []]
    if plan:
        _print("plan (what each wave can decide):\n  " + "\n  ".join(plan), wide)
    if dry_run:
        typer.echo("dry run: nothing started")
        return
    if not watch:
        _print(render_status(status), wide)
    if watch:
        _watch("rollout status", client, status, interval_s, wide)


@rollout_app.command("status")
def rollout_status(
    rollout_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[ID]", help="The rollout (default: the newest active one).", show_default=False
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Follow it with progress bars until it completes, "
            "halts, is paused, aborted or rolled back.",
        ),
    ] = False,
    interval: Annotated[str, typer.Option("--interval", help="Poll period for --watch.")] = "2s",
    wide: WideOption = False,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a rollout: state, waves (planned, installed, failed, timed out), every health
    judgement (new and control estimates, the change, its interval, the margin,
    devices and samples on each side, outliers) and why the wave waits.

    Without ID: the newest active rollout, or the list when none is active
    (with --json: {"rollouts": [...]}).
    With --watch the exit status says how it ended: 0 completed or rolled
    back, 3 halted or aborted, 4 paused, 130 Ctrl-C (the rollout goes on).

    Example: tandem rollout status ro-1a2b3c4d5e6f --watch --interval 5s
    """
    command = "rollout status"
    if watch and as_json:
        fail(command, "--json and --watch do not mix: poll 'status ID --json' instead", 2)
    if rollout_id is not None:
        check_id(rollout_id, command)
    interval_s = parse_duration(interval, "--interval", command, positive=True)
    client = admin_client(command, cdn, token, ca)
    if rollout_id is not None:
        status = admin_call(command, client.get_rollout, rollout_id)
    else:
        rollouts = admin_call(command, client.list_rollouts)
        active = [r for r in rollouts if r.get("state") in ACTIVE]
        if not active:
            if as_json:
                print_json({"rollouts": rollouts})
            elif rollouts:
                typer.echo("no active rollout; the latest ones:")
                _print(list_table(rollouts[:10]), wide)
            else:
                typer.echo("no rollouts yet")
            return
        status = active[0]
    if watch:
        _watch(command, client, status, interval_s, wide)
    elif as_json:
        print_json(status)
    else:
        _print(render_status(status), wide)


def _steer(
    command: str, rollout_id: str, action: str, cdn: str, token: str | None, ca: Path | None
) -> None:
    check_id(rollout_id, command)
    client = admin_client(command, cdn, token, ca)
    status = admin_call(command, getattr(client, action), rollout_id)
    reason = f" ({status['reason']})" if status.get("reason") else ""
    typer.echo(f"{status.get('id', rollout_id)}: {status.get('state', '?')}{reason}")


IdArgument = Annotated[
    str, typer.Argument(metavar="ID", help="The rollout's id.", show_default=False)
]


@rollout_app.command("pause")
def rollout_pause(
    rollout_id: IdArgument,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
) -> None:
    """Pause a running rollout: no new devices are assigned until 'resume'.

    Example: tandem rollout pause ro-1a2b3c4d5e6f
    """
    _steer("rollout pause", rollout_id, "pause", cdn, token, ca)


@rollout_app.command("resume")
def rollout_resume(
    rollout_id: IdArgument,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
) -> None:
    """Resume a paused or halted rollout: accepts the failures seen so far, and goes on
    judging the wave's health (after a health halt, with a new round of looks).
    To go on without the judgement: 'tandem rollout skip-gate'.

    Example: tandem rollout resume ro-1a2b3c4d5e6f
    """
    _steer("rollout resume", rollout_id, "resume", cdn, token, ca)


@rollout_app.command("skip-gate")
def rollout_skip_gate(
    rollout_id: IdArgument,
    reason: Annotated[
        str | None,
        typer.Option(
            "--reason",
            help="Why the gate is skipped (kept in the rollout's history).",
            show_default=False,
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
) -> None:
    """Let the current wave go on without its health judgement (and accept its failures
    so far); soak time and --min-reports still hold, the next wave is judged again.
    Recorded in the rollout's history (who, when, why) and shown by 'status'.

    Example: tandem rollout skip-gate ro-1a2b3c4d5e6f --reason "drop is the known label fix"
    """
    command = "rollout skip-gate"
    check_id(rollout_id, command)
    if reason is None or not reason.strip():
        fail(command, "--reason is required: say why the gate is skipped", 2)
    client = admin_client(command, cdn, token, ca)
    status = admin_call(command, client.get_rollout, rollout_id)
    waiting = "; ".join(str(w) for w in status.get("waiting") or []) or status.get("reason", "")
    question = (
        f"skip the health gate of wave {_int_of(status.get('wave')) + 1} of {rollout_id} "
        f"({status.get('state', '?')}: {waiting})? The wave will not be judged"
    )
    if not yes and not typer.confirm(question, default=False):
        fail(command, "not confirmed: nothing changed", 1)
    status = admin_call(command, client.skip_gate, rollout_id, reason.strip())
    typer.echo(
        f"{status.get('id', rollout_id)}: {status.get('state', '?')} ({status.get('reason')})"
    )


def _int_of(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@rollout_app.command("abort")
def rollout_abort(
    rollout_id: IdArgument,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
) -> None:
    """Stop a rollout for good; devices not yet updated keep their version.

    Example: tandem rollout abort ro-1a2b3c4d5e6f
    """
    _steer("rollout abort", rollout_id, "abort", cdn, token, ca)


@rollout_app.command("rollback")
def rollout_rollback(
    rollout_id: IdArgument,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
) -> None:
    """Send every device the rollout touched back to the previous version.

    Example: tandem rollout rollback ro-1a2b3c4d5e6f
    """
    _steer("rollout rollback", rollout_id, "rollback", cdn, token, ca)


@rollout_app.command("list")
def rollout_list(
    show_all: Annotated[
        bool, typer.Option("--all", help="Also finished ones (completed, aborted, rolled back).")
    ] = False,
    wide: WideOption = False,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
    as_json: JsonOption = False,
) -> None:
    """List active rollouts, newest first (--all: every rollout).

    Example: tandem rollout list --all --cdn http://cdn:8700
    """
    command = "rollout list"
    client = admin_client(command, cdn, token, ca)
    rollouts = admin_call(command, client.list_rollouts)
    if not show_all:
        rollouts = [r for r in rollouts if r.get("state") in ACTIVE]
    if as_json:
        print_json({"rollouts": rollouts})
    elif rollouts:
        _print(list_table(rollouts), wide)
    else:
        typer.echo("no rollouts yet" if show_all else "no active rollouts (--all lists every one)")
