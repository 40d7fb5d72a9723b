"""Part c's own parts: the heavy model it builds, its echo baselines and load generators.

The figures live in bench/ (BENCHMARKS.md); these tests only check that what
the bench measures with is what it says it is, on a real broker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench._heavy_model import heavy_model
from bench._load_mqtt import CrtMqttLoad, PahoMqttLoad
from bench._procs import EchoProcess
from cloud_hub import OnnxExecutor

from ._brokers import MosquittoProcess


def test_heavy_model_is_the_same_bytes_every_time_and_answers_each_row_alone(
    tmp_path: Path,
) -> None:
    model = heavy_model()
    assert heavy_model() == model  # fixed weights: every run times the same network
    path = tmp_path / "heavy.onnx"
    path.write_bytes(model)
    executor = OnnxExecutor(path)
    try:
        (spec,) = executor.inputs
        rows = np.random.default_rng(3).random((5, 1, 28, 28), dtype=np.float32)
        (batched,) = executor.run_batch({spec.name: rows}).values()
        alone = [next(iter(executor.run_batch({spec.name: r[None]}).values())) for r in rows]
    finally:
        executor.close()
    assert batched.shape == (5, 10) and np.isfinite(batched).all()
    # A batch computes what its rows compute one by one, in their order: batching on
    # and off time the same work.
    np.testing.assert_allclose(batched, np.concatenate(alone), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("mode", "load_class"), [("echo-crt", CrtMqttLoad), ("echo", PahoMqttLoad)]
)
def test_echo_consumer_answers_each_device_on_its_own_reply_topic(
    mosquitto: MosquittoProcess, tmp_path: Path, mode: str, load_class: type
) -> None:
    prefix = f"bench-test/{mode}"
    with EchoProcess(mosquitto.url, f"{prefix}/dev/+/infer/+", "-", tmp_path, mode=mode).start():
        load = load_class(mosquitto.url, prefix=prefix, name=f"bench-test-{mode}")
        try:
            window = load.run("echo", {"x": np.zeros((1, 8), np.float32)}, 8, 0.1, 0.3)
        finally:
            load.close()
    # Every requester's frame came back to its own device's reply topic and was matched
    # by its id: answers arrived in the window, none failed, none was left in flight.
    assert window.errors == 0
    assert window.latencies_ms and window.answered >= len(window.latencies_ms)
