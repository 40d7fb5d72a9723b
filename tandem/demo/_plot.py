"""The demo's PNG: accuracy against offload rate, curves and measured points."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_accuracy_vs_offload"]

_STYLE: dict[str, dict[str, Any]] = {
    "oracle": dict(color="black", linestyle=":", linewidth=1.5),
    "random": dict(color="grey", linestyle="--", linewidth=1.2),
}


def plot_accuracy_vs_offload(
    curves: dict[str, np.ndarray],
    points: Sequence[tuple[str, float, float]],
    path: Path,
    *,
    budget: float | None = None,
    title: str = "Accuracy against offload rate (MNIST, INT8 edge + cloud CNN)",
) -> Path:
    """Write the plot; ``points`` are measured (label, offload rate, accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    for name, curve in curves.items():
        x = np.linspace(0.0, 100.0, len(curve))
        ax.plot(x, curve * 100.0, label=f"{name} (offline sweep)", **_STYLE.get(name, {}))
    markers = iter("os^Dv")
    for label, rate, accuracy in points:
        ax.scatter(
            [rate * 100.0],
            [accuracy * 100.0],
            s=70,
            zorder=5,
            marker=next(markers, "o"),
            edgecolors="black",
            label=f"{label} (measured)",
        )
    if budget is not None:
        ax.axvline(budget * 100.0, color="tab:red", alpha=0.35, linewidth=1)
    ax.set_xlabel("requests offloaded to the cloud (%)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    low = min(float(c.min()) for c in curves.values()) * 100.0
    ax.set_ylim(max(0.0, low - 1.0), 100.5)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
