"""The learned router: trained from a calibration split, calibrated to a budget, kept as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from edge_agent import (
    EdgeAgent,
    LearnedScore,
    ModelLoadError,
    OffloadPolicy,
    RouterLoadError,
    Source,
    UncertainCheck,
    margin,
    to_probabilities,
)
from edge_agent._router_fit import L2_GRID
from edge_agent.runtimes import load_runtime

from ._brokers import MosquittoProcess
from ._responder import Responder
from .test_edge_agent import B_CLOUD, B_EDGE, W_CLOUD, W_EDGE, cloud_answer


def _pair(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edge logits, cloud logits, labels: the edge errs on class 3 whatever its confidence.

    Margin cannot see that (class 3 is as confident as the rest); a router that
    learns which class won can.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=n)
    edge = rng.normal(size=(n, 5))
    edge[np.arange(n), labels] += rng.uniform(0.5, 4.0, size=n)
    edge_answer = edge.argmax(axis=1)
    wrong = (edge_answer == 3) & (rng.random(n) < 0.6)
    labels = np.where(wrong, (edge_answer + 1) % 5, labels)
    cloud = np.full((n, 5), -3.0)
    cloud[np.arange(n), labels] = 3.0  # the cloud knows
    return edge, cloud, labels


def _gain_at(scores: np.ndarray, edge: np.ndarray, cloud: np.ndarray, y: np.ndarray) -> int:
    """Answers fixed minus answers broken by offloading the top 20% by score."""
    top = np.argsort(-scores, kind="stable")[: len(y) // 5]
    edge_right = edge.argmax(axis=1)[top] == y[top]
    cloud_right = cloud.argmax(axis=1)[top] == y[top]
    return int(cloud_right.sum() - edge_right.sum())


def _input_norm(inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    x = inputs["x"]
    return np.abs(x).reshape(len(x), -1).max(axis=1, keepdims=True)


@pytest.mark.parametrize("target", ["gain", "disagree"])
def test_a_router_learns_what_the_scores_cannot_see(target: str) -> None:
    edge, cloud, y = _pair(1500, seed=0)
    router = LearnedScore.fit(edge, cloud, y if target == "gain" else None)
    assert router.target == target
    test_edge, test_cloud, test_y = _pair(3000, seed=1)
    probs = to_probabilities(test_edge, "logits")
    learned = _gain_at(router(probs), test_edge, test_cloud, test_y)
    by_margin = _gain_at(margin(probs), test_edge, test_cloud, test_y)
    assert learned > by_margin
    assert np.all(np.isfinite(router(probs)))


def test_a_router_is_calibrated_to_the_budget_like_the_scores() -> None:
    edge, cloud, y = _pair(2000, seed=2)
    router = LearnedScore.fit(edge, cloud, y)
    policy = OffloadPolicy.learned(0.2, router, adapt=False, outputs="logits")
    policy.calibrate(edge)
    check = policy.uncertain
    assert check is not None and check.score_name == "learned:gain"
    stream, _, _ = _pair(4000, seed=3)
    offloaded = [check.decide(check.scores(row[None])).route.value == "cloud" for row in stream]
    assert abs(np.mean(offloaded) - 0.2) < 0.03


def test_a_router_travels_as_json_and_scores_the_same(tmp_path: Path) -> None:
    edge, cloud, y = _pair(800, seed=4)
    router = LearnedScore.fit(edge, cloud, y)
    path = tmp_path / "router.json"
    path.write_text("an older router")
    older = path.stat().st_ino
    router.save(path)  # written aside and renamed over: a reader sees one router or the other
    assert path.stat().st_ino != older and [p.name for p in tmp_path.iterdir()] == [path.name]
    document = json.loads(path.read_text())
    assert document["format"] == "tandem.learned-score/2" and document["classes"] == 5
    assert document["features"] == "ranked" and document["l2"] in L2_GRID
    again = LearnedScore.load(path)
    probs = to_probabilities(edge, "logits")
    np.testing.assert_array_equal(again(probs), router(probs))
    np.testing.assert_array_equal(again.weights, router.weights)
    assert (again.bias, again.target, again.l2) == (router.bias, router.target, router.l2)
    path.write_text('{"format": "something else"}')
    with pytest.raises(RouterLoadError, match="not a learned router"):
        LearnedScore.load(path)
    path.write_bytes(b"\x80\x04K\x01.")  # a pickle is not read, whatever it holds
    with pytest.raises(RouterLoadError, match="cannot read"):
        LearnedScore.load(path)


def test_a_router_with_input_features_travels_as_json_and_scores_the_same() -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(600, 16))
    edge, cloud = x @ W_EDGE + B_EDGE, x @ W_CLOUD + B_CLOUD
    router = LearnedScore.fit(
        edge, cloud, inputs={"x": x}, input_features=_input_norm, outputs="logits"
    )
    document = json.loads(json.dumps(router.to_dict()))
    assert document["input_features"] == 1 and document["uses_inputs"] is True
    with pytest.raises(RouterLoadError, match="pass input_features="):
        LearnedScore.from_dict(document)
    again = LearnedScore.from_dict(document, input_features=_input_norm)
    probs = to_probabilities(edge, "logits")
    np.testing.assert_array_equal(again.logits(probs, {"x": x}), router.logits(probs, {"x": x}))


def test_a_router_of_the_first_format_still_loads_and_scores_the_same() -> None:
    edge, cloud, y = _pair(800, seed=9)
    router = LearnedScore.fit(edge, cloud, y, features="basic")
    document = router.to_dict()
    first = {k: v for k, v in document.items() if k not in ("features", "input_features", "l2")}
    first["format"] = "tandem.learned-score/1"
    again = LearnedScore.from_dict(json.loads(json.dumps(first)))
    probs = to_probabilities(edge, "logits")
    assert again.features_kind == "basic" and again.weights.size == 4 + 5
    np.testing.assert_array_equal(again(probs), router(probs))


def _document() -> dict[str, object]:
    edge, cloud, y = _pair(400, seed=10)
    return json.loads(json.dumps(LearnedScore.fit(edge, cloud, y).to_dict()))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format": "tandem.learned-score/9"}, "not a learned router"),
        ({"target": "profit"}, "unknown router target"),
        ({"features": "everything"}, "unknown router feature set"),
        ({"classes": True}, "classes must be a positive integer"),
        ({"classes": 0}, "classes must be a positive integer"),
        ({"classes": 4}, "cannot score 4 classes"),
        ({"weights": "0.1,0.2"}, "'weights' must be a list of numbers"),
        ({"weights": [0.5] * 3}, "one value per feature"),
        ({"mean": [None] * 29}, "'mean' must be a list of numbers"),
        ({"scale": None}, "'scale' must be a list of numbers"),
        ({"bias": "1"}, "'bias' must be a number"),
        ({"bias": float("nan")}, "'bias' holds a value that is not finite"),
        ({"uses_inputs": True}, "pass input_features="),
    ],
)
def test_a_document_that_is_not_a_router_is_refused_with_a_typed_error(
    change: dict[str, object], match: str
) -> None:
    document = {**_document(), **change}
    with pytest.raises(RouterLoadError, match=match) as caught:
        LearnedScore.from_dict(json.loads(json.dumps(document)))
    assert isinstance(caught.value, ModelLoadError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("text", ["[1, 2, 3]", '"router"', "{", '{"weights": [Infinity]}'])
def test_a_file_that_is_not_a_router_is_refused_with_a_typed_error(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "router.json"
    path.write_text(text)
    with pytest.raises(RouterLoadError):
        LearnedScore.load(path)
    with pytest.raises(RouterLoadError, match="cannot read"):
        LearnedScore.load(tmp_path / "missing.json")


def test_updates_from_offloaded_samples_move_the_router_towards_what_the_cloud_said() -> None:
    edge, cloud, y = _pair(1000, seed=5)
    router = LearnedScore.fit(edge, cloud, y, target="disagree")
    # Live traffic: now the edge also errs on class 1, and offloads show the cloud differing.
    rng = np.random.default_rng(6)
    live = rng.normal(size=(400, 5))
    live[:, 1] += 3.0  # class 1 wins every row
    differs = np.full((400, 5), -3.0)
    differs[:, 2] = 3.0
    probs = to_probabilities(live, "logits")
    before = router(probs).mean()
    for _ in range(20):
        router.update(live, differs)
    assert router(probs).mean() > before


@pytest.mark.parametrize("edge_right", [True, False])
def test_updates_with_labels_move_the_router_towards_the_labels(edge_right: bool) -> None:
    edge, cloud, y = _pair(1000, seed=12)
    router = LearnedScore.fit(edge, cloud, y)
    rng = np.random.default_rng(13)
    live = rng.normal(size=(400, 5))
    live[:, 1] += 1.0  # class 1 wins most rows, not confidently
    answers = to_probabilities(live, "logits").argmax(axis=1)
    labels = answers if edge_right else (answers + 1) % 5
    cloud_live = np.full((400, 5), -3.0)
    cloud_live[np.arange(400), labels] = 3.0  # the cloud is right either way
    probs = to_probabilities(live, "logits")
    before = router.probability(probs).mean()
    for _ in range(20):
        router.update(live, cloud_live, labels)
    after = router.probability(probs).mean()
    # Offloading gains nothing where the edge was right, everything where it was wrong.
    assert (after < before) if edge_right else (after > before)


def test_fitting_is_deterministic_and_picks_its_penalty_from_the_grid() -> None:
    edge, cloud, y = _pair(900, seed=14)
    first, second = LearnedScore.fit(edge, cloud, y), LearnedScore.fit(edge, cloud, y)
    assert first.l2 in L2_GRID
    np.testing.assert_array_equal(first.weights, second.weights)
    fixed = LearnedScore.fit(edge, cloud, y, l2=1000.0)
    assert fixed.l2 == 1000.0
    assert np.abs(fixed.weights).sum() < np.abs(first.weights).sum()


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((np.zeros((0, 3)), np.zeros((0, 3))), {}, "non-empty"),
        ((np.eye(3), np.eye(4)), {}, "same non-empty shape"),
        ((np.eye(3), np.eye(3)), {}, "nothing to learn"),  # edge and cloud always agree
        ((np.eye(3), np.eye(3)[::-1]), {"target": "gain"}, "needs labels"),
        ((np.eye(3), np.eye(3)[::-1], np.arange(2)), {}, "2 labels for 3"),
        ((np.eye(3), np.eye(3)[::-1]), {"l2": 0.0}, "l2"),
        ((np.eye(3), np.eye(3)[::-1]), {"l2": "none"}, "l2"),
        ((np.eye(3), np.eye(3)[::-1]), {"features": "all"}, "unknown feature set"),
    ],
)
def test_fit_refuses_what_it_cannot_learn_from(
    args: tuple[np.ndarray, ...], kwargs: Mapping[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        LearnedScore.fit(*args, **kwargs)  # type: ignore[arg-type]


def test_a_router_scores_only_outputs_of_its_class_count() -> None:
    edge, cloud, y = _pair(500, seed=7)
    router = LearnedScore.fit(edge, cloud, y)
    with pytest.raises(ValueError, match="trained on 5 classes"):
        router(np.full((2, 4), 0.25))


def test_an_agent_routes_with_a_router_that_reads_the_inputs_too(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    rng = np.random.default_rng(8)
    calibration = rng.normal(size=(600, 16)).astype(np.float32)
    calibration[:100] *= 6.0  # big inputs: there the two models part ways
    edge = calibration @ W_EDGE + B_EDGE
    cloud = calibration @ W_CLOUD + B_CLOUD
    router = LearnedScore.fit(
        edge, cloud, inputs={"x": calibration}, input_features=_input_norm, outputs="logits"
    )
    check = UncertainCheck(router, budget=0.2, adapt=False, outputs="logits")
    policy = OffloadPolicy(uncertain=check)
    runtime = load_runtime(linear_onnx, name="linear")
    with (
        Responder(mosquitto.url, cloud_answer) as responder,
        EdgeAgent(
            runtime,
            device_id="learned-1",
            broker=mosquitto.url,
            cloud_model="linear",
            policy=policy,
        ) as agent,
    ):
        agent.calibrate(calibration)
        stream = rng.normal(size=(200, 16)).astype(np.float32)
        results = [agent.infer(row[None], deadline_ms=5000) for row in stream]
    cloud_rows = [r for r in results if r.source is Source.CLOUD]
    assert 0.05 < len(cloud_rows) / len(results) < 0.4
    assert len(responder.requests) == len(cloud_rows)
    assert all(r.score is not None and np.isfinite(r.score) for r in results)
