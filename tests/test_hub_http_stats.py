"""Triton's statistics and repository extensions on a real hub behind a real uvicorn,
read with Triton's own ``tritonclient.http`` (the oracle): the counts match the
requests sent, the repository index lists what is served, the embedded hub
refuses load and unload with 400 naming what serves them, and with API keys only an admin key
(``rollout:admin``) reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cloud_hub import Hub
from cloud_hub.http import HttpServer, create_app
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key

from ._hub_http_kit import WAIT_S, infer_json, rows
from ._hub_http_kit import client_fixture as client_fixture
from ._hub_http_kit import hub_fixture as hub_fixture
from ._hub_http_kit import url_fixture as url_fixture

tritonhttp = pytest.importorskip("tritonclient.http")  # a dev dependency: the test oracle
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


def wait_for(what: Callable[[], Any], why: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {why}")


@pytest.fixture(name="triton")
def triton_fixture(url: str) -> Iterator[Any]:
    client = tritonhttp.InferenceServerClient(url.removeprefix("http://"), concurrency=8)
    try:
        yield client
    finally:
        client.close()


def send(triton: Any, model: str, sizes: list[int]) -> None:
    """One request per size (its rows), sent at once so that some may batch together."""
    results = []
    for i, n in enumerate(sizes):
        tensor = tritonhttp.InferInput("x", [n, 16], "FP32")
        tensor.set_data_from_numpy(rows(n, seed=i))
        results.append(triton.async_infer(model, [tensor]))
    for n, result in zip(sizes, results, strict=True):
        assert result.get_result().as_numpy("logits").shape == (n, 4)


def stats_of(triton: Any, model: str, version: str = "") -> dict[str, Any]:
    answer = triton.get_inference_statistics(model_name=model, model_version=version)
    (entry,) = answer["model_stats"]
    return entry


def test_statistics_count_the_requests_sent(triton: Any, client: httpx.Client) -> None:
    before = stats_of(triton, "linear")
    sizes = [1, 2, 3, 1, 2, 5, 1, 1]
    send(triton, "linear", sizes)
    bad = client.post("/v2/models/linear/infer", json=infer_json(rows(1)[:, :3]))
    assert bad.status_code == 400
    sent = len(sizes)

    def settled() -> dict[str, Any] | None:  # queue times are counted as the answers leave
        now = stats_of(triton, "linear")
        queued = now["inference_stats"]["queue"]["count"]
        return now if queued - before["inference_stats"]["queue"]["count"] >= sent else None

    now = wait_for(settled, "every request's queue time to be counted")
    stats, was = now["inference_stats"], before["inference_stats"]
    assert now["name"] == "linear" and now["version"] == "1"
    assert stats["success"]["count"] - was["success"]["count"] == sent
    assert stats["success"]["ns"] > was["success"]["ns"]
    assert stats["fail"]["count"] - was["fail"]["count"] == 1
    assert stats["compute_infer"]["count"] - was["compute_infer"]["count"] == sent
    executions = now["execution_count"] - before["execution_count"]
    assert 1 <= executions <= sent
    assert now["inference_count"] - before["inference_count"] == sum(sizes)
    batches = now["batch_stats"]
    assert sum(b["compute_infer"]["count"] for b in batches) == now["execution_count"]
    assert (
        sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches)
        == (now["inference_count"])
    )
    assert all(b["compute_infer"]["ns"] > 0 for b in batches)
    assert now["last_inference"] >= 1000 * int(time.time() - 3600)
    assert stats_of(triton, "linear", "1") == stats_of(triton, "linear")


def test_statistics_of_every_model_and_refusals(triton: Any, hub: Hub) -> None:
    every = triton.get_inference_statistics()["model_stats"]
    assert sorted(e["name"] for e in every) == sorted(hub.dispatcher.model_names())
    untouched = next(e for e in every if e["name"] == "narrow")
    assert untouched["execution_count"] == 0 and untouched["batch_stats"] == []
    for model, version in (("nope", ""), ("linear", "7")):
        with pytest.raises(InferenceServerException):
            triton.get_inference_statistics(model_name=model, model_version=version)


def test_repository_index_lists_what_is_served(triton: Any, hub: Hub, client: httpx.Client) -> None:
    index = triton.get_model_repository_index()
    assert sorted(e["name"] for e in index) == sorted(hub.dispatcher.model_names())
    for entry in index:
        assert entry["version"] == hub.dispatcher.describe(entry["name"], None).version
        assert entry["state"] == "READY" and entry["reason"] == ""
    assert client.post("/v2/repository/index", json={"ready": True}).json() == index
    assert client.get("/v2/repository/index").json() == index
    assert client.post("/v2/repository/index", json={"ready": "yes"}).status_code == 400


def test_the_embedded_hub_refuses_load_and_unload_naming_what_serves_them(
    triton: Any, client: httpx.Client
) -> None:
    for action in ("load", "unload"):
        response = client.post(f"/v2/repository/models/linear/{action}")
        assert response.status_code == 400
        assert "not supported" in response.json()["error"]
        assert "tandem hub serves load and unload" in response.json()["error"]
    with pytest.raises(InferenceServerException, match="not supported"):
        triton.load_model("linear")
    assert triton.is_model_ready("linear")  # nothing was unloaded


@pytest.fixture(name="secured")
def secured_fixture(hub: Hub, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    keys_file = tmp_path / "api-keys.json"
    keys = {}
    for scopes in (["infer", "models:read"], ["rollout:admin"]):
        text, record = generate_api_key(scopes)
        ApiKeyFile(keys_file).add(record)
        keys[scopes[0]] = text
    guard = ApiKeyGuard(ApiKeyFile(keys_file).keys)
    with HttpServer(create_app(hub, api_keys=guard), port=0) as server:
        yield server.url, keys


ADMIN_ROUTES = [
    ("GET", "/v2/models/stats"),
    ("GET", "/v2/models/linear/stats"),
    ("GET", "/v2/models/linear/versions/1/stats"),
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/repository/index"),
    ("POST", "/v2/repository/models/linear/load"),
    ("POST", "/v2/repository/models/linear/unload"),
]


def test_only_an_admin_key_reads_statistics_and_the_repository(
    secured: tuple[str, dict[str, str]],
) -> None:
    url, keys = secured
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        for method, path in ADMIN_ROUTES:
            assert http.request(method, path).status_code == 401, path
            infer_key = {"Authorization": f"Bearer {keys['infer']}"}
            assert http.request(method, path, headers=infer_key).status_code == 403, path
            admin = {"Authorization": f"Bearer {keys['rollout:admin']}"}
            assert http.request(method, path, headers=admin).status_code in (200, 400), path
        infer_key = {"Authorization": f"Bearer {keys['infer']}"}
        assert http.get("/v2/models/linear", headers=infer_key).status_code == 200
    triton = tritonhttp.InferenceServerClient(url.removeprefix("http://"))
    try:
        admin = {"Authorization": f"Bearer {keys['rollout:admin']}"}
        assert triton.get_inference_statistics("linear", headers=admin)["model_stats"]
        with pytest.raises(InferenceServerException):
            triton.get_inference_statistics("linear", headers=infer_key)
    finally:
        triton.close()
