"""The latency and throughput parts' figures (matplotlib, written as PNG files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_latency", "plot_throughput"]


def plot_latency(
    samples: dict[str, np.ndarray],
    stats: dict[str, dict[str, Any]],
    labels: dict[str, str],
    title: str,
    path: Path,
) -> None:
    """Latency CDF per variant beside horizontal p50/p99 bars (log axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(14, 6.4))
    names = list(samples)
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    for n, v in samples.items():
        ordered = np.sort(v)
        cdf.plot(
            ordered, np.arange(1, len(v) + 1) / len(v), label=labels[n], lw=1.6, color=colors[n]
        )
    cdf.set_xscale("log")
    cdf.set_xlabel("round trip (ms, log scale)")
    cdf.set_ylabel("share of calls at or below")
    cdf.set_title("Latency CDF")
    cdf.grid(True, which="both", alpha=0.3)
    pos = np.arange(len(names))[::-1]
    p50 = [stats[n]["p50_ms"] for n in names]
    p99 = [stats[n]["p99_ms"] for n in names]
    bars.barh(pos + 0.2, p50, 0.4, color=[colors[n] for n in names], label="p50")
    bars.barh(pos - 0.2, p99, 0.4, color=[colors[n] for n in names], alpha=0.45, label="p99")
    for y, a, b in zip(pos, p50, p99, strict=True):
        bars.text(a, y + 0.2, f" {a:.2f}", va="center", fontsize=7)
        bars.text(b, y - 0.2, f" {b:.1f}", va="center", fontsize=7)
    bars.set_xscale("log")
    bars.set_yticks(pos)
    bars.set_yticklabels([labels[n] for n in names], fontsize=8)
    bars.set_xlabel("ms (log scale)")
    bars.set_title("p50 (solid) and p99 (light) by variant")
    bars.grid(True, axis="x", which="both", alpha=0.3)
    handles, labels = cdf.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_throughput(
    summary: dict[str, dict[int, dict[str, Any]]],
    labels: dict[str, str],
    *,
    limit: float,
    limit_range: tuple[float, float],
    limit_label: str,
    target_share: float | None = None,
    reference: tuple[float, str] | None = None,
    title: str,
    path: Path,
) -> None:
    """Throughput (with min-max bars) and p50 against requesters; the limit as a line.

    ``target_share`` draws that share of the limit; ``reference`` (value, label)
    another horizontal line, e.g. a bare consumer's throughput.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tp, lat) = plt.subplots(1, 2, figsize=(13, 6.4))
    markers = "osD^v"
    shown = list(summary.items())
    for (name, per_n), marker in zip(shown, markers, strict=False):
        ns = list(per_n)
        y = [per_n[n]["throughput"] for n in ns]
        # A window without a single answer has a minimum of 0: clip it for the log axis.
        lo = [y[i] - max(per_n[n]["throughput_min"], y[i] / 50) for i, n in enumerate(ns)]
        hi = [per_n[n]["throughput_max"] - per_n[n]["throughput"] for n in ns]
        tp.errorbar(ns, y, yerr=[lo, hi], marker=marker, capsize=3, label=labels[name])
        lat.plot(ns, [per_n[n]["p50_ms"] for n in ns], marker=marker, label=labels[name])
    tp.axhline(limit, color="black", ls="--", lw=1.2, label=limit_label)
    tp.axhspan(*limit_range, color="black", alpha=0.07, label="the limit's range over rounds")
    if target_share is not None:
        tp.axhline(
            limit * target_share,
            color="grey",
            ls=":",
            lw=1.0,
            label=f"{target_share:.0%} of the limit",
        )
    if reference is not None:
        tp.axhline(reference[0], color="tab:red", ls="-.", lw=1.0, label=reference[1])
    concurrency = sorted({n for per_n in summary.values() for n in per_n})
    for ax in (tp, lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrency)
        ax.set_xticklabels([str(n) for n in concurrency])
        ax.set_xlabel("concurrent requesters (closed loop)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_yscale("log")
    tp.set_ylabel("answers (samples) per second, log scale")
    tp.set_title("Throughput (bars: range over windows)")
    lat.set_ylabel("p50 latency, ms (log scale)")
    lat.set_title("Median latency")
    handles, labels = tp.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
