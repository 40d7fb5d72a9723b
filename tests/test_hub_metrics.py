"""The hub's Prometheus metrics: names after Triton's, a registry per hub, honest labels.

Counts are asserted, never durations: the batch-size histogram is filled by a
model held in compute (``HeldModel``) while requests queue behind it; those
leave only as full batches, so how requests batch does not depend on timing.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud_hub import Executor, Hub, HubMetrics, HubResult, OnnxExecutor
from cloud_hub.http import HttpServer, create_app
from cloud_hub.metrics import UNSERVED
from cloud_hub.metrics._prometheus import batch_size_buckets
from cloud_hub.metrics._recorder import count_of
from edge_agent import EdgeAgent, NoAnswerError, OffloadPolicy, Source
from shared import ErrorCode, MqttSettings, Topics

from ._models import write_linear_classifier
from ._plane import wait_until

WAIT_S = 30.0
NAMES = {
    # name in the exposition -> type
    "tandem_inference_request_success": "counter",
    "tandem_inference_request_failure": "counter",
    "tandem_inference_count": "counter",
    "tandem_inference_exec_count": "counter",
    "tandem_inference_queue_duration_us": "histogram",
    "tandem_inference_compute_infer_duration_us": "histogram",
    "tandem_inference_request_duration_us": "histogram",
    "tandem_batch_size": "histogram",
    "tandem_queue_depth": "gauge",
    "tandem_overload_rejections": "counter",
    "tandem_executor_info": "gauge",  # an info metric, as text format 0.0.4 writes it
}


def write_repo(root: Path) -> Path:
    """full4: behind a batch, requests leave only as 4 rows; linear: at once."""
    for name, config in {
        "linear": {"max_batch_size": 8, "max_queue_delay_ms": 0},
        "full4": {"max_batch_size": 4, "max_queue_delay_ms": 60_000, "max_queue_size": 2},
    }.items():
        write_linear_classifier(root / name / "1" / "model.onnx")
        (root / name / "config.json").write_text(json.dumps(config))
    return root


def x(n: int = 1) -> np.ndarray:
    return np.ones((n, 16), np.float32)


class HeldModel(Executor):
    """The repository's ONNX model, whose compute waits while held.

    A lone request for an idle batcher is computed at once; holding that
    first batch in compute lets the next requests queue up together, so they
    batch by the batcher's rules alone (full4: only as a full batch of 4 rows).
    """

    platform = "onnxruntime"

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.released = threading.Event()
        self.released.set()
        self.entered: queue.Queue[int] = queue.Queue()

    @property
    def inputs(self) -> Any:
        return self.inner.inputs

    @property
    def outputs(self) -> Any:
        return self.inner.outputs

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.put(len(inputs["x"]))
        assert self.released.wait(WAIT_S)
        return self.inner.run(inputs)

    def hold_with(self, hub: Hub, rows: int = 1) -> Any:
        """Submit a request of ``rows`` and keep it in compute until ``release``."""
        self.released.clear()
        while not self.entered.empty():  # the warm-up's entry
            self.entered.get_nowait()
        future = hub.submit("full4", {"x": x(rows)})
        assert self.entered.get(timeout=WAIT_S) == rows
        return future

    def release(self) -> None:
        self.released.set()


def held_full4(hub: Hub, repo: Path) -> HeldModel:
    """Serve full4 (same model file and config) through a ``HeldModel``."""
    served = hub.repository.get("full4")
    held = HeldModel(OnnxExecutor(repo / "full4" / "1" / "model.onnx"))
    hub.add_model("full4", held, config=served.config)
    return held


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(source: str | bytes, name: str, **labels: str) -> float:
    text = source.decode() if isinstance(source, bytes) else source
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_repo(tmp_path / "repo")


def test_batch_size_buckets_double_up_to_the_max() -> None:
    assert batch_size_buckets(8) == [1, 2, 4, 8]
    assert batch_size_buckets(6) == [1, 2, 4, 6]
    assert batch_size_buckets(1) == [1]
    assert batch_size_buckets(0) == [1]  # a model without a batch dimension


def test_in_process_requests_fill_the_batch_level_metrics(repo: Path) -> None:
    with Hub(repo) as hub:
        held = held_full4(hub, repo)
        # Behind a held batch of 1 row, two requests of 2 rows fill one batch of 4;
        # then behind another, one of 3 and one of 1.
        for pair in ((2, 2), (3, 1)):  # full4 queues two requests at most
            blocker = held.hold_with(hub)
            futures = [hub.submit("full4", {"x": x(n)}) for n in pair]
            held.release()
            for future in [blocker, *futures]:
                future.result(WAIT_S)
        text = hub.prometheus.render()
    labels = {"model": "full4", "version": "1"}
    assert value(text, "tandem_inference_exec_count_total", **labels) == 4
    assert value(text, "tandem_inference_count_total", **labels) == 10
    assert value(text, "tandem_batch_size_bucket", le="1.0", **labels) == 2
    assert value(text, "tandem_batch_size_bucket", le="2.0", **labels) == 2
    assert value(text, "tandem_batch_size_bucket", le="4.0", **labels) == 4
    assert value(text, "tandem_batch_size_bucket", le="+Inf", **labels) == 4
    assert value(text, "tandem_batch_size_count", **labels) == 4
    assert value(text, "tandem_batch_size_sum", **labels) == 10
    assert value(text, "tandem_inference_queue_duration_us_count", **labels) == 6
    assert value(text, "tandem_inference_compute_infer_duration_us_count", **labels) == 6
    assert value(text, "tandem_queue_depth", **labels) == 0
    # Transports count answers; in-process submits are not among them.
    assert value(text, "tandem_inference_request_success_total", **labels) == 0


def test_overload_rejections_and_queue_depth_are_counted(repo: Path) -> None:
    with Hub(repo) as hub:
        held = held_full4(hub, repo)
        blocker = held.hold_with(hub)
        waiting = [hub.submit("full4", {"x": x(1)}) for _ in range(2)]  # full4 queues two
        with pytest.raises(Exception, match="queue full"):
            hub.submit("full4", {"x": x(1)})
        text = hub.prometheus.render()
        held.release()  # 1 + 1 rows then wait for company: the window outlasts the hub
        blocker.result(WAIT_S)
    assert all(f.exception(WAIT_S) is not None for f in waiting)  # answered "stopping"
    labels = {"model": "full4", "version": "1"}
    assert value(text, "tandem_queue_depth", **labels) == 2
    assert value(text, "tandem_overload_rejections_total", **labels) == 1


def test_each_hub_has_its_own_registry(repo: Path) -> None:
    with Hub(repo) as first, Hub(repo) as second:
        first.submit("linear", {"x": x(3)}).result(WAIT_S)
        one, two = first.prometheus.render(), second.prometheus.render()
    assert first.prometheus.registry is not second.prometheus.registry
    labels = {"model": "linear", "version": "1"}
    assert value(one, "tandem_inference_count_total", **labels) == 3
    assert value(two, "tandem_inference_count_total", **labels) == 0


def test_labels_never_take_names_a_client_invented(repo: Path) -> None:
    with Hub(repo) as hub:
        metrics = hub.prometheus
        received = time.monotonic()
        metrics.record(
            "http", "no-such-model", "9", received=received, error=ErrorCode.UNKNOWN_MODEL
        )
        metrics.record("mqtt", "linear", "9", received=received, error=ErrorCode.UNKNOWN_MODEL)
        metrics.record("http", "linear", None, received=received, error=ErrorCode.INVALID_INPUT)
        metrics.record("http", "linear", None, received=received)  # OK without a result
        with pytest.raises(ValueError, match="transport"):
            metrics.record("smtp", "linear", None, received=received)
        text = metrics.render().decode()
    failure = "tandem_inference_request_failure_total"
    unserved = {"model": UNSERVED, "version": UNSERVED}
    assert value(text, failure, **unserved, transport="http", reason="unknown_model") == 1
    assert value(text, failure, model="linear", version=UNSERVED, transport="mqtt") == 1
    assert 'model=""' not in text and 'version=""' not in text  # never an empty label
    assert value(text, failure, model="linear", version="1", reason="invalid_input") == 1
    assert value(text, failure, model="linear", version="1", reason="internal") == 1
    assert "no-such-model" not in text and 'version="9"' not in text


def test_executor_info_names_the_backend_and_device(repo: Path) -> None:
    with Hub(repo) as hub:
        info = families(hub.prometheus.render().decode())["tandem_executor_info"]
    (sample,) = [s for s in info.samples if s.labels["model"] == "linear"]
    assert sample.name == "tandem_executor_info" and sample.value == 1
    assert sample.labels["platform"] == "onnxruntime"
    assert sample.labels["device"] in ("CPUExecutionProvider", "CUDAExecutionProvider")


@pytest.fixture
def http_hub(repo: Path) -> Iterator[tuple[Hub, httpx.Client]]:
    with (
        Hub(repo) as hub,
        HttpServer(create_app(hub), port=0) as server,
        httpx.Client(base_url=server.url, timeout=WAIT_S) as client,
    ):
        yield hub, client


def infer_body(n: int, **extra: Any) -> dict[str, Any]:
    data = x(n).ravel().tolist()
    return {"inputs": [{"name": "x", "shape": [n, 16], "datatype": "FP32", "data": data}], **extra}


def test_get_metrics_exposes_every_metric_with_its_triton_counterpart(
    http_hub: tuple[Hub, httpx.Client],
) -> None:
    _, client = http_hub
    assert client.post("/v2/models/linear/infer", json=infer_body(2)).status_code == 200
    assert client.post("/v2/models/linear/infer", json={"inputs": []}).status_code == 400
    assert client.post("/v2/models/nope/infer", json=infer_body(1)).status_code == 404
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    found = families(r.text)
    for name, kind in NAMES.items():
        assert name in found, name
        assert found[name].type == kind, name
    for name in NAMES:
        if name not in ("tandem_batch_size", "tandem_executor_info"):
            assert "Triton" in found[name].documentation, name
    http = {"transport": "http"}
    assert value(r.text, "tandem_inference_request_success_total", model="linear", **http) == 1
    assert value(r.text, "tandem_inference_request_duration_us_count", model="linear", **http) == 1
    failure = "tandem_inference_request_failure_total"
    assert value(r.text, failure, model="linear", reason="bad_request", **http) == 1
    assert value(r.text, failure, model=UNSERVED, reason="unknown_model", **http) == 1
    assert 'model=""' not in r.text


def test_the_batch_size_histogram_fills_under_concurrent_http_load(
    http_hub: tuple[Hub, httpx.Client], repo: Path
) -> None:
    hub, client = http_hub
    url = str(client.base_url)
    statuses: list[int] = []
    held = held_full4(hub, repo)

    def send(n: int) -> None:
        with httpx.Client(base_url=url, timeout=WAIT_S) as c:
            statuses.append(c.post("/v2/models/full4/infer", json=infer_body(n)).status_code)

    # Behind a held batch (in process, 1 row) full4 queues at most two requests and
    # computes them only as a full batch of 4 rows: 2 + 2 rows make one, then 1 + 3.
    for pair in ((2, 2), (1, 3)):
        blocker = held.hold_with(hub)
        threads = [threading.Thread(target=send, args=(n,)) for n in pair]
        for t in threads:
            t.start()
        batcher = next(b for b in hub.batchers() if b.model == "full4")
        end = time.monotonic() + WAIT_S
        while batcher.queue_depth < 2 and time.monotonic() < end:
            time.sleep(0.005)
        held.release()
        for t in threads:
            t.join(WAIT_S)
        blocker.result(WAIT_S)
    assert statuses == [200] * 4
    text = client.get("/metrics").text
    labels = {"model": "full4", "version": "1"}
    count = value(text, "tandem_inference_count_total", **labels)
    execs = value(text, "tandem_inference_exec_count_total", **labels)
    assert (count, execs) == (10, 4)  # two held batches of 1 row, two full batches of 4
    assert value(text, "tandem_batch_size_bucket", le="2.0", **labels) == 2
    assert value(text, "tandem_batch_size_bucket", le="4.0", **labels) == 4
    assert value(text, "tandem_inference_request_success_total", transport="http", **labels) == 4
    assert value(text, "tandem_inference_queue_duration_us_count", **labels) == 6
    assert hub.metrics()["full4@1"].batches == 4  # the exporter and the batcher agree


def test_mqtt_answers_are_counted_under_their_transport(repo: Path, mosquitto: Any) -> None:
    topics = Topics(f"metrics/{uuid.uuid4().hex[:8]}")
    settings = MqttSettings.from_url(mosquitto.url)
    with Hub(repo, mqtt=settings, topics=topics, share_group=None) as hub:

        def agent(model: str) -> EdgeAgent:
            return EdgeAgent(
                None,
                device_id=f"dev-{uuid.uuid4().hex[:6]}",
                broker=mosquitto.url,
                cloud_model=model,
                input_name="x",
                topics=topics,
                policy=OffloadPolicy.always_cloud(),
            )

        with agent("linear") as good, agent("nope") as lost:
            assert good.infer(x(1), deadline_ms=WAIT_S * 1000).source is Source.CLOUD
            with pytest.raises(NoAnswerError):
                lost.infer(x(1), deadline_ms=WAIT_S * 1000)
            assert hub.mqtt_front is not None
            # Each agent probed on connect; probes are answered but not counted as requests.
            worker = hub.mqtt_front
            wait_until(lambda: worker.stats().get("probes") == 2, what="both probes")
        text = hub.prometheus.render().decode()
    mqtt = {"transport": "mqtt"}
    assert value(text, "tandem_inference_request_success_total", model="linear", **mqtt) == 1
    assert value(text, "tandem_inference_request_duration_us_count", model="linear", **mqtt) == 1
    failure = "tandem_inference_request_failure_total"
    assert (
        value(text, failure, model=UNSERVED, version=UNSERVED, reason="unknown_model", **mqtt) == 1
    )
    assert 'model=""' not in text
    assert "http" not in {
        s.labels.get("transport") for f in families(text).values() for s in f.samples
    }


def test_a_failing_metrics_hook_never_stops_a_reply(
    repo: Path, mosquitto: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topics = Topics(f"metrics/{uuid.uuid4().hex[:8]}")
    hub = Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), topics=topics, share_group=None)

    def broken_record(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("metrics are down")

    hub.prometheus.record = broken_record  # type: ignore[method-assign]
    with (
        caplog.at_level(logging.ERROR, logger="cloud_hub"),
        hub,
        EdgeAgent(
            None,
            device_id=f"dev-{uuid.uuid4().hex[:6]}",
            broker=mosquitto.url,
            cloud_model="linear",
            input_name="x",
            topics=topics,
            policy=OffloadPolicy.always_cloud(),
        ) as agent,
    ):
        assert agent.infer(x(1), deadline_ms=WAIT_S * 1000).source is Source.CLOUD
    assert "on_reply failed" in caplog.text


def test_hub_metrics_is_exported() -> None:
    import cloud_hub

    assert cloud_hub.HubMetrics is HubMetrics
    assert "HubMetrics" in cloud_hub.__all__


def test_both_planes_count_a_request_by_one_rule() -> None:
    """``count_of`` decides for ``HubMetrics`` and the plane's ``BookRecorder`` alike."""
    asked: list[int] = []

    def served() -> dict[str, str]:
        asked.append(1)
        return {"linear": "2"}

    result = HubResult({}, "linear", "2", 0.0, 0.0, 1, 1)
    ok = count_of(
        "mqtt", "linear", None, received=time.monotonic(), error=ErrorCode.OK, result=result,
        served=served,
    )  # fmt: skip
    assert ok.labels == ("linear", "2", "mqtt") and ok.duration_us is not None
    assert ok.duration_us >= 0 and not asked  # a success never asks what is served
    no_result = count_of(
        "http", "linear", "2", received=0.0, error=ErrorCode.OK, result=None, served=served
    )
    assert no_result.labels == ("linear", "2", "http", ErrorCode.INTERNAL.value)
    assert no_result.duration_us is None
    old = count_of(
        "http", "linear", "1", received=0.0, error=ErrorCode.UNKNOWN_MODEL, result=None,
        served=served,
    )  # fmt: skip
    assert old.labels == ("linear", UNSERVED, "http", ErrorCode.UNKNOWN_MODEL.value)
    other = count_of(
        "mqtt", "nope", None, received=0.0, error=ErrorCode.OVERLOADED, result=None, served=served
    )
    assert other.labels == (UNSERVED, UNSERVED, "mqtt", ErrorCode.OVERLOADED.value)
    assert other.duration_us is None
    with pytest.raises(ValueError, match="transport must be one of"):
        count_of("smtp", "linear", None, received=0.0, error=ErrorCode.OK, result=result,
                 served=served)  # fmt: skip
