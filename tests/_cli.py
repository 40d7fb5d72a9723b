"""Running ``tandem`` commands in tests: in this process (fast) or in a real one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "marked_required", "one_error_line", "tandem", "tandem_env"]

ROOT = Path(__file__).resolve().parents[1]


def tandem_env(**extra: str) -> dict[str, str]:
    """The environment for a real ``tandem`` process: no ``TANDEM_*`` variables of the
    machine, this checkout importable, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def tandem(
    *args: str, cwd: Path | None = None, timeout: float = 120, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """``tandem ARGS`` in ``cwd`` with no ``TANDEM_*`` variables set and wide tables.

    By default typer's test runner runs it in this process (exit code, stdout
    and stderr apart; no interpreter start-up); ``process=True`` runs a real
    ``python -m tandem.cli``, for what only a process shows (the entry point,
    signals).
    """
    if not process:
        from typer.testing import CliRunner

        from tandem.cli import app

        unset = {k: None for k in os.environ if k.startswith("TANDEM_")}
        with contextlib.chdir(cwd or Path.cwd()):
            result = CliRunner().invoke(app, list(args), env={**unset, "COLUMNS": "200"})
        return subprocess.CompletedProcess(
            list(args), result.exit_code, result.stdout, result.stderr
        )
    env = tandem_env(COLUMNS="200")  # rich tables and help stay on one line each
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The one line on stderr of a failed command, after checking its exit code and text."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stdout + result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tandem "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def marked_required(help_text: str, option: str) -> bool:
    """Whether ``--help`` marks ``option`` required: ``*`` before it in its panel row."""
    for line in help_text.splitlines():
        cells = line.strip("│ ").split()
        if line.startswith("│") and option in cells:
            return cells[0] == "*" and cells.index(option) == 1
    raise AssertionError(f"{option} is not in the help")
