"""A device that shares its answers: the hub keeps what it got wrong, with its own words for it.

A real ``EdgeAgent`` on a local ONNX classifier that differs from the hub's
offloads over a real Mosquitto to an in-process hub whose config collects;
what the hub kept is read back from the store. Sharing is opt-in: an agent
without ``share_answers`` sends nothing about its answer, and nothing of its
requests is kept, whatever the hub's sample rate.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from cloud_hub import Hub
from edge_agent import EdgeAgent, ExampleSharing, OffloadPolicy
from shared import MqttSettings, Topics, input_digests
from shared.server import list_shards, load_examples
from shared.server.store import LocalBlobStore

from ._models import write_linear_classifier


@pytest.fixture
def setup(tmp_path: Path, mosquitto: Any) -> Iterator[dict[str, Any]]:
    repo = tmp_path / "repo"
    write_linear_classifier(repo / "linear" / "1" / "model.onnx", seed=0)
    collection = {"store": str(tmp_path / "examples")}
    (repo / "linear" / "config.json").write_text(json.dumps({"collection": collection}))
    settings = MqttSettings.from_url(mosquitto.url)
    topics = Topics(f"s-{uuid.uuid4().hex[:8]}/v1")
    hub = Hub(repo, mqtt=settings, topics=topics, share_group=None).start()
    local = write_linear_classifier(tmp_path / "edge" / "edge-linear.onnx", seed=1)
    try:
        yield {"hub": hub, "settings": settings, "topics": topics, "local": local,
               "store": LocalBlobStore(tmp_path / "examples")}  # fmt: skip
    finally:
        hub.stop()


def agent(setup: dict[str, Any], policy: OffloadPolicy, **kw: Any) -> EdgeAgent:
    return EdgeAgent(
        str(setup["local"]),
        device_id=f"cam-{uuid.uuid4().hex[:6]}",
        broker=setup["settings"],
        cloud_model="linear",
        policy=policy,
        topics=setup["topics"],
        probe_cloud=False,
        **kw,
    ).start(wait_s=10)


def rows(n: int) -> np.ndarray:
    return np.random.default_rng(3).normal(size=(n, 16)).astype(np.float32)


def settle(setup: dict[str, Any], requests: int, kept: int) -> None:
    """Wait until the hub answered ``requests`` and kept ``kept`` rows, then write them.

    (The collector sees a request just after its reply went out.)
    """
    import time

    from prometheus_client.parser import text_string_to_metric_families

    hub = setup["hub"]

    def collected() -> float:
        text = hub.prometheus.render().decode()
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "tandem_examples_collected_total"
        )

    deadline = time.monotonic() + 15
    while hub.mqtt_front.stats().get("replied_ok", 0) < requests or collected() < kept:
        assert time.monotonic() < deadline, "the hub did not answer in time"
        time.sleep(0.02)
    hub.collector.flush()


def test_the_hub_keeps_what_the_device_got_wrong_with_its_answer(setup: dict[str, Any]) -> None:
    x = rows(24)
    device = agent(setup, OffloadPolicy.threshold(-1.0), share_answers=ExampleSharing())
    try:
        results = [device.infer(x[i : i + 1]) for i in range(len(x))]
    finally:
        device.close()
    assert all(r.source.value == "cloud" for r in results)
    session = ort.InferenceSession(str(setup["local"]), providers=["CPUExecutionProvider"])
    local_top = session.run(None, {"x": x})[0].argmax(1)
    cloud_top = np.array([int(r.output.argmax()) for r in results])
    wrong = np.flatnonzero(local_top != cloud_top)
    assert len(wrong) > 3
    settle(setup, len(x), len(wrong))
    kept = load_examples(setup["store"], model="linear")
    assert len(kept) == len(wrong)  # the hub's sample rate is 0: disagreements only
    by_input = {bytes(k): i for i, k in enumerate(kept.input_sha256)}
    digests = input_digests({"x": x})
    for i in wrong:  # every disagreement is kept, with the device's own label and score
        j = by_input[bytes(digests[i])]
        assert kept.reasons[j] == "disagree"
        assert kept.edge_labels[j] == local_top[i] and kept.cloud_labels[j] == cloud_top[i]
        assert kept.edge_scores[j] == pytest.approx(results[i].score, abs=1e-5)
    assert set(kept.edge_models) == {results[0].model_versions["edge"]}
    assert set(kept.devices) == {device.device_id}


def test_a_heavy_request_shares_no_label_and_a_sampled_one_is_kept_anyway(
    setup: dict[str, Any],
) -> None:
    x = rows(6)
    device = agent(
        setup, OffloadPolicy.always_cloud(), share_answers=ExampleSharing(sample_rate=1.0)
    )
    try:
        for i in range(len(x)):
            device.infer(x[i : i + 1])
    finally:
        device.close()
    settle(setup, len(x), len(x))
    kept = load_examples(setup["store"], model="linear")
    assert len(kept) == 6 and set(kept.reasons) == {"sample"}
    assert (kept.edge_labels == -1).all() and np.isnan(kept.edge_scores).all()


def test_a_device_that_does_not_share_is_never_collected_from(setup: dict[str, Any]) -> None:
    x = rows(12)
    device = agent(setup, OffloadPolicy.threshold(-1.0))
    try:
        for i in range(len(x)):
            device.infer(x[i : i + 1])
    finally:
        device.close()
    settle(setup, len(x), 0)
    assert list_shards(setup["store"]) == []  # it disagreed with the cloud, but kept quiet


def test_sharing_rejects_a_rate_outside_zero_to_one() -> None:
    for rate in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="sample_rate"):
            ExampleSharing(sample_rate=rate)  # type: ignore[arg-type]
