"""One rich progress bar per stage of a long run: the ``progress(stage, fraction)`` callback
the demos take."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["stage_bars"]


@contextlib.contextmanager
def stage_bars(console: Console, width: int = 28) -> Iterator[Callable[[str, float], None]]:
    """A callback that adds a bar the first time it hears a stage and moves it after."""
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"{{task.description:<{width}}}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, fraction: float) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=1.0)
            bar.update(tasks[stage], completed=min(max(fraction, 0.0), 1.0))

        yield progress
