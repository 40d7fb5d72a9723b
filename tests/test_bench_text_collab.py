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
from bench._text_collab_spec import spec_figures
from bench._text_collab_tables import quality_targets


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


def _spec_turn(tokens: int, rounds: int, drafted: int, accepted: int, e2e: float) -> dict:
    stats = {"rounds": rounds, "drafted": drafted, "accepted": accepted,
             "hub_tokens": rounds, "resent": 0, "ahead_used": 0, "alone_tokens": 0,
             "rtt_ms": [10.0] * rounds, "k": [2] * (rounds - 1) + [4]}  # fmt: skip
    return {"tokens": tokens, "e2e_s": e2e, "speculation": stats}


def test_spec_figures_worked_by_hand() -> None:
    spec = {"turns": [_spec_turn(6, 2, 6, 4, 0.1), _spec_turn(4, 2, 4, 2, 0.3)],
            "texts": ["ab", "cd"], "e2e_s": 0.2}  # fmt: skip
    cloud = {"measured": True, "turns": [{"e2e_s": 0.2}, {"e2e_s": 0.3}], "texts": ["ab", "cx"],
             "e2e_s": 0.25}  # fmt: skip
    got = spec_figures(spec, cloud)
    assert got["forwards_per_token"] == pytest.approx(4 / 10)  # one hub forward a round
    assert got["acceptance"] == pytest.approx(6 / 10)
    assert got["tokens_per_round"] == pytest.approx((6 + 4) / 4)
    assert got["k"] == {"median": 3, "min": 2, "max": 4}  # k: 2, 4, 2, 4
    assert (got["identical"], got["prompts"], got["differs"]) == (1, 2, [1])
    assert got["e2e_ratio"] == pytest.approx(0.8) and got["e2e_lower"] == pytest.approx(0.2)
    assert got["e2e_ratio_per_prompt"] == pytest.approx(0.75)  # median of 0.5 and 1.0
    with pytest.raises(ValueError):
        spec_figures(spec, {**cloud, "texts": ["ab"]})


def _quality(off: float) -> dict:
    row = {"budget": 0.3, "hub_token_share": 0.3, "value": 0.5, "gap_recovered": 0.95,
           "gap_se": 0.01}  # fmt: skip
    part = {"edge": 0.1, "hub": 0.2, "positions": 10, "routers": {"prompt": [row]}}
    share = {"share": 0.3 + off / 100, "off_by_points": off, "turns": 9}
    best = {"router": "prompt", "gap_recovered": 0.95, "hub_token_share": 0.3, "gap_se": 0.01,
            "met": True}  # fmt: skip
    return {"accuracy": part, "hub_loglik": part, "settings": {"budget": 0.3},
            "target": {"accuracy": best, "hub_loglik": best},
            "budget_adherence": {f"{s}/{u}/adapt": share for s in
                                 ("heldout", "longer_prompts", "other_documents")
                                 for u in ("tokens", "turns")}}  # fmt: skip


def test_the_budget_target_is_met_within_two_points_only() -> None:
    gap_a, gap_b, share = quality_targets(_quality(1.9), quick=False)
    assert gap_a["met"] and gap_b["met"] and share["met"] and share["limited_by"] is None
    assert "95.0%" in gap_a["measured"]
    assert quality_targets(_quality(-2.1), quick=False)[2]["met"] is False
    assert all(t["met"] is None for t in quality_targets(_quality(0.0), quick=True))
    assert all(t["measured"] == "not measured in this run"
               for t in quality_targets({"error": "x"}, quick=False))  # fmt: skip


def test_benchmarks_md_is_rendered_from_the_results() -> None:
    # Every bench/results/*.json is a part (a file without "part" breaks the render), and
    # BENCHMARKS.md is exactly what they render to (re-render after a part's run).
    from bench._report import MARKDOWN, RESULTS_DIR

    for path in RESULTS_DIR.glob("*.json"):
        assert "part" in json.loads(path.read_text()), path.name
    assert render(RESULTS_DIR, relative_to=MARKDOWN.parent) == MARKDOWN.read_text()
