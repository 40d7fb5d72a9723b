"""Hard examples kept at the hub: disagreements and a sample, capped per device, private on
request, retained within a budget, counted.

A real Mosquitto carries the requests; the hub serves a real ONNX classifier;
a bare paho client plays a device that shares its answers (``shared.EdgeAnswer``
in the request header, as ``edge_agent`` writes it). What the hub kept is read
back from the store with the same reader a training job uses.
"""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud_hub import CollectionConfig, Hub, HubResult, ModelConfig, ModelConfigError
from cloud_hub.collect._collector import ExampleCollector
from cloud_hub.collect._rules import shards_to_delete
from shared import EdgeAnswer, Message, MqttSettings, Topics, input_digests, top_classes
from shared.server import list_shards, load_examples
from shared.server.store import LocalBlobStore

from ._models import linear_classifier_weights, write_linear_classifier
from ._mqtt_device import Device

MODEL = "linear"


def cloud_logits(x: np.ndarray) -> np.ndarray:
    weight, bias = linear_classifier_weights()
    return x @ weight + bias


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


@pytest.fixture
def topics() -> Topics:
    return Topics(f"c-{uuid.uuid4().hex[:8]}/v1")


def make_repo(tmp_path: Path, **collection: Any) -> tuple[Path, LocalBlobStore]:
    repo = tmp_path / "repo"
    write_linear_classifier(repo / MODEL / "1" / "model.onnx")
    store_dir = tmp_path / "examples"
    config = {"max_batch_size": 8, "collection": {"store": str(store_dir), **collection}}
    (repo / MODEL / "config.json").write_text(json.dumps(config))
    return repo, LocalBlobStore(store_dir)


@pytest.fixture
def hub_for(mosquitto: Any, topics: Topics) -> Iterator[Any]:
    hubs: list[Hub] = []

    def start(repo: Path) -> Hub:
        hub = Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), topics=topics, share_group=None)
        hubs.append(hub.start())
        return hub

    yield start
    for hub in hubs:
        hub.stop()


@pytest.fixture
def device(mosquitto: Any, topics: Topics) -> Iterator[Any]:
    made: list[Device] = []

    def make() -> Device:
        made.append(Device(mosquitto.url, topics))
        return made[-1]

    yield make
    for d in made:
        d.close()


def ask(dev: Device, x: np.ndarray, answer: EdgeAnswer | None) -> Message:
    """One request on the device's own topic, with its answer; the hub's reply."""
    extra = {} if answer is None else answer.header()
    request_id = dev.request(MODEL, {"x": x}, own_topic=True, extra=extra)
    reply = dev.reply(request_id)
    assert reply.ok, reply.error_message
    return reply


def settle(hub: Hub, rows: int) -> None:
    """Wait until ``rows`` rows were kept or refused, then write what is buffered.

    The collector sees a request after its reply went out, so a device can
    hold its last reply before the hub has looked at it.
    """

    def seen() -> float:
        counts = metric(hub, "tandem_examples_collected_total")
        counts.update(metric(hub, "tandem_examples_skipped_total"))
        return sum(counts.values())

    wait_for(lambda: seen() >= rows)
    assert hub.collector is not None
    hub.collector.flush()


def wrong(label: int) -> int:
    return (label + 1) % 4


def metric(hub: Hub, name: str) -> dict[tuple[str, ...], float]:
    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(hub.prometheus.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


def test_disagreements_and_the_sample_are_kept_with_both_answers(
    tmp_path: Path, hub_for: Any, device: Any
) -> None:
    repo, store = make_repo(tmp_path)
    hub = hub_for(repo)
    dev = device()
    x = rows(12, seed=1)
    truth = top_classes(cloud_logits(x))
    expected: dict[int, tuple[str, int]] = {}  # row -> (reason, edge label)
    for i in range(12):
        if i % 3 == 0:
            answer = EdgeAnswer(model="lin-edge@2", labels=(wrong(int(truth[i])),), score=0.7)
            expected[i] = ("disagree", wrong(int(truth[i])))
        elif i % 3 == 1:
            answer = EdgeAnswer(
                model="lin-edge@2", labels=(int(truth[i]),), score=0.2, sampled=True
            )
            expected[i] = ("sample", int(truth[i]))
        else:  # agreed, not sampled: not kept
            answer = EdgeAnswer(model="lin-edge@2", labels=(int(truth[i]),), score=0.1)
        reply = ask(dev, x[i : i + 1], answer)
        np.testing.assert_allclose(reply.tensors["logits"], cloud_logits(x[i : i + 1]), rtol=1e-5)
    assert hub.collector is not None
    settle(hub, 8)  # rows kept or refused: the collector ran after each reply went out

    kept = load_examples(store, model=MODEL)
    order = sorted(expected)
    assert len(kept) == len(order)
    np.testing.assert_array_equal(kept.inputs["x"], x[order])
    np.testing.assert_allclose(kept.outputs["logits"], cloud_logits(x[order]), rtol=1e-5)
    assert kept.cloud_labels.tolist() == truth[order].tolist()
    assert kept.reasons == [expected[i][0] for i in order]
    assert kept.edge_labels.tolist() == [expected[i][1] for i in order]
    np.testing.assert_allclose(kept.edge_scores, [0.7 if i % 3 == 0 else 0.2 for i in order])
    assert set(kept.devices) == {dev.device_id}
    assert set(kept.edge_models) == {"lin-edge@2"} and set(kept.cloud_versions) == {"1"}
    assert (kept.input_sha256 == input_digests({"x": x[order]})).all()
    assert metric(hub, "tandem_examples_collected_total") == {
        (MODEL, "disagree"): 4.0,
        (MODEL, "sample"): 4.0,
    }
    assert metric(hub, "tandem_example_shards_written_total") == {(MODEL,): 1.0}


def test_a_device_that_shares_no_answer_is_never_collected(
    tmp_path: Path, hub_for: Any, device: Any
) -> None:
    repo, store = make_repo(tmp_path, sample_rate=1.0)  # the hub would keep every row
    hub = hub_for(repo)
    dev = device()
    for i in range(5):
        ask(dev, rows(1, seed=i), None)
    ask(dev, rows(1, seed=9), EdgeAnswer(model="e@1", labels=(0,), sampled=True))  # a marker
    settle(hub, 1)
    assert [m.rows for m in list_shards(store)] == [1]  # the marker alone


def test_a_bad_answer_summary_costs_the_example_not_the_reply(
    tmp_path: Path, hub_for: Any, device: Any
) -> None:
    repo, store = make_repo(tmp_path)
    hub = hub_for(repo)
    dev = device()
    request_id = dev.request(
        MODEL, {"x": rows(1, 0)}, own_topic=True, extra={"edge": {"labels": "seven"}}
    )
    assert dev.reply(request_id).ok
    two_labels = EdgeAnswer(model="e@1", labels=(0, 1))  # for a one-row request
    ask(dev, rows(1, 1), two_labels)
    settle(hub, 2)
    assert list_shards(store) == []
    assert metric(hub, "tandem_examples_skipped_total") == {
        (MODEL, "bad_answer"): 1.0,
        (MODEL, "mismatch"): 1.0,
    }


def test_one_device_cannot_flood_the_set(tmp_path: Path, hub_for: Any, device: Any) -> None:
    repo, store = make_repo(tmp_path, max_per_device=5, shard_rows=3)
    hub = hub_for(repo)
    flood, quiet = device(), device()
    for i in range(20):
        x = rows(1, seed=100 + i)
        label = int(top_classes(cloud_logits(x))[0])
        ask(flood, x, EdgeAnswer(model="e@1", labels=(wrong(label),)))
    for i in range(3):
        x = rows(1, seed=200 + i)
        label = int(top_classes(cloud_logits(x))[0])
        ask(quiet, x, EdgeAnswer(model="e@1", labels=(wrong(label),)))
    settle(hub, 23)
    kept = load_examples(store, model=MODEL)
    assert kept.devices.count(flood.device_id) == 5
    assert kept.devices.count(quiet.device_id) == 3
    assert metric(hub, "tandem_examples_skipped_total") == {(MODEL, "device_cap"): 15.0}


def test_the_cap_counts_what_a_device_already_has_in_the_store(
    tmp_path: Path, hub_for: Any, device: Any
) -> None:
    repo, store = make_repo(tmp_path, max_per_device=4)
    dev = device()

    def send(count: int, seed: int) -> None:
        for i in range(count):
            x = rows(1, seed=seed + i)
            label = int(top_classes(cloud_logits(x))[0])
            ask(dev, x, EdgeAnswer(model="e@1", labels=(wrong(label),)))

    first = hub_for(repo)
    send(3, seed=300)
    first.stop()  # writes its 3 rows
    second = hub_for(repo)  # restarted: the device has 3 of its 4 already
    send(3, seed=400)
    settle(second, 3)
    assert load_examples(store, model=MODEL).devices.count(dev.device_id) == 4
    assert metric(second, "tandem_examples_skipped_total") == {(MODEL, "device_cap"): 2.0}


def test_privacy_mode_keeps_fingerprints_and_answers_but_no_input(
    tmp_path: Path, hub_for: Any, device: Any
) -> None:
    repo, store = make_repo(tmp_path, keep_inputs=False)
    hub = hub_for(repo)
    dev = device()
    x = rows(6, seed=7)
    labels = top_classes(cloud_logits(x))
    for i in range(6):
        ask(dev, x[i : i + 1], EdgeAnswer(model="e@1", labels=(wrong(int(labels[i])),)))
    settle(hub, 6)
    kept = load_examples(store, model=MODEL)
    assert kept.inputs == {} and len(kept) == 6
    assert (kept.input_sha256 == input_digests({"x": x})).all()
    np.testing.assert_allclose(kept.outputs["logits"], cloud_logits(x), rtol=1e-5)
    # No stored byte sequence holds any input row, compressed or not.
    for item in store.list_objects():
        raw = store.get_object(item.key)
        texts = [raw]
        if item.key.endswith(".npz"):
            archive = zipfile.ZipFile(io.BytesIO(raw))
            assert not [n for n in archive.namelist() if n.startswith("input.")]
            texts += [archive.read(n) for n in archive.namelist()]
        for blob in texts:
            for row in x:
                assert row.tobytes() not in blob
                assert row[:4].tobytes() not in blob  # not even a fragment of one


def test_a_shard_is_written_when_it_is_full_or_due(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    config = CollectionConfig(store=str(tmp_path), shard_rows=4, flush_s=0.2)
    collector = ExampleCollector({MODEL: config}, writer="t", stores={MODEL: store}).start()
    try:
        for i in range(6):
            offer(collector, rows(1, seed=i), device="d")
        wait_for(lambda: sum(m.rows for m in list_shards(store, MODEL)) == 6)
        assert sorted(m.rows for m in list_shards(store, MODEL)) == [2, 4]
    finally:
        collector.close()


def offer(collector: ExampleCollector, x: np.ndarray, *, device: str) -> None:
    """A request whose edge answer disagrees with the cloud's, answered, as the front does."""
    out = cloud_logits(x)
    answer = EdgeAnswer(model="e@1", labels=tuple(wrong(int(v)) for v in top_classes(out)))
    request = Message(
        kind="request", request_id=uuid.uuid4().hex, model=MODEL, device_id=device,
        extra=answer.header(),
    )  # fmt: skip
    pending = collector.admit(request, {"x": x})
    assert pending is not None
    collector.answered(pending, HubResult({"logits": out}, MODEL, "1", 0.0, 0.0, 1, 1))


def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_the_byte_budget_deletes_the_oldest_shards(tmp_path: Path) -> None:
    probe_store = LocalBlobStore(tmp_path / "probe")
    config = CollectionConfig(store="unused", shard_rows=1, flush_s=60)
    probe = ExampleCollector({MODEL: config}, writer="probe", stores={MODEL: probe_store}).start()
    offer(probe, rows(1, seed=0), device="d")
    probe.close()
    one_shard = list_shards(probe_store, MODEL)[0].size  # every one-row shard is about this

    store = LocalBlobStore(tmp_path / "store")
    budget = CollectionConfig(store="unused", shard_rows=1, max_bytes=int(one_shard * 3.5))
    collector = ExampleCollector({MODEL: budget}, writer="w", stores={MODEL: store}).start()
    try:
        for i in range(6):
            offer(collector, rows(1, seed=10 + i), device=f"d{i}")
            collector.flush()
        left = list_shards(store, MODEL)
        assert [m.devices for m in left] == [("d3",), ("d4",), ("d5",)]  # the newest stay
        keys = {o.key for o in store.list_objects()}
        assert keys == {m.data_key for m in left} | {m.manifest_key for m in left}
    finally:
        collector.close()


def test_shards_past_retention_go_first_then_the_oldest_over_budget() -> None:
    from shared.server import ShardManifest

    def shard(key: str, created: float, size: int) -> ShardManifest:
        return ShardManifest(
            model="m", key=key, rows=1, writer="w", created_at=created, first_at=created,
            last_at=created, inputs_kept=True, devices=("d",), device_rows=(1,),
            edge_models=("e@1",), cloud_versions=("1",), reasons={"disagree": 1},
            data_bytes=size, data_digest="sha256:" + "0" * 64,
        )  # fmt: skip

    shards = [shard("a", 0, 10), shard("b", 50, 10), shard("c", 90, 10), shard("d", 95, 10)]
    doomed = shards_to_delete(shards, now=100, max_age_s=60, max_bytes=15)
    assert [(m.key, why) for m, why in doomed] == [
        ("a", "retention"),
        ("b", "budget"),
        ("c", "budget"),
    ]


@pytest.mark.parametrize(
    ("collection", "match"),
    [
        ({}, "collection.store: required"),
        ({"store": "ftp://x"}, "file:// or s3://"),
        ({"store": "/x", "sample_rate": 2}, "sample_rate"),
        ({"store": "/x", "max_per_device": 0}, "max_per_device"),
        ({"store": "/x", "keep_inputs": "no"}, "keep_inputs"),
        ({"store": "/x", "retention_days": 0}, "retention_days"),
        ({"store": "/x", "typo": 1}, "unknown keys"),
    ],
)
def test_a_bad_collection_config_names_the_field(collection: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_json({"collection": collection}, "repo/m/config.json")


def test_a_relative_store_is_relative_to_the_config_file() -> None:
    config = ModelConfig.from_json({"collection": {"store": "lessons"}}, "/srv/repo/m/config.json")
    assert config.collection is not None and config.collection.store == "/srv/repo/m/lessons"


@pytest.mark.slow
def test_the_ingress_processes_of_a_hub_collect_and_their_counts_are_merged(
    tmp_path: Path, mosquitto: Any
) -> None:
    import httpx

    from ._brokers import free_port
    from ._plane import running_hub, wait_until

    repo, store = make_repo(tmp_path, shard_rows=4)
    port = free_port()
    with running_hub(repo, mosquitto.url, mqtt=2, http_port=port) as hub:
        dev = Device(mosquitto.url, Topics(hub.spec.prefix))
        try:
            for i in range(30):
                x = rows(1, seed=500 + i)
                label = int(top_classes(cloud_logits(x))[0])
                ask(dev, x, EdgeAnswer(model="e@1", labels=(wrong(label),)))
        finally:
            dev.close()

        def collected() -> float:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(
                    'tandem_examples_collected_total{model="linear",reason="disagree"'
                )
            )

        wait_until(lambda: collected() == 30, what="both ingress processes' counts in /metrics")
    # Stopped: each ingress process wrote what it still held before it exited.
    shards = list_shards(store, MODEL)
    assert sum(m.rows for m in shards) == 30
    assert len({m.writer for m in shards}) == 2  # the share group split the requests
