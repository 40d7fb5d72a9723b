"""``tandem demo --llm`` end to end on the tiny language pair: a real Mosquitto, hub and agent.

No figure is expected to take a value (the models train for a few steps and
the timings are this machine's): what must hold is checked instead. Every
token of ``edge_only`` is the device's and every token of ``cloud_only`` the
hub's; the turns of each preset add up by side; the tokens counted are the
tokens generated; a deadline nothing can meet sends every ``prefer_edge``
turn to the hub; the files are a PNG and JSON that say the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.demo.language import (
    LlmDemoConfig,
    LlmDemoReport,
    run_llm_demo,
    summarize_preset,
    write_llm_outputs,
)

from ._brokers import MosquittoProcess
from ._language import tiny_recipe

PROMPTS, MAX_TOKENS = 5, 8


def _run(models: Any, broker: MosquittoProcess, **kw: Any) -> LlmDemoReport:
    config = LlmDemoConfig(
        prompts=PROMPTS, max_tokens=MAX_TOKENS, broker_url=broker.url,
        cache_dir=models.directory.parent, recipe=tiny_recipe(), **kw,
    )  # fmt: skip
    return run_llm_demo(config)


def _check_invariants(report: LlmDemoReport) -> None:
    assert [p.preset for p in report.presets] == ["edge_only", "cloud_only", "prefer_edge"]
    for summary in report.presets:
        turns = report.turns[summary.preset]
        assert summary.turns == len(turns) == len(report.prompts) == PROMPTS
        assert summary.edge_turns + summary.cloud_turns + summary.both_turns == summary.turns
        assert summary.edge_tokens + summary.cloud_tokens == summary.tokens
        assert summary.tokens == sum(t.output_tokens for t in turns)
        assert summary == summarize_preset(summary.preset, turns)
        for t in turns:
            assert t.edge_tokens + t.cloud_tokens == t.output_tokens <= MAX_TOKENS
            assert 0.0 <= t.agreement <= 1.0
            assert t.route_reason in ("edge_only", "cloud_only", "prefer_edge", "heavy")
            if t.route_reason == "heavy":  # sent to the hub: served there, or finished here
                assert summary.preset == "prefer_edge" and (t.side != "edge" or t.degraded)
        assert 0.0 <= summary.agreement <= 1.0
    edge, cloud, prefer = (report.preset(n) for n in ("edge_only", "cloud_only", "prefer_edge"))
    assert edge.tokens > 0 and edge.edge_tokens == edge.tokens and edge.cloud_tokens == 0
    assert edge.edge_turns == edge.turns and edge.heavy_turns == 0
    assert cloud.tokens > 0 and cloud.cloud_tokens == cloud.tokens and cloud.edge_tokens == 0
    assert cloud.cloud_turns == cloud.turns and cloud.degraded_turns == 0
    assert edge.deadline_turns == cloud.deadline_turns == 0  # the two run without a deadline
    assert prefer.heavy_turns == sum(t.route_reason == "heavy" for t in report.turns["prefer_edge"])
    for t in report.turns["prefer_edge"]:
        if t.route_reason != "heavy":
            assert t.side == "edge" and t.cloud_tokens == 0


def test_llm_demo_end_to_end(
    tiny_language_models: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    report = _run(tiny_language_models, mosquitto)
    _check_invariants(report)
    assert report.deadline_auto and report.deadline_ms > 0
    assert set(report.device_rates) == {"prefill", "decode"}

    files = write_llm_outputs(report, tmp_path / "out")
    assert files.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(files.report.read_text())
    assert [p["preset"] for p in data["presets"]] == ["edge_only", "cloud_only", "prefer_edge"]
    assert data["quality_measure"].startswith("token agreement")
    for preset, summary in zip(data["presets"], report.presets, strict=True):
        assert preset["tokens"] == summary.tokens
        turns = data["turns"][summary.preset]
        assert len(turns) == PROMPTS
        assert sum(t["edge_tokens"] + t["cloud_tokens"] for t in turns) == summary.tokens


def test_a_deadline_nothing_meets_sends_every_prefer_edge_turn_to_the_hub(
    tiny_language_models: Any, mosquitto: MosquittoProcess
) -> None:
    report = _run(tiny_language_models, mosquitto, deadline_ms=0.001)
    _check_invariants(report)
    prefer = report.preset("prefer_edge")
    assert not report.deadline_auto and report.deadline_ms == 0.001
    assert prefer.heavy_turns == prefer.turns
    assert prefer.edge_turns == 0 and prefer.edge_tokens == 0  # the hub's, or cut short there
