"""How ``tandem models publish`` looks: a progress bar while it works, a summary table after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._common import ratio_text, size_text

__all__ = ["print_published", "read_labels", "with_progress"]


def read_labels(path: Path) -> list[str]:
    labels = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not labels:
        raise ValueError(f"{path} holds no labels")
    return labels


def with_progress(run: Any) -> Any:
    """Run ``run(progress)`` under a rich progress bar on stderr, one step per stage."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    stages = ["load float model", "quantize", "validate", "compress and store", "delta"]
    stages.append("sign and register")
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
