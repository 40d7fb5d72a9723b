"""What the HTTP API tests share: a module-scoped hub serving real ONNX models
(and two callable ones) behind a real uvicorn, an httpx client for it, and the
helpers that build and take apart Open Inference Protocol v2 bodies.

The fixtures ``hub``, ``url`` and ``client`` (functions ``*_fixture``, so that a
test's parameter does not shadow the import) are imported into each test module
that uses them, where pytest finds them; ``scope="module"`` gives each such
module its own hub and server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_hub import CallableExecutor, Hub, ModelConfig
from cloud_hub.http import HttpServer, create_app

from ._models import linear_classifier_weights, write_linear_classifier

__all__ = [
    "BROKEN",
    "ECHO",
    "ECHO_TYPES",
    "HEADER",
    "WAIT_S",
    "B",
    "W",
    "assert_still_serving",
    "binary_body",
    "broken",
    "client_fixture",
    "echo",
    "hub_fixture",
    "infer_json",
    "metric",
    "rows",
    "split_binary",
    "url_fixture",
    "write_repo",
]

W, B = linear_classifier_weights()
HEADER = "Inference-Header-Content-Length"
WAIT_S = 30.0


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


def write_repo(root: Path) -> Path:
    """linear: quick batches; batched: leaves only when 8 rows are in; narrow: one request."""
    configs = {
        "linear": {"max_batch_size": 8, "max_queue_delay_ms": 1},
        "batched": {"max_batch_size": 8, "max_queue_delay_ms": 60_000},
        "narrow": {"max_batch_size": 2, "max_queue_delay_ms": 60_000, "max_queue_size": 1},
    }
    for name, config in configs.items():
        write_linear_classifier(root / name / "1" / "model.onnx")
        (root / name / "config.json").write_text(json.dumps(config))
    return root


def echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{name}_out": value for name, value in inputs.items()}


def broken(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if np.any(inputs["x"]):  # the warm-up's zeros pass; real data makes the model fail
        raise RuntimeError("the model fell over")
    return {"y": inputs["x"]}


ECHO_TYPES = {"text": "BYTES", "flag": "BOOL", "ids": "INT64", "half": "FP16"}
ECHO = ModelConfig.from_json(
    {
        "max_batch_size": 4,
        "max_queue_delay_ms": 0,
        "inputs": [{"name": n, "datatype": t, "dims": [2]} for n, t in ECHO_TYPES.items()],
        "outputs": [
            {"name": f"{n}_out", "datatype": t, "dims": [2]} for n, t in ECHO_TYPES.items()
        ],
    }
)
BROKEN = ModelConfig.from_json(
    {
        "max_batch_size": 4,
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [2]}],
    }
)


@pytest.fixture(scope="module", name="hub")
def hub_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with Hub(write_repo(tmp_path_factory.mktemp("http-repo"))) as running:
        running.add_model("echo", CallableExecutor(echo), config=ECHO)
        running.add_model("broken", CallableExecutor(broken), config=BROKEN)
        yield running


@pytest.fixture(scope="module", name="url")
def url_fixture(hub: Hub) -> Iterator[str]:
    with HttpServer(create_app(hub), port=0) as server:
        yield server.url


@pytest.fixture(name="client")
def client_fixture(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=WAIT_S) as c:
        yield c


def infer_json(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ],
        **extra,
    }


def binary_body(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + b"".join(chunks), {HEADER: str(len(text))}


def split_binary(response: httpx.Response) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The JSON part and each binary output's bytes of a binary response."""
    n = int(response.headers[HEADER])
    header = json.loads(response.content[:n])
    chunks, offset = {}, n
    for out in header["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            chunks[out["name"]] = response.content[offset : offset + size]
            offset += size
    assert offset == len(response.content)
    return header, chunks


def assert_still_serving(client: httpx.Client) -> None:
    x = rows(1, seed=99)
    r = client.post("/v2/models/linear/infer", json=infer_json(x))
    assert r.status_code == 200, r.text
    got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 4)
    np.testing.assert_allclose(got, x @ W + B, rtol=1e-5, atol=1e-5)


def metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
