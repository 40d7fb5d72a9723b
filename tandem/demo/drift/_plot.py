"""The learning loop's PNG: accuracy, offload rate, agreement and the version in service, over time.

Each streamed phase is a shaded span; accuracy and offload rate are over
windows of answers in completion order within a phase; agreement is the
fleet's edge-cloud agreement on offloaded requests, from the devices' own
counters (what their telemetry sends the rollout gate), per sampling interval;
the last panel is the share of answers given by the refined version.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._stream import Timeline

__all__ = ["plot_learning_loop"]

_WINDOW = 150  # answers per point
_COLORS = ("#dbe9f6", "#fbe3d6", "#e5f4e3", "#f1e6f7", "#fff2cc", "#e0e0e0")


def _windows(timeline: Timeline, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, accuracy, offload rate) per window of answers of one phase."""
    answers = sorted(timeline.of(phase), key=lambda a: a.t)
    t, acc, off = [], [], []
    for start in range(0, len(answers), _WINDOW):
        chunk = answers[start : start + _WINDOW]
        if len(chunk) < _WINDOW // 3:
            continue
        t.append(np.mean([a.t for a in chunk]))
        acc.append(np.mean([a.correct for a in chunk]) * 100)
        off.append(np.mean([a.offloaded for a in chunk]) * 100)
    return np.array(t), np.array(acc), np.array(off)


def _agreement(timeline: Timeline, span_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(time, agreement %) over intervals of about ``span_s`` with new comparisons."""
    points = timeline.agreement
    t, rate = [], []
    last = points[0] if points else None
    for point in points[1:]:
        assert last is not None
        if point[0] - last[0] < span_s:
            continue
        compared, agreed = point[1] - last[1], point[2] - last[2]
        if compared >= 10:
            t.append((point[0] + last[0]) / 2)
            rate.append(100.0 * agreed / compared)
        last = point
    return np.array(t), np.array(rate)


def _new_version_share(timeline: Timeline, version: str) -> tuple[np.ndarray, np.ndarray]:
    answers = sorted(timeline.answers, key=lambda a: a.t)
    t, share = [], []
    for start in range(0, len(answers), _WINDOW):
        chunk = answers[start : start + _WINDOW]
        t.append(np.mean([a.t for a in chunk]))
        share.append(100.0 * np.mean([a.edge == version for a in chunk]))
    return np.array(t), np.array(share)


def plot_learning_loop(timeline: Timeline, new_version: str, path: Path, *, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(9.0, 9.0), dpi=110, sharex=True)
    for i, (name, start, end) in enumerate(timeline.phases):
        for ax in axes:
            ax.axvspan(start, end, color=_COLORS[i % len(_COLORS)], zorder=0)
        axes[0].text((start + end) / 2, 101, name, ha="center", va="bottom", fontsize=8)
    for name, _, _ in timeline.phases:
        t, acc, off = _windows(timeline, name)
        if len(t):
            axes[0].plot(t, acc, "o-", color="tab:blue", markersize=3)
            axes[1].plot(t, off, "o-", color="tab:orange", markersize=3)
    t, rate = _agreement(timeline)
    axes[2].plot(t, rate, "o-", color="tab:green", markersize=3)
    t, share = _new_version_share(timeline, new_version)
    axes[3].plot(t, share, "-", color="tab:purple")
    labels = (
        "accuracy (%)",
        "offloaded (%)",
        "edge-cloud agreement\non offloads (%)",
        f"answers by\n{new_version} (%)",
    )
    for ax, label in zip(axes, labels, strict=True):
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(50, 108)
    axes[1].set_ylim(0, max(40.0, float(axes[1].get_ylim()[1])))
    axes[2].set_ylim(0, 100)
    axes[3].set_ylim(-5, 105)
    axes[3].set_xlabel("seconds since the fleet started streaming")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
