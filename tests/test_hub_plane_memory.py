"""A hub's memory per request is bounded by the request, whatever the body holds.

Eight 15 MiB JSON bodies whose element count did not match their shape once
raised the hub by ~1.4 GB, kept afterwards; four 7.5 MiB ones peaked at 12x
the bytes in flight (issue 21, item 5). Here a real ``tandem hub`` (its
supervisor, HTTP ingress and executor processes) takes four ~7 MiB bodies at
once that pass every check and are computed, then eight as large that do not
(a count one off either way, ragged or over-nested rows, strings, mixed
values, integers no datatype holds, deep nesting): the RSS of its process
tree may rise by at most 3x the bytes in flight, and must come back near
where it was within seconds.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from ._brokers import MosquittoProcess, free_port
from ._hub_process import tandem_hub, tree_rss
from ._models import write_linear_classifier
from ._plane import wait_until

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
WIDTH = 262_144  # the model takes x: FP32[n, WIDTH]
ROWS = 3  # ~7 MiB of JSON a body
PATH = "/v2/models/wide/infer"
SETTLED = 24 * MiB  # "back near where it was"


def _repo(root: Path) -> Path:
    write_linear_classifier(root / "wide" / "1" / "model.onnx", in_features=WIDTH)
    (root / "wide" / "config.json").write_text('{"max_batch_size": 8, "max_queue_delay_ms": 5}')
    return root


def _numbers(n: int, seed: int) -> list[bytes]:
    values = np.random.default_rng(seed).random(n).round(6)
    return [f"{v:.6f}".encode() for v in values]


def _body(datatype: str, shape: list[int], data: bytes) -> bytes:
    head = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{json.dumps(shape)},'
    return head.encode() + b'"data":' + data + b"}]}"


def _rows(numbers: list[bytes], widths: list[int]) -> bytes:
    rows, start = [], 0
    for width in widths:
        rows.append(b"[" + b",".join(numbers[start : start + width]) + b"]")
        start += width
    return b"[" + b",".join(rows) + b"]"


def _flat(items: list[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


def _valid(seed: int) -> bytes:
    return _body("FP32", [ROWS, WIDTH], _rows(_numbers(ROWS * WIDTH, seed), [WIDTH] * ROWS))


def _hostile() -> dict[str, bytes]:
    n = ROWS * WIDTH
    numbers = _numbers(n + 1, 99)
    shape = [ROWS, WIDTH]
    return {
        "one too few": _body("FP32", shape, _flat(numbers[: n - 1])),
        "one too many": _body("FP32", shape, _flat(numbers)),
        "ragged rows": _body("FP32", shape, _rows(numbers, [WIDTH, WIDTH + 1, WIDTH - 1])),
        "a list per number": _body("FP32", shape, _flat([b"[" + v + b"]" for v in numbers[:n]])),
        "strings": _body("FP32", shape, _flat([b'"' + v + b'"' for v in numbers[:n]])),
        "mixed": _body(
            "FP32", shape, _flat([b"null", b'"abcdef"', b"true", b"0.123456"] * (n // 4))
        ),
        "huge integers": _body("INT64", [ROWS, WIDTH // 8], _flat([b"7" * 60] * (n // 8))),
        "deep nesting": _body("FP32", [1], b"[" * (3 * MiB) + b"1" + b"]" * (3 * MiB)),
    }


class Peak:
    """The highest value of ``measure()`` while the block runs (sampled every 10 ms)."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self.measure = measure
        self.value = measure()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.value = max(self.value, self.measure())

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


def _post_all(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    def post(body: bytes) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=120) as client:
            return client.post(PATH, content=body, headers={"Content-Type": "application/json"})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(post, bodies))


def test_bodies_that_pass_and_bodies_that_do_not_cost_at_most_3x_and_are_given_back(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    valid = [_valid(seed) for seed in range(4)]
    hostile = _hostile()
    assert all(5 * MiB < len(b) < 9 * MiB for b in [*valid, *hostile.values()])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tandem_hub(_repo(tmp_path / "repo"), mosquitto.url, port, tmp_path / "hub.log") as hub:
        warm = _valid(9)  # the first request's imports and buffers are not counted
        assert _post_all(url, [warm])[0].status_code == 200
        for name, bodies in (("pass", valid), ("fail", list(hostile.values()))):
            before = tree_rss(hub.pid)
            with Peak(lambda: tree_rss(hub.pid)) as peak:
                replies = [
                    r for i in range(0, len(bodies), 4) for r in _post_all(url, bodies[i : i + 4])
                ]
            for reply, label in zip(replies, hostile if name == "fail" else range(4), strict=True):
                if name == "pass":
                    assert reply.status_code == 200, reply.text
                    assert reply.json()["outputs"][0]["shape"] == [ROWS, 4]
                else:
                    error = reply.json()["error"]
                    assert reply.status_code == 400 and "\n" not in error, (label, reply.text)
            in_flight = 4 * max(map(len, bodies))
            print(name, "before", before / MiB, "peak +", (peak.value - before) / MiB,
                  "in flight", in_flight / MiB)  # fmt: skip
            assert peak.value - before <= 3 * in_flight, (name, before, peak.value)
            wait_until(
                lambda before=before: tree_rss(hub.pid) - before <= SETTLED,
                timeout_s=10,
                what=f"the memory of the bodies that {name} given back",
            )
            print(name, "after", (tree_rss(hub.pid) - before) / MiB)
        assert _post_all(url, [warm])[0].status_code == 200
