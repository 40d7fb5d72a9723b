"""Triton's statistics and repository index on the multi-process hub (real supervisor,
ingress and executor processes, real ONNX Runtime), read with ``tritonclient.http``:
the counts come from every process's metrics book and match the requests sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cloud_hub.plane._supervisor import HubSupervisor

from ._brokers import free_port
from ._plane import expected_logits, linear_repo, running_hub, wait_until

pytestmark = pytest.mark.slow
tritonhttp = pytest.importorskip("tritonclient.http")  # a dev dependency: the test oracle


@pytest.fixture(scope="module")
def http_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubSupervisor, int]]:
    repo = linear_repo(tmp_path_factory.mktemp("plane-stats-repo"))
    port = free_port()
    with running_hub(repo, None, mqtt=0, http_port=port) as hub:
        yield hub, port


def test_statistics_sum_what_every_process_counted(http_hub: tuple[HubSupervisor, int]) -> None:
    _, port = http_hub
    triton = tritonhttp.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8)
    try:
        wait_until(triton.is_server_ready, what="the hub to be ready")
        rng = np.random.default_rng(5)
        sizes = [int(n) for n in rng.integers(1, 4, size=12)]
        inputs = [rng.normal(size=(n, 16)).astype(np.float32) for n in sizes]
        pending = []
        for x in inputs:
            tensor = tritonhttp.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            pending.append(triton.async_infer("linear", [tensor]))
        for x, answer in zip(inputs, pending, strict=True):
            got = answer.get_result().as_numpy("logits")
            np.testing.assert_allclose(got, expected_logits(x), rtol=1e-5, atol=1e-5)

        def stats() -> dict[str, Any]:
            (entry,) = triton.get_inference_statistics("linear")["model_stats"]
            return entry

        def settled() -> bool:  # each process writes its book about every second
            now = stats()["inference_stats"]
            return now["success"]["count"] == len(sizes) and now["queue"]["count"] == len(sizes)

        wait_until(settled, what="the books to count every request")
        entry = stats()
        assert entry["version"] == "1"
        assert entry["inference_count"] == sum(sizes)
        assert 1 <= entry["execution_count"] <= len(sizes)
        batches = entry["batch_stats"]
        assert sum(b["compute_infer"]["count"] for b in batches) == entry["execution_count"]
        assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == sum(sizes)
        assert entry["inference_stats"]["fail"]["count"] == 0
        assert entry["last_inference"] > 0
        index = triton.get_model_repository_index()
        assert [(e["name"], e["version"], e["state"]) for e in index] == [("linear", "1", "READY")]
    finally:
        triton.close()
