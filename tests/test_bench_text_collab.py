"""Bench part i (bench/text_collab.py) in quick mode on the tiny pair: a well-formed result.

Structure, not figures: every row at every round trip, the targets in the
report's shape, the speculative rows' text identical to cloud-only's on every
prompt (greedy) with their round statistics, the handoff+budget rows from the
quality measure (run once: link-independent) with its two tables, and a
BENCHMARKS.md section rendered from the JSON. The crossover's arithmetic is
checked on numbers worked by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import text_collab
from bench._report import render, write_result
from bench._text_collab_cross import crossover_at, expected_tokens, hub_threshold_s


def test_quick_mode_writes_a_well_formed_result(tiny_language_models: Any, tmp_path: Path) -> None:
    result = text_collab.run(quick=True, models=tiny_language_models)
    rtts = [f"{r:g}" for r in text_collab.QUICK["rtts"]]
    assert result["part"] == "text-collab"
    assert set(result["data"]["results"]) == set(text_collab.ROWS)
    for name, by_rtt in result["data"]["results"].items():
        assert list(by_rtt) == rtts, name
    for rtt in rtts:
        for name in ("cloud_only", "prefer_edge"):
            row = result["data"]["results"][name][rtt]
            assert row["measured"] and row["failed"] == 0
            assert len(row["turns"]) == text_collab.QUICK["prompts"]
            assert all(t["ttft_s"] is not None and t["tokens"] > 0 for t in row["turns"])
        cloud = result["data"]["results"]["cloud_only"][rtt]["turns"]
        edge = result["data"]["results"]["prefer_edge"][rtt]["turns"]
        assert all(t["cloud_tokens"] == t["tokens"] for t in cloud)  # the hub answered
        assert all(t["edge_tokens"] == t["tokens"] for t in edge)  # the device answered
    for target in result["targets"]:
        assert set(target) == {"name", "target", "measured", "met", "limited_by"}
    names = [t["name"] for t in result["targets"]]
    assert sum(n.startswith("speculative") for n in names) == 3
    assert sum(n.startswith("handoff + budget") for n in names) == 3
    assert all(t["measured"] != "not measured in this run" for t in result["targets"])
    for rtt in rtts:
        spec = result["data"]["results"]["speculative"][rtt]
        assert spec["measured"] and spec["failed"] == 0
        assert spec["identical"] == spec["prompts"] == text_collab.QUICK["prompts"]
        assert all(t["speculation"] and t["speculation"]["rounds"] > 0 for t in spec["turns"])
        assert spec["rounds"] == sum(t["speculation"]["rounds"] for t in spec["turns"])
        assert 0 < spec["forwards_per_token"] <= 1.0  # a round commits at least one token
        assert 1 <= spec["k"]["min"] <= spec["k"]["median"] <= spec["k"]["max"] <= 16
        hand = result["data"]["results"]["handoff_budget"][rtt]
        assert hand["measured"] and hand["link_independent"]
    quality = result["data"]["quality"]
    assert {"accuracy", "hub_loglik", "budget_adherence", "target"} <= set(quality)
    titles = [t["title"] for t in result["tables"]]
    assert any(t.startswith("Speculative decoding") for t in titles)
    assert sum(t.startswith("Handoff + budget") for t in titles) == 2
    spec_rows = next(t for t in result["tables"] if t["title"].startswith("Speculative"))
    assert len(spec_rows["rows"]) == len(rtts)
    assert all(len(r) == len(spec_rows["columns"]) for r in spec_rows["rows"])
    assert 0.0 <= result["data"]["agreement"]["agreement"] <= 1.0
    assert len(result["data"]["crossover"]) == len(rtts)
    pings = result["data"]["mqtt_round_trip_s"]
    assert list(pings) == rtts and all(p is not None and p > 0 for p in pings.values())
    result.update(duration_s=1.0, hardware={"cpu_model": "cpu", "logical_cpus": 2,
                                            "python": "3", "date_utc": "today"})  # fmt: skip
    path = write_result(result, tmp_path)
    assert json.loads(path.read_text())["part"] == "text-collab"
    assert "## (i) Text collaboration across a delayed link" in render(tmp_path)


def test_expected_tokens_per_round() -> None:
    assert expected_tokens(0.0, 4) == 1.0  # nothing accepted: the hub's own token
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25


def test_the_crossover_worked_by_hand() -> None:
    # p = 0.5, k = 2: E = 1.75; rtt 50 ms, drafts free: h* = 0.05 / 0.75.
    threshold, _ = hub_threshold_s(0.5, 2, 0.05, 0.0)
    assert threshold == pytest.approx(0.05 / 0.75)
    assert hub_threshold_s(0.0, 3, 0.05, 0.0)[0] == math.inf  # never accepted: never wins
    slow_hub = crossover_at(0.9, 0.02, 0.030, 0.001)
    assert slow_hub.wins and slow_hub.max_rtt_s > 0.02
    fast_hub = crossover_at(0.9, 0.1, 0.001, 0.001)
    assert not fast_hub.wins and fast_hub.max_rtt_s < 0.1
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)
