"""The text presets and the heavy rule (edge_agent.language._presets): pure decisions."""

from __future__ import annotations

import pytest

from edge_agent import InvalidInputError, TextOffloadUnavailableError
from edge_agent.language import DeviceRates, Preset, is_heavy, predicted_ms, route_text

RATES = DeviceRates(prefill_tokens_per_s=1000.0, decode_tokens_per_s=100.0)


def test_predicted_time_is_prefill_plus_decode_at_the_measured_rates() -> None:
    assert predicted_ms(500, 20, RATES) == pytest.approx(500 / 1000 * 1000 + 20 / 100 * 1000)
    assert predicted_ms(500, 20, None) is None  # a fresh agent has measured nothing
    assert predicted_ms(5, 5, DeviceRates(0.0, 100.0)) is None


def test_a_turn_is_heavy_when_its_prediction_misses_the_deadline() -> None:
    # 100 prompt tokens (100 ms) + 10 output tokens (100 ms) = 200 ms predicted.
    assert is_heavy(100, 10, 199.0, RATES)
    assert not is_heavy(100, 10, 201.0, RATES)
    assert not is_heavy(100, 10, None, RATES)  # no deadline: never heavy
    assert not is_heavy(100, 10, 1.0, None)  # unmeasured: never heavy


def _route(preset: str, deadline_ms: float | None, *, offload: bool) -> tuple[str, str, int]:
    route = route_text(
        preset, prompt_tokens=100, max_tokens=10, deadline_ms=deadline_ms, rates=RATES,
        offload_available=offload,
    )  # fmt: skip
    return route.side, route.reason, len(route.notes)


def test_routes_while_text_offload_does_not_exist() -> None:
    assert _route("edge_only", 1.0, offload=False) == ("edge", "edge_only", 0)
    assert _route("prefer_edge", None, offload=False) == ("edge", "prefer_edge", 1)
    assert _route("prefer_edge", 1.0, offload=False) == ("edge", "heavy", 1)  # heavy, kept
    for preset in ("prefer_cloud", "cloud_only"):
        with pytest.raises(TextOffloadUnavailableError, match="not available"):
            _route(preset, None, offload=False)


def test_routes_once_text_offload_exists() -> None:
    assert _route("edge_only", 1.0, offload=True) == ("edge", "edge_only", 0)
    assert _route("prefer_edge", 1000.0, offload=True) == ("edge", "prefer_edge", 0)
    assert _route("prefer_edge", 1.0, offload=True) == ("cloud", "heavy", 0)
    assert _route("prefer_cloud", None, offload=True) == ("cloud", "prefer_cloud", 0)
    assert _route("cloud_only", None, offload=True) == ("cloud", "cloud_only", 0)


def test_preset_names_are_firebase_s() -> None:
    firebase = ["edge_only", "prefer_edge", "prefer_cloud", "cloud_only"]
    assert [p.value for p in Preset] == [*firebase, "handoff", "speculative"]  # Tandem's own
    with pytest.raises(InvalidInputError, match="unknown preset 'PREFER_EDGE'"):
        Preset.parse("PREFER_EDGE")
    with pytest.raises(InvalidInputError, match="unknown preset 3"):
        Preset.parse(3)
