"""What ``tandem demo --llm`` leaves in its output folder, written from an ``LlmDemoReport``.

- ``llm_<mode>.png``, one per mode shown (``llm_presets.png``,
  ``llm_collaborative.png``, ``llm_speculative.png``): per row of the mode's
  table, the quality (token agreement with the held-out text and, beside it
  where the mode measures it, with the hub's own text), the output tokens each
  side served, and the latency (p50 bar, p99 whisker): time to first token,
  or for the speculative mode the end-to-end time of a turn;
- ``llm_report.json``: ``LlmDemoReport.to_dict()`` (settings, per-preset
  figures, every turn, the modes' figures, how the models were built).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ._demo_run import LlmDemoReport

__all__ = ["LlmDemoFiles", "plot_presets", "write_llm_outputs"]


@dataclass(frozen=True)
class LlmDemoFiles:
    plot: Path  # the first mode's plot
    report: Path
    plots: tuple[Path, ...] = ()  # one per mode shown, in order


def write_llm_outputs(report: LlmDemoReport, output: Path) -> LlmDemoFiles:
    output.mkdir(parents=True, exist_ok=True)
    pngs = tuple(plot_presets(report, output / f"llm_{m}.png", m) for m in report.modes)
    path = output / "llm_report.json"
    path.write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    return LlmDemoFiles(plot=pngs[0], report=path, plots=pngs)


def plot_presets(report: LlmDemoReport, path: Path, mode: str = "presets") -> Path:
    """Three panels over ``mode``'s rows: quality, tokens by side, latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.rows(mode)
    names = [p.preset for p in rows]
    x = list(range(len(names)))
    fig, (quality, tokens, ttft) = plt.subplots(1, 3, figsize=(12.0, 4.2), dpi=120)

    if mode == "presets":
        quality.bar(x, [p.agreement * 100.0 for p in rows], color="tab:green")
        quality.set_ylabel("token agreement with held-out text (%)")
    else:
        held = [p.agreement * 100.0 for p in rows]
        hub = [_zero(p.hub_agreement) * 100.0 for p in rows]
        quality.bar([i - 0.2 for i in x], held, width=0.4, color="tab:green", label="held-out")
        quality.bar([i + 0.2 for i in x], hub, width=0.4, color="tab:olive", label="hub's text")
        quality.set_ylabel("token agreement (%)")
        quality.legend(fontsize=8)
    quality.set_title("quality")

    edge = [p.edge_tokens for p in rows]
    cloud = [p.cloud_tokens for p in rows]
    tokens.bar(x, edge, label="edge (device model)", color="tab:blue")
    tokens.bar(x, cloud, bottom=edge, label="cloud (hub model)", color="tab:orange")
    tokens.set_ylabel("output tokens served")
    tokens.set_title("who served the tokens")
    tokens.legend(fontsize=8)

    spec = mode == "speculative"  # its point is the whole turn's time, not the first token
    p50 = [_zero(p.total_p50_ms if spec else p.ttft_p50_ms) for p in rows]
    p99 = [_zero(p.total_p99_ms if spec else p.ttft_p99_ms) for p in rows]
    ttft.bar(x, p50, color="tab:purple", label="p50")
    ttft.errorbar(
        x, p50, yerr=[[0.0] * len(x), [max(0.0, h - m) for h, m in zip(p99, p50, strict=True)]],
        fmt="none", ecolor="black", capsize=6, label="p99",
    )  # fmt: skip
    if mode == "presets":
        ttft.axhline(report.deadline_ms, color="tab:red", alpha=0.4, label="deadline")
    ttft.set_ylabel("end-to-end time of a turn (ms)" if spec else "time to first token (ms)")
    ttft.set_title("latency")
    ttft.legend(fontsize=8)

    for ax in (quality, tokens, ttft):
        ax.set_xticks(x, names)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{mode}: {_subtitle(report, mode)}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _subtitle(report: LlmDemoReport, mode: str) -> str:
    head = f"{len(report.prompts)} held-out prompts, {report.max_tokens} tokens each"
    if mode == "presets":
        return f"{head}, deadline {report.deadline_ms:.1f} ms"
    if mode == "collaborative" and report.collaborative is not None:
        c = report.collaborative
        return f"{head}, hub token budget {c.budget:.0%}, spent {_zero(c.realized_share):.1%}"
    if mode == "speculative" and report.speculative is not None:
        s = report.speculative
        same = "identical" if s.all_identical else "NOT identical"
        return f"{head}, greedy text {same}, {s.passes_per_token:.2f} hub passes a token"
    return head


def _zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value
