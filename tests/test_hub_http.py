"""The hub's HTTP API (Open Inference Protocol v2) on a real uvicorn, with real clients.

A hub serves a repository of real ONNX models; uvicorn listens on a free
loopback port in a thread; httpx, raw sockets and Triton's own
``tritonclient.http`` talk to it. Bad inputs must get their status and an
``{"error"}`` body, and the server must keep serving after each.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_hub import CallableExecutor, DynamicBatcher, Hub, ModelConfig, ResultFuture
from cloud_hub.http import HttpServer, create_app

from ._hub_http_kit import (
    ECHO_TYPES,
    HEADER,
    WAIT_S,
    B,
    W,
    assert_still_serving,
    binary_body,
    infer_json,
    rows,
    split_binary,
)
from ._hub_http_kit import client_fixture as client_fixture
from ._hub_http_kit import hub_fixture as hub_fixture
from ._hub_http_kit import url_fixture as url_fixture

# The fixtures hub, url and client: imported as themselves so that pytest finds them here.

# -- metadata and health -------------------------------------------------------------------


def test_server_metadata_health_and_model_metadata(client: httpx.Client) -> None:
    meta = client.get("/v2").json()
    assert meta["name"] == "tandem-hub" and "binary_tensor_data" in meta["extensions"]
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    model = client.get("/v2/models/linear").json()
    assert model == {
        "name": "linear",
        "versions": ["1"],
        "platform": "onnxruntime",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert client.get("/v2/models/linear/versions/1").json() == model
    assert client.get("/v2/models/linear/ready").json() == {"name": "linear", "ready": True}
    assert client.get("/v2/models/linear/versions/1/ready").status_code == 200


@pytest.mark.parametrize(
    "path",
    ["/v2/models/nope", "/v2/models/nope/ready", "/v2/models/linear/versions/2",
     "/v2/models/linear/versions/2/ready", "/v2/no/such/route"],
)  # fmt: skip
def test_unknown_models_versions_and_routes_are_404_with_an_error(
    client: httpx.Client, path: str
) -> None:
    r = client.get(path)
    assert r.status_code == 404 and isinstance(r.json()["error"], str)


def test_the_openapi_document_describes_the_json_protocol(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    infer = doc["paths"]["/v2/models/{model_name}/infer"]["post"]
    body = infer["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/InferenceRequest"}
    assert "application/octet-stream" in body
    assert {"200", "400", "404", "413", "503", "504", "500"} <= set(infer["responses"])
    schemas = doc["components"]["schemas"]
    assert {"InferenceRequest", "RequestInput", "InferenceResponse", "ErrorResponse"} <= set(
        schemas
    )
    assert set(schemas["InferenceRequest"]["required"]) == {"inputs"}
    assert {"name", "shape", "datatype", "data"} <= set(schemas["RequestInput"]["properties"])
    assert "/v2/models/{model_name}/versions/{model_version}/infer" in doc["paths"]
    assert "/metrics" in doc["paths"]


# -- inference -----------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True])
def test_json_inference_matches_numpy(client: httpx.Client, nested: bool) -> None:
    x = rows(3)
    request = infer_json(x, id="req-1")
    if nested:
        request["inputs"][0]["data"] = x.tolist()
    r = client.post("/v2/models/linear/infer", json=request)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert HEADER not in r.headers
    body = r.json()
    assert (body["model_name"], body["model_version"], body["id"]) == ("linear", "1", "req-1")
    (out,) = body["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("logits", "FP32", [3, 4])
    got = np.array(out["data"], np.float32).reshape(3, 4)
    np.testing.assert_allclose(got, x @ W + B, rtol=1e-5, atol=1e-5)


def test_binary_inference_matches_numpy_and_json(client: httpx.Client) -> None:
    x = rows(5, seed=1)
    header = {
        "inputs": [{"name": "x", "shape": [5, 16], "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }  # fmt: skip
    content, headers = binary_body(header, x.tobytes())
    r = client.post("/v2/models/linear/versions/1/infer", content=content, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    meta, chunks = split_binary(r)
    (out,) = meta["outputs"]
    assert out["parameters"]["binary_data_size"] == 5 * 4 * 4 and "data" not in out
    binary = np.frombuffer(chunks["logits"], "<f4").reshape(out["shape"])
    np.testing.assert_allclose(binary, x @ W + B, rtol=1e-5, atol=1e-5)
    as_json = client.post("/v2/models/linear/infer", json=infer_json(x)).json()
    np.testing.assert_array_equal(binary.ravel(), np.array(as_json["outputs"][0]["data"], "f4"))


def test_binary_data_output_asks_for_every_output_in_binary(client: httpx.Client) -> None:
    x = rows(2, seed=2)
    r = client.post(
        "/v2/models/linear/infer", json=infer_json(x, parameters={"binary_data_output": True})
    )
    _, chunks = split_binary(r)
    np.testing.assert_allclose(
        np.frombuffer(chunks["logits"], "<f4").reshape(2, 4), x @ W + B, rtol=1e-5, atol=1e-5
    )


def test_bytes_bool_int_and_fp16_round_trip_as_json_and_binary(client: httpx.Client) -> None:
    values = {
        "text": np.array([[b"hi", "é".encode()]], dtype=object),
        "flag": np.array([[True, False]]),
        "ids": np.array([[2**40, -3]], dtype=np.int64),
        "half": np.array([[0.5, -2.0]], dtype=np.float16),
    }
    as_json = [
        {"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["hi", "é"]},
        {"name": "flag", "shape": [1, 2], "datatype": "BOOL", "data": [[True, False]]},
        {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [2**40, -3]},
        {"name": "half", "shape": [1, 2], "datatype": "FP16", "data": [0.5, -2.0]},
    ]
    r = client.post("/v2/models/echo/infer", json={"inputs": as_json})
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["text_out"]["data"] == ["hi", "é"] and outputs["text_out"]["datatype"] == "BYTES"
    assert outputs["flag_out"]["data"] == [True, False]
    assert outputs["ids_out"]["data"] == [2**40, -3]
    assert outputs["half_out"]["data"] == [0.5, -2.0]

    text = b"".join(len(v).to_bytes(4, "little") + v for v in values["text"].ravel())
    chunks = [text, values["flag"].tobytes(), values["ids"].tobytes(), values["half"].tobytes()]
    inputs = [
        {"name": n, "shape": [1, 2], "datatype": t, "parameters": {"binary_data_size": len(c)}}
        for (n, t), c in zip(ECHO_TYPES.items(), chunks, strict=True)
    ]
    content, headers = binary_body(
        {"inputs": inputs, "parameters": {"binary_data_output": True}}, *chunks
    )
    meta, got = split_binary(client.post("/v2/models/echo/infer", content=content, headers=headers))
    assert [o["name"] for o in meta["outputs"]] == [f"{n}_out" for n in ECHO_TYPES]
    assert got == {f"{n}_out": c for n, c in zip(ECHO_TYPES, chunks, strict=True)}


def test_only_the_requested_outputs_come_back_in_their_format(client: httpx.Client) -> None:
    request = {
        "inputs": [{"name": n, "shape": [1, 2], "datatype": t, "data": d} for n, t, d in (
            ("text", "BYTES", ["a", "b"]), ("flag", "BOOL", [True, True]),
            ("ids", "INT64", [1, 2]), ("half", "FP16", [1.0, 2.0]))],
        "outputs": [{"name": "ids_out", "parameters": {"binary_data": True}}, {"name": "text_out"}],
    }  # fmt: skip
    meta, chunks = split_binary(client.post("/v2/models/echo/infer", json=request))
    assert [o["name"] for o in meta["outputs"]] == ["ids_out", "text_out"]
    assert meta["outputs"][1]["data"] == ["a", "b"]
    assert np.frombuffer(chunks["ids_out"], "<i8").tolist() == [1, 2]


# -- bad input: the right status, an {"error"}, and the server keeps serving --------------

X1 = rows(1).ravel().tolist()
GOOD_INPUT = {"name": "x", "shape": [1, 16], "datatype": "FP32", "data": X1}


def bad(why: str, status: int, inputs: list[Any] | None = None, **top: Any) -> Any:
    """A bad-request case: the request JSON around ``inputs`` (default: one good input)."""
    return why, json.dumps({"inputs": [GOOD_INPUT] if inputs is None else inputs, **top}), status


def changed(**fields: Any) -> list[Any]:
    return [{**GOOD_INPUT, **fields}]


BAD_JSON = [
    ("malformed JSON", '{"inputs": [', 400),
    ("not an object", "[]", 400),
    ("no inputs", '{"id": "a"}', 400),
    bad("empty inputs", 400, []),
    bad("id not a string", 400, id=7),
    bad("wrong datatype", 400, changed(datatype="INT32", data=[1] * 16)),
    bad("unknown datatype", 400, changed(datatype="BF16")),
    bad("wrong shape", 400, changed(shape=[1, 15], data=X1[:15])),
    bad("data does not fill shape", 400, changed(shape=[2, 16])),
    bad("nesting does not match shape", 400, changed(data=[X1[:8], X1[8:]])),
    bad("string in FP32 data", 400, changed(data=["1"] * 16)),
    bad("negative dim", 400, changed(shape=[-1, 16])),
    bad("unknown input", 400, [GOOD_INPUT, {**GOOD_INPUT, "name": "z"}]),
    bad("duplicate input", 400, [GOOD_INPUT, GOOD_INPUT]),
    bad("unknown output", 400, outputs=[{"name": "nope"}]),
    bad("classification", 400, outputs=[{"name": "logits", "parameters": {"classification": 2}}]),
    bad("shared memory", 400, changed(parameters={"shared_memory_region": "r"})),
    bad("more rows than max_batch_size", 413, changed(shape=[9, 16], data=X1 * 9)),
    bad("shape above the tensor limit", 413, changed(shape=[10**12, 16])),
    # Issue 21: a 4,301-digit integer (past Python's int-string limit) was a 500.
    ("a 4301-digit INT64", f'{{"inputs":[{{"name":"x","shape":[1],"datatype":"INT64",'
                           f'"data":[{"9" * 4301}]}}]}}', 400),
    ("a 4301-digit dim", f'{{"inputs":[{{"name":"x","shape":[{"9" * 4301}],'
                         '"datatype":"INT64","data":[1]}]}', 400),
]  # fmt: skip


@pytest.mark.parametrize(("why", "body", "status"), BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_bad_json_requests_get_their_status_and_an_error(
    client: httpx.Client, why: str, body: str, status: int
) -> None:
    r = client.post(
        "/v2/models/linear/infer", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == status, (why, r.text)
    assert isinstance(r.json()["error"], str) and r.json()["error"]
    assert "\n" not in r.json()["error"]
    assert_still_serving(client)


def _binary_case(size: int, payload: bytes, header_length: str | None = None) -> Any:
    text = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                     "parameters": {"binary_data_size": size}}]}
    ).encode()  # fmt: skip
    return text + payload, {HEADER: header_length or str(len(text))}


GOOD_BYTES = rows(1).tobytes()
BAD_BINARY = [
    ("binary_data_size beyond the body", *_binary_case(64, GOOD_BYTES[:32])),
    ("bytes after the last tensor", *_binary_case(64, GOOD_BYTES + b"\0" * 4)),
    ("size not the tensor's", *_binary_case(60, GOOD_BYTES[:60])),
    ("negative size", *_binary_case(-4, GOOD_BYTES)),
    ("header length not a number", *_binary_case(64, GOOD_BYTES, "abc")),
    ("header length negative", *_binary_case(64, GOOD_BYTES, "-1")),
    ("header length beyond the body", *_binary_case(64, GOOD_BYTES, "100000")),
    ("header length cutting the JSON", *_binary_case(64, GOOD_BYTES, "10")),
    ("binary input without the header", _binary_case(64, GOOD_BYTES)[0], {}),
    (
        "a 4301-digit binary_data_size",
        (text := _binary_case(64, b"")[0].replace(b"64", b"9" * 4301)) + GOOD_BYTES,
        {HEADER: str(len(text))},
    ),
]


@pytest.mark.parametrize(("why", "body", "headers"), BAD_BINARY, ids=[c[0] for c in BAD_BINARY])
def test_binary_bodies_that_do_not_add_up_are_400(
    client: httpx.Client, why: str, body: bytes, headers: dict[str, str]
) -> None:
    r = client.post("/v2/models/linear/infer", content=body, headers=headers)
    assert r.status_code == 400, (why, r.text)
    assert r.json()["error"]
    assert_still_serving(client)


def test_unknown_model_or_version_is_404_and_a_compressed_body_415(client: httpx.Client) -> None:
    request = infer_json(rows(1))
    assert client.post("/v2/models/nope/infer", json=request).status_code == 404
    assert client.post("/v2/models/linear/versions/7/infer", json=request).status_code == 404
    r = client.post(
        "/v2/models/linear/infer",
        content=json.dumps(request).encode(),
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 415 and r.json()["error"]
    r = client.get("/v2/models/linear/infer")
    assert r.status_code == 405 and r.json()["error"]
    assert_still_serving(client)


def test_a_failing_model_is_500_and_the_only_500(client: httpx.Client) -> None:
    request = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    r = client.post("/v2/models/broken/infer", json=request)
    assert r.status_code == 500 and "fell over" in r.json()["error"]
    assert_still_serving(client)


class HeldModel:
    """y = x over FP32[?, 16], queueing one request at most; compute waits while held.

    A lone request for an idle batcher is computed at once, so a test that
    needs requests to wait in the queue first holds a batch in compute.
    """

    CONFIG = ModelConfig.from_json(
        {
            "max_batch_size": 2,
            "max_queue_delay_ms": 60_000,
            "max_queue_size": 1,
            "inputs": [{"name": "x", "datatype": "FP32", "dims": [16]}],
            "outputs": [{"name": "y", "datatype": "FP32", "dims": [16]}],
        }
    )

    def __init__(self, hub: Hub, name: str) -> None:
        self.hub, self.name = hub, name
        self.released, self.entered = threading.Event(), threading.Event()
        self.released.set()
        hub.add_model(name, CallableExecutor(self._compute), config=self.CONFIG)
        self.batcher: DynamicBatcher = next(b for b in hub.batchers() if b.model == name)

    def _compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if np.any(inputs["x"]):  # the warm-up's zeros pass straight
            self.entered.set()
            assert self.released.wait(WAIT_S)
        return {"y": inputs["x"]}

    def hold(self) -> ResultFuture:
        """Put a batch in compute and keep it there until ``release``."""
        self.released.clear()
        future = self.hub.submit(self.name, {"x": rows(1)})
        assert self.entered.wait(WAIT_S)
        return future

    def release(self) -> None:
        self.released.set()

    def wait_queued(self, depth: int) -> float:
        """Wait until ``depth`` requests are queued; return the monotonic time it saw them."""
        end = time.monotonic() + WAIT_S
        while self.batcher.queue_depth < depth and time.monotonic() < end:
            time.sleep(0.005)
        assert self.batcher.queue_depth >= depth
        return time.monotonic()


def in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    got: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: got.append(call()))
    thread.start()
    return thread, got


def test_deadlines_are_504(client: httpx.Client, hub: Hub, url: str) -> None:
    x = infer_json(rows(1), parameters={"timeout": 1})  # 1 µs: gone before it is queued
    r = client.post("/v2/models/linear/infer", json=x)
    assert r.status_code == 504 and r.json()["error"]
    # Behind a batch held in compute, a request waits in the queue until its deadline passes.
    held = HeldModel(hub, "held-deadline")
    blocker = held.hold()
    body = infer_json(rows(1), parameters={"timeout": 200_000})  # 200 ms

    def post() -> httpx.Response:
        with httpx.Client(base_url=url, timeout=WAIT_S) as c:
            return c.post("/v2/models/held-deadline/infer", json=body)

    thread, got = in_thread(post)
    deadline = held.wait_queued(1) + 0.2  # received before this: its deadline is earlier
    while time.monotonic() <= deadline:
        time.sleep(0.01)
    held.release()
    thread.join(WAIT_S)
    blocker.result(WAIT_S)
    assert got[0].status_code == 504 and "queue" in got[0].json()["error"]
    assert_still_serving(client)


def test_a_full_queue_is_503_with_retry_after(client: httpx.Client, url: str, hub: Hub) -> None:
    held = HeldModel(hub, "held-narrow")
    blocker = held.hold()

    def post() -> httpx.Response:  # waits in the queue (one request fits) behind the blocker
        with httpx.Client(base_url=url, timeout=WAIT_S) as c:
            return c.post("/v2/models/held-narrow/infer", json=infer_json(rows(1)))

    thread, first = in_thread(post)
    held.wait_queued(1)
    r = client.post("/v2/models/held-narrow/infer", json=infer_json(rows(1)))
    held.release()
    thread.join(WAIT_S)
    blocker.result(WAIT_S)
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]
    assert first[0].status_code == 200  # computed once the held batch was done
    assert_still_serving(client)


# -- limits --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_url(hub: Hub) -> Iterator[str]:
    app = create_app(hub, max_body_bytes=4096, max_json_bytes=2048)
    with HttpServer(app, port=0) as server:
        yield server.url


def test_a_declared_body_above_the_limit_is_413_before_it_is_read(small_url: str) -> None:
    port = int(small_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(
            b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: hub\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{"
        )
        response = b""
        while b"\r\n\r\n" not in response or not response.endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert "error" in json.loads(body)


def test_a_streamed_body_above_the_limit_is_413(small_url: str) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(64):
            yield b" " * 1024

    with httpx.Client(base_url=small_url, timeout=WAIT_S) as c:
        r = c.post("/v2/models/linear/infer", content=chunks())
        assert r.status_code == 413 and r.json()["error"]
        big_json = json.dumps(infer_json(rows(8)))  # within the body limit, not the JSON one
        assert 2048 < len(big_json) <= 4096
        r = c.post("/v2/models/linear/infer", content=big_json)
        assert r.status_code == 413 and "binary" in r.json()["error"]
        x = rows(8, seed=3)  # 512 bytes of binary are fine
        content, headers = binary_body(
            {"inputs": [{"name": "x", "shape": [8, 16], "datatype": "FP32",
                         "parameters": {"binary_data_size": x.nbytes}}]}, x.tobytes()
        )  # fmt: skip
        assert (
            c.post("/v2/models/linear/infer", content=content, headers=headers).status_code == 200
        )


# -- the in-flight byte budget ---------------------------------------------------------------


def _padded(x: np.ndarray, size: int) -> bytes:
    """A JSON body of ``size`` bytes (trailing whitespace is valid JSON)."""
    text = json.dumps(infer_json(x)).encode()
    assert len(text) <= size
    return text + b" " * (size - len(text))


def test_bodies_held_at_once_past_the_budget_are_503_and_answered_ones_give_it_back(
    hub: Hub,
) -> None:
    held = HeldModel(hub, "held-budget")
    app = create_app(hub, max_body_bytes=1024, max_json_bytes=1024, max_inflight_bytes=1024)
    path = "/v2/models/held-budget/infer"
    json_type = {"content-type": "application/json"}
    with HttpServer(app, port=0) as server, httpx.Client(base_url=server.url, timeout=WAIT_S) as c:
        blocker = held.hold()

        def post() -> httpx.Response:  # 700 bytes, held in the queue behind the blocker
            with httpx.Client(base_url=server.url, timeout=WAIT_S) as other:
                return other.post(path, content=_padded(rows(1, seed=1), 700), headers=json_type)

        thread, first = in_thread(post)
        held.wait_queued(1)
        over = c.post(path, content=_padded(rows(1, seed=2), 700), headers=json_type)
        held.release()
        thread.join(WAIT_S)
        blocker.result(WAIT_S)
        assert over.status_code == 503 and "budget" in over.json()["error"], over.text
        assert first[0].status_code == 200
        # Answered and refused bodies give their bytes back: 40 bodies, 28 KB, one at a time.
        for i in range(40):
            body = _padded(rows(1, seed=i), 700) if i % 4 else b"{" + b" " * 699
            r = c.post(path, content=body, headers=json_type)
            assert r.status_code == (200 if i % 4 else 400), (i, r.text)
