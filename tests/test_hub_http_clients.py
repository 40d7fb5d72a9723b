"""The HTTP API with real clients and transports: batching across concurrent
requests, Triton's own ``tritonclient.http``, HTTP beside MQTT on one hub, the
server's lifecycle and the ``tandem-hub`` CLI serving HTTP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_hub import Executor, Hub, HubError, ModelConfig, OnnxExecutor, ResultFuture
from cloud_hub.http import HttpServer, create_app
from edge_agent import EdgeAgent, OffloadPolicy, Source
from shared import MqttSettings, Topics

from ._brokers import free_port
from ._hub_http_kit import (
    ECHO_TYPES,
    WAIT_S,
    B,
    W,
    infer_json,
    metric,
    rows,
    write_repo,
)
from ._hub_http_kit import client_fixture as client_fixture
from ._hub_http_kit import hub_fixture as hub_fixture
from ._hub_http_kit import url_fixture as url_fixture
from ._models import write_linear_classifier

# The fixtures hub, url and client: imported as themselves so that pytest finds them here.

ROOT = Path(__file__).resolve().parents[1]


# -- batching, clients, transports ---------------------------------------------------------


class HeldLinear(Executor):
    """The linear classifier, batched by 8 rows with a long window; compute waits while held.

    A lone request for an idle batcher is computed at once. Holding that first
    batch in compute lets the requests sent meanwhile queue up together, and
    they leave only as a full batch of 8 rows, whatever the timing.
    """

    platform = "onnxruntime"
    CONFIG = ModelConfig.from_json({"max_batch_size": 8, "max_queue_delay_ms": 60_000})

    def __init__(self, hub: Hub, name: str, model_dir: Path) -> None:
        self.inner = OnnxExecutor(write_linear_classifier(model_dir / "model.onnx"))
        self.hub, self.name = hub, name
        self.released, self.entered = threading.Event(), threading.Event()
        self.released.set()
        hub.add_model(name, self, config=self.CONFIG)
        self.batcher = next(b for b in hub.batchers() if b.model == name)

    @property
    def inputs(self) -> Any:
        return self.inner.inputs

    @property
    def outputs(self) -> Any:
        return self.inner.outputs

    def _run(self, inputs: dict[str, np.ndarray]) -> Any:
        if np.any(inputs["x"]):  # the warm-up's zeros pass straight
            self.entered.set()
            assert self.released.wait(WAIT_S)
        return self.inner.run(inputs)

    def hold(self) -> ResultFuture:
        """Put a batch of one row in compute and keep it there until ``release_when``."""
        self.released.clear()
        future = self.hub.submit(self.name, {"x": rows(1, seed=99)})
        assert self.entered.wait(WAIT_S)
        return future

    def release_when(self, queued: int) -> None:
        """Let the held batch finish once ``queued`` requests wait behind it."""
        end = time.monotonic() + WAIT_S
        while self.batcher.queue_depth < queued and time.monotonic() < end:
            time.sleep(0.005)
        self.released.set()

    def close(self) -> None:
        self.inner.close()


def test_concurrent_http_requests_batch_together(
    url: str, client: httpx.Client, hub: Hub, tmp_path: Path
) -> None:
    x = rows(8, seed=5)
    held = HeldLinear(hub, "held8", tmp_path)

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as c:
            return await asyncio.gather(
                *(c.post("/v2/models/held8/infer", json=infer_json(x[i : i + 1])) for i in range(8))
            )

    blocker = held.hold()
    responses: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: responses.extend(asyncio.run(send_all())))
    sender.start()
    held.release_when(queued=8)
    sender.join(WAIT_S)
    blocker.result(WAIT_S)
    got = np.array([r.json()["outputs"][0]["data"] for r in responses], np.float32)
    np.testing.assert_allclose(got, x @ W + B, rtol=1e-5, atol=1e-5)
    text = client.get("/metrics").text
    labels = {"model": "held8", "version": "1"}
    # Behind the held batch of 1 row, the 8 requests of a row each ran as one batch.
    assert metric(text, "tandem_inference_exec_count_total", **labels) == 2
    assert metric(text, "tandem_inference_count_total", **labels) == 9
    assert metric(text, "tandem_batch_size_bucket", le="4.0", **labels) == 1
    assert metric(text, "tandem_batch_size_bucket", le="8.0", **labels) == 2
    assert metric(text, "tandem_inference_request_success_total", transport="http", **labels) == 8


def test_tritonclient_works_unchanged_with_json_and_binary_tensors(url: str) -> None:
    import tritonclient.http as tritonhttp  # a dev dependency: the test oracle
    from tritonclient.utils import InferenceServerException

    client = tritonhttp.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("linear") and not client.is_model_ready("nope")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        assert client.get_model_metadata("linear")["inputs"][0]["shape"] == [-1, 16]
        x = rows(4, seed=6)
        for binary in (True, False):
            tensor = tritonhttp.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = [tritonhttp.InferRequestedOutput("logits", binary_data=binary)]
            result = client.infer("linear", [tensor], outputs=wanted, request_id="t1")
            np.testing.assert_allclose(result.as_numpy("logits"), x @ W + B, rtol=1e-5, atol=1e-5)
            assert result.get_response()["id"] == "t1"
        result = client.infer("linear", [tensor], model_version="1")  # all outputs, binary
        np.testing.assert_allclose(result.as_numpy("logits"), x @ W + B, rtol=1e-5, atol=1e-5)
        text = tritonhttp.InferInput("text", [1, 2], "BYTES")
        text.set_data_from_numpy(np.array([[b"a\0b", b""]], dtype=object))
        others = [tritonhttp.InferInput(n, [1, 2], t) for n, t in list(ECHO_TYPES.items())[1:]]
        others[0].set_data_from_numpy(np.array([[True, False]]))
        others[1].set_data_from_numpy(np.array([[5, 6]], np.int64))
        others[2].set_data_from_numpy(np.array([[1.5, 2.5]], np.float16))
        echoed = client.infer("echo", [text, *others])
        assert echoed.as_numpy("text_out").tolist() == [[b"a\0b", b""]]
        assert echoed.as_numpy("flag_out").tolist() == [[True, False]]
        with pytest.raises(InferenceServerException) as missing:
            client.infer("nope", [tensor])
        assert missing.value.status() == "404"
        wrong = tritonhttp.InferInput("x", [1, 16], "FP64")
        wrong.set_data_from_numpy(rows(1).astype(np.float64))
        with pytest.raises(InferenceServerException) as bad:
            client.infer("linear", [wrong])
        assert bad.value.status() == "400" and "FP32" in bad.value.message()
    finally:
        client.close()


def test_http_and_mqtt_give_the_same_answer_and_batch_together(
    tmp_path: Path, mosquitto: Any
) -> None:
    topics = Topics(f"http-mqtt/{uuid.uuid4().hex[:8]}")
    repo = write_repo(tmp_path / "repo")
    settings = MqttSettings.from_url(mosquitto.url)
    with (
        Hub(repo, mqtt=settings, topics=topics, share_group=None) as hub,
        HttpServer(create_app(hub), port=0) as server,
        httpx.Client(base_url=server.url, timeout=WAIT_S) as client,
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
        x = rows(1, seed=7)
        by_mqtt = agent.infer(x, deadline_ms=WAIT_S * 1000)
        assert by_mqtt.source is Source.CLOUD
        by_http = client.post("/v2/models/linear/infer", json=infer_json(x)).json()
        http_logits = np.array(by_http["outputs"][0]["data"], np.float32).reshape(1, 4)
        np.testing.assert_allclose(by_mqtt.outputs["logits"], http_logits, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(http_logits, x @ W + B, rtol=1e-5, atol=1e-5)

        # Behind a held batch, 4 HTTP + 4 MQTT requests queue up and make one batch of 8.
        held = HeldLinear(hub, "batched", tmp_path / "held")
        batch = rows(8, seed=8)
        agent.cloud_model = "batched"
        answers: dict[int, np.ndarray] = {}

        def by_agent(i: int) -> None:
            answers[i] = agent.infer(batch[i : i + 1], deadline_ms=WAIT_S * 1000).outputs["logits"]

        def by_client(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=WAIT_S) as c:
                r = c.post("/v2/models/batched/infer", json=infer_json(batch[i : i + 1]))
                answers[i] = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 4)

        threads = [
            threading.Thread(target=by_agent if i % 2 else by_client, args=(i,)) for i in range(8)
        ]
        blocker = held.hold()
        for t in threads:
            t.start()
        held.release_when(queued=8)
        for t in threads:
            t.join(WAIT_S)
        blocker.result(WAIT_S)
        got = np.concatenate([answers[i] for i in range(8)])
        np.testing.assert_allclose(got, batch @ W + B, rtol=1e-5, atol=1e-5)
        text = client.get("/metrics").text
    labels = {"model": "batched", "version": "1"}
    assert metric(text, "tandem_inference_exec_count_total", **labels) == 2  # held, then 8
    assert metric(text, "tandem_inference_count_total", **labels) == 9
    for transport in ("http", "mqtt"):
        assert (
            metric(text, "tandem_inference_request_success_total", transport=transport, **labels)
            == 4
        )
        assert metric(text, "tandem_inference_request_success_total", transport=transport,
                      model="linear", version="1") == 1  # fmt: skip


# -- the server's lifecycle and the CLI ----------------------------------------------------


def test_a_taken_port_fails_at_start(hub: Hub, url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(HubError, match="cannot listen"):
        HttpServer(create_app(hub), port=port).start()


def test_a_stopped_hub_answers_503_and_is_not_ready(tmp_path: Path) -> None:
    hub = Hub(write_repo(tmp_path / "repo")).start()
    with HttpServer(create_app(hub), port=0) as server, httpx.Client(base_url=server.url) as c:
        hub.stop()
        assert c.get("/v2/health/live").status_code == 200
        ready = c.get("/v2/health/ready")
        assert ready.status_code == 503 and ready.json()["error"]
        r = c.post("/v2/models/linear/infer", json=infer_json(rows(1)))
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]


@pytest.mark.slow
def test_tandem_hub_serves_http_beside_mqtt(tmp_path: Path, mosquitto: Any) -> None:
    repo = write_repo(tmp_path / "repo")
    port = free_port()
    log = tmp_path / "hub.log"
    command = [
        sys.executable, "-m", "cloud_hub", "--repo", str(repo), "--broker", mosquitto.url,
        "--prefix", f"cli-http/{uuid.uuid4().hex[:8]}", "--no-share", "--log-level", "warning",
        "--http-port", str(port),
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as c:
            end = time.monotonic() + WAIT_S
            while True:
                try:
                    if c.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < end and process.poll() is None, log.read_text()
                time.sleep(0.1)
            x = rows(2, seed=9)
            r = c.post("/v2/models/linear/infer", json=infer_json(x))
            got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(2, 4)
            np.testing.assert_allclose(got, x @ W + B, rtol=1e-5, atol=1e-5)
            assert "tandem_executor_info" in c.get("/metrics").text
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(WAIT_S) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
