"""How a rollout looks in a terminal: the status tables and the ``--watch`` progress bars.

Rendering only (rich renderables from the admin API's status objects). The
objects come over the network, so every field is read defensively: a
missing or odd field shows as ``—`` or 0, never as a crash. ``console``
fits tables to a terminal, and never cuts them in a log (or with ``--wide``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._admin import ago_text
from ._common import ratio_text

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = ["console", "list_table", "progress_line", "render_progress", "render_status"]

WIDE = 240  # columns of a log line or of --wide: tables are never cut below this


def console(*, wide: bool = False, stderr: bool = False) -> Console:
    """Plain text (no markup, no emoji); the terminal's width, else (a log, --wide) WIDE."""
    from rich.console import Console

    probe = Console(stderr=stderr)
    width = None if probe.is_terminal and not wide else WIDE
    return Console(markup=False, emoji=False, width=width, stderr=stderr)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _pts(value: object, *, signed: bool = True) -> str:
    v = _num(value)
    if v is None:
        return "—"
    return f"{v * 100:+.2f}" if signed else f"{v * 100:.2f}"


def _judgement_row(j: dict[str, Any]) -> tuple[str, ...]:
    new, control = _dict(j.get("new")), _dict(j.get("control"))
    ratio = j.get("scale") == "ratio"

    def est(side: dict[str, Any]) -> str:
        v = _num(side.get("estimate"))
        if v is None:
            return "—"
        return f"{v:.1f} ms" if ratio else f"{v * 100:.2f}%"

    if ratio:

        def fmt(x: object) -> str:
            v = _num(x)
            return "—" if v is None else f"{v:.3f}"

        change, margin = fmt(j.get("delta")), f"≤ {fmt(j.get('margin'))}"
        interval = f"[{fmt(j.get('lower'))}, {fmt(j.get('upper'))}]"
    else:
        change, margin = _pts(j.get("delta")), f"≤ {_pts(j.get('margin'), signed=False)}"
        interval = f"[{_pts(j.get('lower'))}, {_pts(j.get('upper'))}]"
    conf = _num(j.get("confidence"))
    excluded = len(new.get("excluded") or []) + len(control.get("excluded") or [])
    return (
        str(j.get("metric", "?")),
        str(j.get("verdict", "?")),
        est(new),
        est(control),
        change,
        interval + (f" @{conf * 100:.2f}%" if conf is not None else ""),
        margin,
        f"{_int(new.get('devices'))}/{_int(control.get('devices'))}",
        f"{_num(new.get('samples')) or 0:,.0f}/{_num(control.get('samples')) or 0:,.0f}",
        str(excluded),
    )


def _gates_part(status: dict[str, Any]) -> list[RenderableType]:
    """Every judgement with its interval and sample sizes, the looks, flagged devices."""
    from rich import box
    from rich.table import Table

    gates = _dict(status.get("gates"))
    judgements = [j for j in gates.get("judgements") or [] if isinstance(j, dict)]
    looks = _dict(gates.get("looks"))
    state = gates.get("state", "off")
    if state == "off":
        return []
    head = (
        f"health: {state} (look {_int(looks.get('done'))} of {_int(looks.get('total'))}; "
        f"{_int(gates.get('new_devices'))} new vs {_int(gates.get('control_devices'))} "
        "control devices; worse by: points, or new/control for latency)"
    )
    parts: list[RenderableType] = [head]
    if judgements:
        table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
        for column in (
            "gate",
            "verdict",
            "new",
            "control",
            "worse by",
            "interval",
            "allowed",
            "devices n/c",
            "samples n/c",
            "outliers",
        ):
            table.add_column(column, no_wrap=True, justify="left" if column == "gate" else "right")
        for j in judgements:
            table.add_row(*_judgement_row(j))
        parts.append(table)
    flagged = _dict(gates.get("flagged"))
    if flagged:
        shown = "; ".join(f"{d}: {why}" for d, why in list(flagged.items())[:5])
        more = f" (+{len(flagged) - 5} more)" if len(flagged) > 5 else ""
        parts.append(f"untrusted telemetry, not counted: {shown}{more}")
    return parts


def progress_line(status: dict[str, Any]) -> str:
    """One line for a log: state, wave, installs, what it waits for."""
    waves = [w for w in status.get("waves") or [] if isinstance(w, dict)]
    done = sum(_int(w.get("installed")) for w in waves)
    planned = sum(_int(w.get("planned")) for w in waves)
    wave, total, names = status.get("wave"), status.get("waves_total"), _wave_names(status)
    where = "—"
    if isinstance(wave, int) and wave >= 0:
        name = f" ({names[wave]})" if wave < len(names) else ""
        where = f"wave {wave + 1}{name} of {total}"
    waiting = [str(w) for w in status.get("waiting") or []]
    tail = f"; waiting: {'; '.join(waiting)}" if waiting else ""
    return (
        f"{status.get('id', '?')} {status.get('state', '?')}, {where}, "
        f"{done}/{planned} installed, failure rate {ratio_text(status.get('failure_rate'))}"
        f"{tail}"
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _wave_names(status: dict[str, Any]) -> list[str]:
    from model_cdn.rollout import Wave

    try:
        return [str(Wave.from_dict(w)) for w in status["spec"]["waves"]]
    except (AttributeError, KeyError, TypeError, ValueError):
        return []


def _state_line(status: dict[str, Any]) -> str:
    spec = _dict(status.get("spec"))
    previous = status.get("previous_version")
    target = _dict(status.get("target")) or _dict(spec.get("target"))
    where = ", ".join(f"{k}={v}" for k, v in target.items()) or "every device"
    state, wave, total = status.get("state", "?"), status.get("wave"), status.get("waves_total")
    position = ""
    if state in ("running", "paused", "halted") and isinstance(wave, int) and wave >= 0:
        position = f", wave {wave + 1} of {total}"
    reason = status.get("reason") or ""
    reason = f" ({reason})" if reason and reason != position.removeprefix(", ") else ""
    limit = spec.get("max_failure_rate")
    return (
        f"{status.get('id', '?')}  {status.get('model', '?')} "
        f"{previous if previous is not None else '?'} → {status.get('version', '?')}  "
        f"on {where}\nstate: {state}{position}{reason}   failure rate "
        f"{ratio_text(status.get('failure_rate'))} (max {ratio_text(limit)})"
    )


def _wave_rows(status: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    names, current = _wave_names(status), status.get("wave")
    if not isinstance(status.get("waves"), list):
        return []
    rows = []
    waves: list[Any] = status["waves"]
    for i, wave in enumerate(w for w in waves if isinstance(w, dict)):
        index = wave.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else i
        name = f"{index + 1}" + (f" ({names[index]})" if 0 <= index < len(names) else "")
        if not isinstance(current, int) or index > current:
            phase = "waiting"
        elif index < current or status.get("state") == "completed":
            phase = "done"
        else:
            phase = "current"
        rows.append((name, wave, phase))
    return rows


def _gates_text(spec: dict[str, Any]) -> str:
    """The enabled health gates, e.g. ``agreement drop ≤ 2.00%, p99 ratio ≤ 1.2, …``."""
    gates = [
        f"{name} ≤ {ratio_text(spec[key]) if key != 'max_p99_latency_ratio' else spec[key]}"
        for key, name in (
            ("max_agreement_drop", "agreement drop"),
            ("max_error_rate_increase", "error rate rise"),
            ("max_offload_rate_increase", "offload rate rise"),
            ("max_p99_latency_ratio", "p99 ratio"),
        )
        if isinstance(spec.get(key), int | float)
    ]
    if gates and isinstance(spec.get("min_health_samples"), int):
        gates.append(f"after {spec['min_health_samples']} samples per cohort")
    confidence = _num(spec.get("confidence"))
    if gates and confidence is not None:
        gates.append(f"{confidence * 100:g}% confidence over {_int(spec.get('looks'))} looks")
    return ", ".join(gates)


def render_status(status: dict[str, Any]) -> RenderableType:
    """State, then a table of waves, then health per version."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    waves = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in ("wave", "planned", "installed", "failed", "timed out", "in progress", ""):
        waves.add_column(column, no_wrap=True, justify="left" if column == "wave" else "right")
    for name, wave, phase in _wave_rows(status):
        busy = _int(wave.get("assigned")) + _int(wave.get("queued"))
        waves.add_row(
            name,
            str(_int(wave.get("planned"))),
            str(_int(wave.get("installed"))),
            str(_int(wave.get("failed"))),
            str(_int(wave.get("timed_out"))),
            str(busy),
            phase,
        )
    parts: list[RenderableType] = [_state_line(status), waves]
    gates = _gates_text(_dict(status.get("spec")))
    if gates:
        parts.append(f"health gates: {gates}")
    parts += _gates_part(status)
    waiting = [str(w) for w in status.get("waiting") or []]
    if waiting:
        parts.append("waiting: " + "\n         ".join(waiting))
    back = _dict(status.get("previous_versions"))
    if back:
        shown = ", ".join(f"{_int(n)} to version {v}" for v, n in back.items())
        parts.append(f"rollback would send: {shown} (each device to what it ran)")
    parts += _history_lines(status)
    return Group(*parts)


def _history_lines(status: dict[str, Any]) -> list[str]:
    """Operator actions, newest last (skip-gate with its reason and the gate it skipped)."""
    history = [e for e in status.get("history") or [] if isinstance(e, dict)]
    lines = []
    for e in history[-8:]:
        wave = e.get("wave")
        where = f" wave {wave + 1}" if isinstance(wave, int) and wave >= 0 else ""
        who = f" by {e['by']}" if e.get("by") else ""
        why = f": {e['reason']}" if e.get("reason") else ""
        gate = f" (skipped: {e['gate']})" if e.get("gate") else ""
        lines.append(f"  {ago_text(e.get('at'))} {e.get('action', '?')}{where}{who}{why}{gate}")
    return ["history:", *lines] if lines else []


def render_progress(status: dict[str, Any]) -> RenderableType:
    """The state line and one progress bar per wave (for ``--watch``)."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    for _ in range(4):
        grid.add_column(no_wrap=True)
    for name, wave, phase in _wave_rows(status):
        planned = max(_int(wave.get("planned")), _int(wave.get("devices")))
        done = sum(_int(wave.get(k)) for k in ("installed", "failed", "timed_out"))
        busy = _int(wave.get("assigned")) + _int(wave.get("queued"))
        grid.add_row(
            f"wave {name}",
            ProgressBar(total=max(planned, 1), completed=min(done, planned), width=30),
            f"{done}/{planned}",
            f"installed {_int(wave.get('installed'))}, failed {_int(wave.get('failed'))}, "
            f"timed out {_int(wave.get('timed_out'))}, in progress {busy}  [{phase}]",
        )
    waiting = [str(w) for w in status.get("waiting") or []]
    lines: list[RenderableType] = [_state_line(status), grid]
    if waiting:
        lines.append("waiting: " + "; ".join(waiting))
    return Group(*lines)


def list_table(rollouts: list[dict[str, Any]]) -> RenderableType:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in ("id", "model", "from", "to", "state", "wave", "installed", "failures"):
        table.add_column(column, no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("reason", overflow="ellipsis")
    for r in rollouts:
        counts = _dict(r.get("counts"))
        wave, total = r.get("wave"), r.get("waves_total")
        table.add_row(
            str(r.get("id", "?")),
            str(r.get("model", "?")),
            str(r.get("previous_version", "?")),
            str(r.get("version", "?")),
            str(r.get("state", "?")),
            f"{wave + 1}/{total}" if isinstance(wave, int) and wave >= 0 else f"—/{total}",
            f"{_int(counts.get('installed'))}/{_int(counts.get('total'))}",
            ratio_text(r.get("failure_rate")),
            ago_text(r.get("created_at")),
            str(r.get("reason") or ""),
        )
    return table
