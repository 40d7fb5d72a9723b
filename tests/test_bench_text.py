"""bench/_text_audit.py: what text-hub-kills counts and text-stream-tpot computes (no timing)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench._text_audit import (
    TurnSeen,
    audit,
    outcome,
    paired_ratio,
    ratio_of_medians,
    sent_texts,
    tpot_s,
    wire_repeats,
)

HUB = "abcdefgh"
WHOLE = TurnSeen(
    chunks=((0, "cloud", "abc"), (1, "cloud", "defgh")),
    text="abcdefgh", error=None, degraded=False, hub_expected=HUB,
)  # fmt: skip
SPLICED = TurnSeen(
    chunks=((0, "cloud", "abc"), (1, "edge", "xyz")),
    text="abcxyz", error=None, degraded=True, hub_expected=HUB, local_expected="xyz",
)  # fmt: skip


def test_whole_turns_by_the_hub_degraded_and_local() -> None:
    assert audit(WHOLE) == [] and outcome(WHOLE) == "hub"
    assert audit(SPLICED) == [] and outcome(SPLICED) == "degraded"
    local = replace(SPLICED, chunks=((0, "edge", "xyz"),), text="xyz")
    assert audit(local) == [] and outcome(local) == "local"


@pytest.mark.parametrize(
    "turn",
    [
        replace(WHOLE, raised=True, text=None),
        replace(WHOLE, text=None),
        replace(WHOLE, error="the hub failed"),
        replace(WHOLE, chunks=(), text=""),
    ],
)
def test_a_turn_without_a_whole_result_is_lost(turn: TurnSeen) -> None:
    assert audit(turn) == ["lost"] and outcome(turn) == "lost"


def test_a_chunk_delivered_twice_is_a_repeat() -> None:
    twice = replace(WHOLE, chunks=(*WHOLE.chunks, (1, "cloud", "defgh")), text="abcdefghdefgh")
    assert "repeated index" in audit(twice)
    assert "hub text" in audit(twice)  # the hub's text is no longer its greedy prefix


def test_a_skipped_index_or_a_gap_in_the_hub_text_is_missing() -> None:
    skipped = replace(WHOLE, chunks=((0, "cloud", "abc"), (2, "cloud", "defgh")))
    assert audit(skipped) == ["missing index"]
    gap = replace(SPLICED, chunks=((0, "cloud", "ab"), (1, "cloud", "d"), (2, "edge", "xyz")),
                  text="abdxyz")  # fmt: skip
    assert audit(gap) == ["hub text"]
    short = replace(WHOLE, chunks=((0, "cloud", "abc"),), text="abc")
    assert audit(short) == ["hub text short"]


def test_text_repeated_at_the_splice_is_caught() -> None:
    # The device went on from the prompt alone, not from the hub's text: "abc" twice.
    again = replace(SPLICED, chunks=((0, "cloud", "abc"), (1, "edge", "abcxyz")),
                    text="abcabcxyz")  # fmt: skip
    assert audit(again) == ["splice"]


def test_record_text_and_source_order() -> None:
    assert audit(replace(WHOLE, text="abcdefgX")) == ["text != chunks"]
    hub_after_device = replace(SPLICED, chunks=((0, "edge", "xyz"), (1, "cloud", "abc")),
                               text="xyzabc")  # fmt: skip
    assert "source order" in audit(hub_after_device)


def test_wire_repeats_counts_frames_beyond_their_first() -> None:
    frames = [("r1", "chunk", 0), ("r1", "chunk", 1), ("r1", "chunk", 1), ("r1", "final", 2),
              ("r2", "chunk", 0), ("r1", "chunk", 1)]  # fmt: skip
    assert wire_repeats(frames) == 2
    assert wire_repeats([("r1", "chunk", 0), ("r2", "chunk", 0)]) == 0


def test_tpot_is_first_to_last_token_over_tokens_less_one() -> None:
    assert tpot_s(1.0, 2.0, 11) == pytest.approx(0.1)
    assert tpot_s(1.0, 1.0, 1) is None and tpot_s(1.0, 1.0, 0) is None
    assert ratio_of_medians([1.0, 3.0, 2.0], [4.0, 4.0, 1.0]) == pytest.approx(0.5)


def test_paired_ratio_compares_each_round_s_two_paths() -> None:
    # A load that doubles both paths' times in the later rounds cancels out per round.
    assert paired_ratio([1.0, 2.0, 2.2], [1.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert paired_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 1.0]) == pytest.approx(4.0)
    assert ratio_of_medians([1.0, 2.0, 2.2], [1.0, 1.0, 2.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_the_hub_s_text_on_the_wire_must_be_what_the_device_showed() -> None:
    frames = [("r1", "chunk", 1, "def"), ("r1", "chunk", 0, "abc"), ("r1", "chunk", 1, "def"),
              ("r1", "final", 2, ""), ("r2", "chunk", 0, "x")]  # fmt: skip
    assert sent_texts(frames) == {"r1": "abcdef", "r2": "x"}
    spliced = replace(SPLICED, hub_sent="abc")
    assert audit(spliced) == []
    # The hub sent "abcdef" but the device showed "abc" and went on from there.
    assert audit(replace(SPLICED, hub_sent="abcdef")) == ["hub chunk not shown"]
