"""How ``tandem models`` looks: the listings, and publishing's progress bar and summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import ratio_text, size_text

if TYPE_CHECKING:
    from rich.table import Table

    from model_cdn import Registry, VersionRecord

__all__ = ["models_table", "print_published", "read_labels", "versions_table", "with_progress"]


def _table() -> Table:
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)


def models_table(registry: Registry, models: list[str]) -> Table:
    """One row per model: its latest version, how many, when, and the blob."""
    table = _table()
    for column in ("model", "latest", "versions", "published"):
        table.add_column(column, no_wrap=True)
    table.add_column("blob", overflow="ellipsis")  # gives way when narrow
    for model in models:
        records = registry.list_versions(model)
        last = records[-1]
        table.add_row(
            model,
            str(last.version),
            str(len(records)),
            last.published_at,
            last.blob_digest.removeprefix("sha256:")[:12],
        )
    return table


def versions_table(records: list[VersionRecord]) -> Table:
    """One row per version of a model: when, how it was quantized, how well it agrees."""
    table = _table()
    for column in ("version", "published", "method", "agreement", "accuracy"):
        table.add_column(column, no_wrap=True)
    table.add_column("blob", overflow="ellipsis")
    for record in records:
        q = record.manifest.get("signed", {}).get("quantization", {})
        table.add_row(
            str(record.version),
            record.published_at,
            str(q.get("method", "—")),
            ratio_text(q.get("agreement")),
            ratio_text(q.get("accuracy")),
            record.blob_digest.removeprefix("sha256:")[:12],
        )
    return table


def read_labels(path: Path) -> list[str]:
    labels = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not labels:
        raise ValueError(f"{path} holds no labels")
    return labels


def with_progress(run: Any) -> Any:
    """Run ``run(progress)`` under a rich progress bar on stderr, one step per stage."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    stages = ["load float model", "quantize", "validate", "compress", "delta"]
    stages.append("store and register")
    with Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("publishing", total=len(stages))
        done: set[str] = set()

        def progress(stage: str, fraction: float) -> None:
            if stage not in stages:
                stages.append(stage)
                bar.update(task, total=len(stages))
            if fraction >= 1:
                done.add(stage)
            partial = 0.0 if stage in done else max(0.0, min(fraction, 0.99))
            bar.update(task, description=stage, completed=len(done) + partial)

        return run(progress)


def print_published(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    manifest, report = result.manifest, result.report
    table = Table(title=f"published {manifest.name}@{manifest.version}", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # the full digest, wrapped rather than cut
    delta = manifest.deltas[0] if manifest.deltas else None
    rows = [
        ("version", str(manifest.version)),
        ("digest", result.blob_digest),
        ("float size", size_text(report.get("float_bytes"))),
        (f"quantized size ({report.get('method', '?')})", size_text(report.get("quantized_bytes"))),
        ("compressed size", size_text(manifest.blob.size)),
        ("compressed / float", _share(manifest.blob.size, report.get("float_bytes"))),
        ("delta size", f"{size_text(delta.size)} from v{delta.from_version}" if delta else "—"),
        ("agreement", ratio_text(report.get("agreement"))),
        ("accuracy", ratio_text(report.get("accuracy"))),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _share(part: int, whole: object) -> str:
    return f"{part / whole:.1%}" if isinstance(whole, int) and whole > 0 else "—"
