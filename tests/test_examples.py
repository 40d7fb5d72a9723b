from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_collaborative_mnist_example_runs_and_uses_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = runpy.run_path(str(EXAMPLES / "collaborative_mnist.py"))
    outcome = namespace["main"](n=120)
    assert set(outcome["sources"]) == {"edge", "cloud"}
    assert outcome["accuracy"] > 0.8
    assert "accuracy" in capsys.readouterr().out
