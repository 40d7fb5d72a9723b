"""Every script in examples/ runs, against the local services the other tests use.

Each example's ``main`` takes the broker to use; here that is the session's
Mosquitto (run alone, an example starts an in-process broker instead). The
hub, the CDN and the HTTP servers are the real ones, in process. What each
test checks is what its example is there to show.
"""

from __future__ import annotations

import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ._brokers import MosquittoProcess

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Callable[..., Any]]:
    """``example("name")`` is that script's ``main`` (examples import their folder's helpers)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))

    def load(name: str) -> Callable[..., Any]:
        return runpy.run_path(str(EXAMPLES / f"{name}.py"))["main"]  # type: ignore[no-any-return]

    return load


@pytest.mark.slow
def test_collaborative_mnist_example_runs_and_uses_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = runpy.run_path(str(EXAMPLES / "collaborative_mnist.py"))
    outcome = namespace["main"](n=120)
    assert set(outcome["sources"]) == {"edge", "cloud"}
    assert outcome["accuracy"] > 0.8
    assert "accuracy" in capsys.readouterr().out


@pytest.mark.slow
def test_async_service_answers_concurrent_http_requests_from_both_sides(
    example: Callable[[str], Callable[..., Any]], mosquitto: MosquittoProcess
) -> None:
    outcome = example("async_service")(broker_url=mosquitto.url, n=120)
    sources, reasons = outcome["sources"], outcome["reasons"]
    assert sum(sources.values()) == 120  # every request answered
    # Both sides answer; on a loaded machine a few calls may also miss the hub's
    # deadline, and those come back as the local answer, marked degraded.
    assert {"edge", "cloud"} <= set(sources) <= {"edge", "cloud", "edge-fallback"}
    assert outcome["degraded"] == sources.get("edge-fallback", 0)
    assert {"confident", "uncertain"} <= set(reasons)
    others = set(reasons) - {"confident", "uncertain"}
    assert all(r.startswith(("fallback:", "heavy:")) for r in others), others
    assert outcome["accuracy"] > 0.9
    assert outcome["nan_status"] == 422  # the agent's InvalidInputError, as the client's error


@pytest.mark.slow
def test_tflite_device_runs_on_xnnpack_when_its_delegate_is_missing(
    example: Callable[[str], Callable[..., Any]], mosquitto: MosquittoProcess
) -> None:
    outcome = example("tflite_device")(broker_url=mosquitto.url, n=150)
    if "XNNPACK" not in outcome["accelerator"]:
        pytest.fail(f"this LiteRT build has no XNNPACK delegate: {outcome['accelerator']}")
    assert "libedgetpu" in outcome["fallback_reason"]
    assert set(outcome["sources"]) == {"edge", "cloud"}
    assert outcome["accuracy"] > 0.85


@pytest.mark.slow
def test_custom_score_and_heavy_rules_route_as_written(
    example: Callable[[str], Callable[..., Any]], mosquitto: MosquittoProcess
) -> None:
    outcome = example("custom_policy")(broker_url=mosquitto.url, n=150)
    assert outcome["score"] == "confusable_margin"
    assert set(outcome["reasons"]) == {"confident", "uncertain"}
    assert outcome["batch"] == ("cloud", "heavy:input_size", 16)
    assert outcome["background"] == ("cloud", "heavy:background")
    assert outcome["accuracy"] > 0.9


@pytest.mark.slow
def test_a_fresh_device_is_cloud_only_until_its_first_model_arrives_from_the_cdn(
    example: Callable[[str], Callable[..., Any]], mosquitto: MosquittoProcess
) -> None:
    outcome = example("first_model_from_cdn")(broker_url=mosquitto.url, n=60)
    assert outcome["before"] == {"no_local_model": 60}
    assert outcome["report"] == "installed"
    assert outcome["installed"] == "mnist-edge@1"
    assert outcome["after"].get("edge", 0) > 30


@pytest.mark.slow
def test_tritonclient_classifies_through_the_hub_unchanged(
    example: Callable[[str], Callable[..., Any]],
) -> None:
    outcome = example("triton_client")(n=96)
    assert outcome["inputs"] == [("image", "FP32", [-1, 1, 28, 28])]
    assert outcome["accuracy"] > 0.9
