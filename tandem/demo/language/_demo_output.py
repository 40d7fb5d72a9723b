"""What ``tandem demo --llm`` leaves in its output folder, written from an ``LlmDemoReport``.

- ``llm_presets.png``: per preset, the quality (token agreement), the output
  tokens each side served, and time to first token (p50 bar, p99 whisker);
- ``llm_report.json``: ``LlmDemoReport.to_dict()`` (settings, per-preset
  figures, every turn, how the models were built).
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
    plot: Path
    report: Path


def write_llm_outputs(report: LlmDemoReport, output: Path) -> LlmDemoFiles:
    output.mkdir(parents=True, exist_ok=True)
    png = plot_presets(report, output / "llm_presets.png")
    path = output / "llm_report.json"
    path.write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    return LlmDemoFiles(plot=png, report=path)


def plot_presets(report: LlmDemoReport, path: Path) -> Path:
    """Three panels over the presets: quality, tokens by side, time to first token."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [p.preset for p in report.presets]
    x = list(range(len(names)))
    fig, (quality, tokens, ttft) = plt.subplots(1, 3, figsize=(12.0, 4.2), dpi=120)

    quality.bar(x, [p.agreement * 100.0 for p in report.presets], color="tab:green")
    quality.set_ylabel("token agreement with held-out text (%)")
    quality.set_title("quality")

    edge = [p.edge_tokens for p in report.presets]
    cloud = [p.cloud_tokens for p in report.presets]
    tokens.bar(x, edge, label="edge (device model)", color="tab:blue")
    tokens.bar(x, cloud, bottom=edge, label="cloud (hub model)", color="tab:orange")
    tokens.set_ylabel("output tokens served")
    tokens.set_title("who served the tokens")
    tokens.legend(fontsize=8)

    p50 = [_zero(p.ttft_p50_ms) for p in report.presets]
    p99 = [_zero(p.ttft_p99_ms) for p in report.presets]
    ttft.bar(x, p50, color="tab:purple", label="p50")
    ttft.errorbar(
        x, p50, yerr=[[0.0] * len(x), [max(0.0, h - m) for h, m in zip(p99, p50, strict=True)]],
        fmt="none", ecolor="black", capsize=6, label="p99",
    )  # fmt: skip
    ttft.axhline(report.deadline_ms, color="tab:red", alpha=0.4, label="deadline")
    ttft.set_ylabel("time to first token (ms)")
    ttft.set_title("latency")
    ttft.legend(fontsize=8)

    for ax in (quality, tokens, ttft):
        ax.set_xticks(x, names)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"{len(report.prompts)} held-out prompts, {report.max_tokens} tokens each, "
        f"deadline {report.deadline_ms:.1f} ms"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value
