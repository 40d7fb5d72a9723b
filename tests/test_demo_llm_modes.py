"""``tandem demo --llm --mode``: the collaborative and speculative modes, end to end and pure.

End to end on the tiny pair through a real Mosquitto, hub and agent (as
``tests/test_demo_llm.py``: few prompts, few tokens). No figure is expected
to take a value; what must hold is checked: the speculative text is
cloud_only's token for token on every prompt and the hub made one forward
pass per round; a handed-off turn's hub tokens are the rest of the turn after
a full window, so the hub's share lies between 0 and a bound computed from the
turns, and it is the share the policy itself counted; the calibration prompts
are not the shown ones; the JSON says what the report says.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edge_agent.language import SpecStats, expected_tokens
from tandem.cli import app
from tandem.cli._llm_view import LLM_MODES, render_llm
from tandem.demo.language import (
    MODE_ROWS,
    MODES,
    LlmDemoConfig,
    LlmDemoReport,
    TurnFacts,
    acceptance_from_tokens,
    gap_recovered,
    hub_ms_per_token,
    hub_token_share,
    modes_of,
    presets_to_run,
    run_llm_demo,
    split_calibration,
    summarize_preset,
    write_llm_outputs,
)
from tandem.demo.language._demo_mode_run import _with_hub_agreement, handoff_window
from tandem.demo.language._demo_modes import speculative_facts

from ._brokers import MosquittoProcess
from ._language import tiny_recipe

PROMPTS, MAX_TOKENS, CALIBRATION = 4, 8, 4


def _run(models: Any, broker: MosquittoProcess, mode: str, **kw: Any) -> LlmDemoReport:
    config = LlmDemoConfig(
        prompts=PROMPTS, max_tokens=MAX_TOKENS, broker_url=broker.url, mode=mode,
        calibration_prompts=CALIBRATION, cache_dir=models.directory.parent,
        recipe=tiny_recipe(), **kw,
    )  # fmt: skip
    return run_llm_demo(config)


def _check_rows(report: LlmDemoReport) -> None:
    """Every preset once, summarized from its turns, compared with cloud_only's text."""
    names = [p.preset for p in report.presets]
    assert len(names) == len(set(names)) == len(presets_to_run(report.modes))
    for summary in report.presets:
        turns = report.turns[summary.preset]
        assert summary.turns == len(turns) == len(report.prompts) == PROMPTS
        assert summary == summarize_preset(summary.preset, turns)
        assert summary.edge_tokens + summary.cloud_tokens == summary.tokens
        for t in turns:
            assert t.edge_tokens + t.cloud_tokens == t.output_tokens <= MAX_TOKENS
            assert t.hub_agreement is not None and 0.0 <= t.hub_agreement <= 1.0
    assert all(t.hub_agreement == 1.0 for t in report.turns["cloud_only"])  # itself


def _check_collaborative(report: LlmDemoReport) -> None:
    c = report.collaborative
    assert c is not None and c.unit == "tokens" and c.window == handoff_window(MAX_TOKENS)
    assert [p.preset for p in report.rows("collaborative")] == list(MODE_ROWS["collaborative"])
    shown = {p.prompt_ids for p in report.prompts}
    assert len(report.calibration) == c.calibration_prompts == CALIBRATION
    assert shown.isdisjoint(p.prompt_ids for p in report.calibration)
    turns = report.turns["handoff"]
    for t in turns:
        if t.handoff_at is None:  # stayed on the device
            assert t.cloud_tokens == 0 and t.edge_tokens == t.output_tokens
        else:  # the device's tokens up to a full window, the hub's after
            assert t.handoff_at >= c.window and t.edge_tokens == t.handoff_at
    edge = report.preset("edge_only")
    assert edge.cloud_tokens == 0 and edge.handed_off_turns == 0
    bound = sum(max(0, t.output_tokens - c.window) for t in turns)
    hub = sum(t.cloud_tokens for t in turns)
    assert 0 <= hub <= bound
    assert c.realized_share == hub_token_share(turns) == hub / sum(t.output_tokens for t in turns)
    assert c.policy_share == pytest.approx(c.realized_share)  # the policy counted the same
    assert c.handed_off_turns == report.preset("handoff").handed_off_turns
    rows = {p.preset: p for p in report.rows("collaborative")}
    assert _same(
        c.gap_recovered_hub,
        gap_recovered(rows["edge_only"].hub_agreement, 1.0, rows["handoff"].hub_agreement),
    )


def _check_speculative(report: LlmDemoReport) -> None:
    s = report.speculative
    assert s is not None
    assert [p.preset for p in report.rows("speculative")] == list(MODE_ROWS["speculative"])
    assert s.identical == (True,) * PROMPTS and s.all_identical
    assert all(t.hub_agreement == 1.0 for t in report.turns["speculative"])
    spec = report.preset("speculative")
    assert spec.tokens == report.preset("cloud_only").tokens == s.generated_tokens
    assert s.rounds >= PROMPTS and s.accepted <= s.drafted
    assert s.accepted + s.hub_tokens + s.alone_tokens == s.generated_tokens
    assert s.passes_source == "hub" and s.hub_forward_passes == s.rounds  # one pass a round
    assert s.passes_per_token == s.hub_forward_passes / s.generated_tokens
    assert s.pays == (s.hub_ms_per_token > s.crossover_ms)
    assert "crossover" in s.verdict()


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


def test_all_modes_end_to_end(
    tiny_language_models: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    report = _run(tiny_language_models, mosquitto, "all")
    assert report.modes == ("presets", "collaborative", "speculative")
    _check_rows(report)
    _check_collaborative(report)
    _check_speculative(report)

    files = write_llm_outputs(report, tmp_path / "out")
    assert [p.name for p in files.plots] == [f"llm_{m}.png" for m in report.modes]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in files.plots)
    data = json.loads(files.report.read_text())
    assert data["mode"] == "all" and list(data["modes"]) == list(report.modes)
    collab, spec = data["modes"]["collaborative"], data["modes"]["speculative"]
    assert collab["rows"] == list(MODE_ROWS["collaborative"])
    assert collab["realized_share"] == report.collaborative.realized_share  # type: ignore[union-attr]
    assert spec["all_identical"] is True and spec["identical"] == [True] * PROMPTS
    assert len(data["calibration_prompt_ids"]) == CALIBRATION
    assert {p["preset"] for p in data["presets"]} == set(report.turns)
    assert all(t["handoff_at"] is None for t in data["turns"]["edge_only"])

    from rich.console import Console

    console = Console(record=True, width=240)
    render_llm(report, console)
    text = console.export_text()
    assert "same text" in text and "hub share" in text and "crossover" in text


def test_a_whole_budget_hands_every_turn_off_after_its_first_window(
    tiny_language_models: Any, mosquitto: MosquittoProcess
) -> None:
    """Budget 1: the threshold sits under every calibration window, so each shown turn
    moves to the hub as soon as its window is full (the bound above, reached)."""
    report = _run(tiny_language_models, mosquitto, "collaborative", budget=1.0)
    assert report.modes == ("collaborative",)
    _check_rows(report)
    _check_collaborative(report)
    c = report.collaborative
    assert c is not None and c.calibrated_threshold == -math.inf  # under every window
    turns = report.turns["handoff"]
    assert all(t.handoff_at == c.window for t in turns if t.output_tokens > c.window)
    assert c.handed_off_turns == sum(t.output_tokens > c.window for t in turns) > 0


def test_speculative_mode_alone(tiny_language_models: Any, mosquitto: MosquittoProcess) -> None:
    report = _run(tiny_language_models, mosquitto, "speculative")
    assert report.modes == ("speculative",) and report.collaborative is None
    assert set(report.turns) == {"cloud_only", "speculative"}
    _check_rows(report)
    _check_speculative(report)


# --------------------------------------------------------------------------- pure


def test_modes_and_the_presets_they_run() -> None:
    assert LLM_MODES == MODES  # the CLI names them without importing the demo
    assert modes_of("all") == ("presets", "collaborative", "speculative")
    assert modes_of("speculative") == ("speculative",)
    assert presets_to_run(modes_of("all")) == (
        "edge_only", "cloud_only", "prefer_edge", "handoff", "speculative",
    )  # fmt: skip
    assert presets_to_run(["speculative"]) == ("cloud_only", "speculative")
    with pytest.raises(ValueError, match="mode"):
        modes_of("fast")
    with pytest.raises(ValueError, match="mode"):
        LlmDemoConfig(mode="fast")
    with pytest.raises(ValueError, match="budget"):
        LlmDemoConfig(budget=1.5)


@pytest.mark.parametrize(("n", "count"), [(12, 4), (5, 4), (9, 1), (3, 0)])
def test_split_calibration_spreads_over_the_prompts_and_keeps_order(n: int, count: int) -> None:
    shown, calibration = split_calibration(list(range(n)), count)
    assert len(calibration) == count and len(shown) == n - count
    assert sorted(shown + calibration) == list(range(n)) and shown == sorted(shown)
    if count > 1:
        gaps = [b - a for a, b in itertools.pairwise(calibration)]
        assert max(gaps) - min(gaps) <= 1  # evenly spread
    with pytest.raises(ValueError, match="none"):
        split_calibration(list(range(n)), n)


def test_gap_recovered() -> None:
    assert gap_recovered(0.2, 0.6, 0.5) == pytest.approx(0.75)
    assert gap_recovered(0.2, 0.6, 0.2) == 0.0
    assert math.isnan(gap_recovered(0.4, 0.4, 0.5))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("k", [1, 4])
def test_acceptance_from_tokens_inverts_expected_tokens(alpha: float, k: int) -> None:
    assert acceptance_from_tokens(expected_tokens(alpha, k), k) == pytest.approx(alpha, abs=1e-9)


def _spec(rounds: int, accepted: int, hub: int, *, ahead: int = 0) -> SpecStats:
    return SpecStats(rounds=rounds, drafted=4 * rounds, accepted=accepted, hub_tokens=hub,
                     rtt_ms=(3.0,) * rounds, k=(4,) * rounds, ahead_used=ahead)  # fmt: skip


def test_speculative_facts_fold_the_turns_and_judge_the_crossover() -> None:
    stats = [_spec(2, 6, 2), _spec(3, 5, 3)]
    fast = speculative_facts(stats, [True, False], generated_tokens=16, hub_forward_passes=None,
                             hub_ms_per_token=1.0, draft_ms_per_token=0.5)  # fmt: skip
    assert (fast.rounds, fast.accepted, fast.hub_tokens) == (5, 11, 5)
    assert fast.accepted_per_round == pytest.approx(11 / 5)
    assert fast.passes_source == "rounds" and fast.passes_per_token == pytest.approx(5 / 16)
    assert fast.identical == (True, False) and not fast.all_identical
    assert fast.acceptance == pytest.approx(acceptance_from_tokens(16 / 5, 4))
    assert math.isfinite(fast.crossover_ms) and not fast.pays  # a 1 ms hub: too fast
    assert "too fast" in fast.verdict() and "Measured end to end" in fast.verdict()
    slow = speculative_facts(stats, [True, True], generated_tokens=16, hub_forward_passes=7,
                             hub_ms_per_token=50.0, draft_ms_per_token=0.5)  # fmt: skip
    assert slow.pays and slow.hub_forward_passes == 7 and slow.passes_source == "hub"
    assert "slow enough" in slow.verdict()
    json.dumps(slow.to_dict())


def test_hub_token_share_of_nothing_is_nan() -> None:
    assert math.isnan(hub_token_share([]))


def _cloud(tokens: int, ttft: float | None, total: float) -> TurnFacts:
    return TurnFacts(prompt_tokens=5, output_tokens=tokens, edge_tokens=0, cloud_tokens=tokens,
                     side="cloud", agreement=0.0, ttft_ms=ttft, tokens_per_s=None,
                     total_ms=total, finish_reason="length", route_reason="cloud_only")  # fmt: skip


def test_every_turn_is_compared_with_cloud_only_s_tokens_on_its_own_prompt() -> None:
    turns = {"edge_only": [_cloud(2, 1.0, 2.0), _cloud(2, 1.0, 2.0)], "cloud_only": []}
    turns["cloud_only"] = list(turns["edge_only"])
    ids = {"edge_only": [(1, 2), (3, 9)], "cloud_only": [(1, 5), (3, 4)]}
    out = _with_hub_agreement(turns, ids, ids["cloud_only"])
    assert [t.hub_agreement for t in out["edge_only"]] == [0.5, 0.5]
    assert [t.hub_agreement for t in out["cloud_only"]] == [1.0, 1.0]
    ids["edge_only"] = [(1, 5), (9, 9)]
    out = _with_hub_agreement(turns, ids, ids["cloud_only"])
    assert [t.hub_agreement for t in out["edge_only"]] == [1.0, 0.0]  # prompt by prompt


def test_hub_time_per_token_is_the_time_between_tokens_after_the_first() -> None:
    turns = [_cloud(11, 9.0, 29.0), _cloud(5, 1.0, 5.0), _cloud(1, 3.0, 3.0), _cloud(0, None, 1.0)]
    assert hub_ms_per_token(turns) == pytest.approx(2.0)  # median of 2, 1 and 3 (one token)
    assert math.isnan(hub_ms_per_token([_cloud(0, None, 1.0)]))


def test_cli_help_names_every_mode() -> None:
    result = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--mode" in result.output
    for mode in MODES:
        assert mode in result.output


def test_cli_mode_without_llm_is_refused_at_once() -> None:
    result = CliRunner().invoke(app, ["demo", "--mode", "speculative"])
    assert result.exit_code == 2 and "--llm" in result.output
    result = CliRunner().invoke(app, ["demo", "--llm", "--mode", "fast"])
    assert result.exit_code == 2 and "presets" in result.output
    result = CliRunner().invoke(app, ["demo", "--pair", "speculative"])
    assert result.exit_code == 2 and "--llm" in result.output
    result = CliRunner().invoke(app, ["demo", "--llm", "--pair", "huge"])
    assert result.exit_code == 2 and "speculative" in result.output
