"""A hub's memory per request is bounded by the request: big JSON bodies cost about their size.

Four 15 MiB JSON bodies at once (under the 16 MiB JSON limit, refused with 400
after parsing because the tensor's shape is wrong) once raised an in-process
hub from ~110 MB to 1-1.7 GB, kept afterwards. Here a real multi-process hub
(``HubSupervisor``) takes them through its HTTP ingress process.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from ._brokers import free_port
from ._plane import linear_repo, running_hub, wait_until

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


def _pss(pid: int) -> int:
    """Proportional set size in bytes (shared pages counted once across processes)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no Pss for {pid}")


def _body(elements: int) -> bytes:
    rng = np.random.default_rng(0)
    data = rng.random(elements).round(6).tolist()
    # A flat [1, n] tensor for a model that takes [n, 16]: refused once parsed.
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, elements], "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def test_four_15_mib_json_bodies_cost_about_their_size_and_are_given_back(
    tmp_path: Path,
) -> None:
    body = _body(1_800_000)
    assert 14 * MiB < len(body) < 16 * MiB
    port = free_port()
    with running_hub(linear_repo(tmp_path / "repo"), None, mqtt=0, http_port=port) as hub:
        pids = [c.pid for c in hub.children if c.pid is not None]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_until(lambda: http.get("/v2/health/ready").status_code == 200, what="ready")
            small = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                 "data": [0.0] * 16}]}  # fmt: skip
            ok = http.post("/v2/models/linear/infer", json=small)
            assert ok.status_code == 200  # warm: the first request's imports are not counted
            before = sum(_pss(p) for p in pids)
            peak = [before]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.01):
                    peak[0] = max(peak[0], sum(_pss(p) for p in pids))

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    replies = list(
                        pool.map(
                            lambda _: http.post(
                                "/v2/models/linear/infer",
                                content=body,
                                headers={"Content-Type": "application/json"},
                            ),
                            range(4),
                        )
                    )
            finally:
                done.set()
                sampler.join()
            for reply in replies:
                assert reply.status_code == 400 and "shape" in reply.json()["error"]
            in_flight = 4 * len(body)
            assert peak[0] - before <= 3 * in_flight, (before, peak[0])
            wait_until(
                lambda: sum(_pss(p) for p in pids) - before <= 24 * MiB,
                timeout_s=20,
                what="the memory given back",
            )
            assert http.post("/v2/models/linear/infer", json=small).status_code == 200
