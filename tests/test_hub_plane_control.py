"""Triton's repository load and unload on the multi-process hub (real supervisor, HTTP
ingress and executor processes, real ONNX Runtime), driven with ``tritonclient.http``
and raw HTTP: a pinned version swaps in while requests keep answering, unload stops
serving, a load without a version follows the repository again, and a load that cannot
be done says why while the version serving keeps serving."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ._brokers import free_port
from ._models import linear_classifier_weights, write_linear_classifier
from ._plane import linear_repo, running_hub, wait_until

pytestmark = pytest.mark.slow
tritonhttp = pytest.importorskip("tritonclient.http")  # a dev dependency: the test oracle
from tritonclient.utils import InferenceServerException  # noqa: E402

_SEEDS = {"1": 0, "2": 7}  # version -> the seed of its weights


def _logits(x: np.ndarray, version: str) -> np.ndarray:
    weight, bias = linear_classifier_weights(seed=_SEEDS[version])
    return (x @ weight + bias).astype(np.float32)


def _infer(triton: Any, x: np.ndarray) -> tuple[str, np.ndarray]:
    tensor = tritonhttp.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = triton.infer("linear", [tensor])
    return str(result.get_response()["model_version"]), result.as_numpy("logits")


class _Traffic:
    """Requests in a thread while the versions change: every answer kept, every error too."""

    def __init__(self, url: str) -> None:
        self.triton = tritonhttp.InferenceServerClient(url)
        self.answers: list[tuple[np.ndarray, str, np.ndarray]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(3)
        while not self._stop.is_set():
            x = rng.normal(size=(2, 16)).astype(np.float32)
            try:
                self.answers.append((x, *_infer(self.triton, x)))
            except InferenceServerException as e:
                self.errors.append(str(e))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.triton.close()


def test_load_pins_a_version_unload_stops_it_and_failures_keep_what_serves(
    tmp_path: Path,
) -> None:
    repo = linear_repo(tmp_path / "repo")  # version 1
    write_linear_classifier(repo / "linear" / "2" / "model.onnx", seed=7)  # served at start
    port = free_port()
    url = f"127.0.0.1:{port}"
    control = f"http://{url}/v2/repository/models/linear"
    x = np.random.default_rng(9).normal(size=(3, 16)).astype(np.float32)
    with running_hub(repo, None, mqtt=0, http_port=port) as hub:
        triton = tritonhttp.InferenceServerClient(url)
        try:
            wait_until(triton.is_server_ready, what="the hub to be ready")
            assert _infer(triton, x)[0] == "2"

            traffic = _Traffic(url)  # a pinned load swaps while requests stream
            try:
                wait_until(lambda: len(traffic.answers) >= 5, what="traffic on version 2")
                pinned = httpx.post(f"{control}/load", json={"parameters": {"version": "1"}},
                                    timeout=120)  # fmt: skip
                assert pinned.status_code == 200, pinned.text
                # The traffic thread has at most one request in flight: the one sent before
                # the load returned may still come back from version 2, so skip it.
                seen = len(traffic.answers) + 1
                wait_until(lambda: len(traffic.answers) >= seen + 5, what="traffic after it")
                after = traffic.answers[seen:]
            finally:
                traffic.stop()
            assert traffic.errors == []
            assert {v for _, v, _ in traffic.answers} == {"1", "2"}
            assert {v for _, v, _ in after} == {"1"}  # the load answered once 1 served
            for sent, version, got in traffic.answers:
                np.testing.assert_allclose(got, _logits(sent, version), rtol=1e-5, atol=1e-5)
            assert hub.served["linear"].version == "1"

            triton.unload_model("linear")
            assert not triton.is_model_ready("linear") and "linear" not in hub.served
            with pytest.raises(InferenceServerException):
                _infer(triton, x)
            index = {e["name"]: e for e in triton.get_model_repository_index()}
            assert index["linear"]["state"] == "UNAVAILABLE", index
            wait_until(lambda: not [c for c in hub.children if c.role == "executor"],
                       what="the unloaded model's executor retiring")  # fmt: skip

            triton.load_model("linear")  # no version: the repository's choice, the highest
            version, got = _infer(triton, x)
            assert version == "2"
            np.testing.assert_allclose(got, _logits(x, "2"), rtol=1e-5, atol=1e-5)

            missing = httpx.post(f"{control}/load", json={"parameters": {"version": 9}})
            assert missing.status_code == 400
            assert "version 9 of model linear is not in the repository" in missing.text
            assert "version 2 keeps serving" in missing.text

            broken = repo / "linear" / ".staging"
            broken.mkdir()
            (broken / "model.onnx").write_bytes(b"not an onnx model")
            broken.rename(repo / "linear" / "3")
            failed = httpx.post(f"{control}/load", json={"parameters": {"version": "3"}},
                                timeout=120)  # fmt: skip
            assert failed.status_code == 400 and "version 3 did not load" in failed.text
            assert _infer(triton, x)[0] == "2"  # what served, serves

            sent = httpx.post(f"{control}/load", json={"parameters": {"config": "{}"}})
            assert sent.status_code == 400 and "'config' is not supported" in sent.text
            assert httpx.post(f"{control}/load", content=b"[").status_code == 400
            with pytest.raises(InferenceServerException, match="not in the repository"):
                triton.load_model("nope")
        finally:
            triton.close()
