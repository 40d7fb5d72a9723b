"""How a rollout looks in a terminal: the status tables and the ``--watch`` progress bars.

Rendering only (rich renderables from the admin API's status objects). The
objects come over the network, so every field is read defensively: a
missing or odd field shows as ``—`` or 0, never as a crash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._admin import ago_text
from ._common import ratio_text

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["list_table", "render_progress", "render_status"]


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
    """The enabled health gates, e.g. ``agreement drop ≤ 2.00%, p99 ratio ≤ 1.2``."""
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
        gates.append(f"after {spec['min_health_samples']} samples per version")
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
    health = _dict(status.get("health"))
    if gates:
        parts.append(f"health gates: {gates}" + ("" if health else "; no health data yet"))
    if health:
        table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
        for column in ("version", "samples", "error rate", "p99 ms", "offload rate", "agreement"):
            table.add_column(column, no_wrap=True, justify="right")
        for version, m in sorted(health.items(), key=lambda kv: str(kv[0])):
            m = _dict(m)
            p99 = m.get("p99_latency_ms")
            table.add_row(
                str(version),
                str(_int(m.get("samples"))),
                ratio_text(m.get("error_rate")),
                f"{p99:.1f}" if isinstance(p99, int | float) else "—",
                ratio_text(m.get("offload_rate")),
                ratio_text(m.get("agreement")),
            )
        parts.append(table)
    return Group(*parts)


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
    return Group(_state_line(status), grid)


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
