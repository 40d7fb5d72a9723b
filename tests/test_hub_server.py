"""The Hub in process (no broker), its public surface, its failure paths, and its CLI."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import cloud_hub
from cloud_hub import (
    BrokerError,
    CallableExecutor,
    Hub,
    HubStoppingError,
    InvalidRequestError,
    ModelConfig,
    ModelNotFoundError,
)
from shared import ErrorCode, MqttSettings
from tandem.cli.hub import hub as hub_command

from ._brokers import free_port
from ._models import linear_classifier_weights, write_linear_classifier

WAIT_S = 10.0


def config(**overrides: object) -> ModelConfig:
    """A model of x FP32[?, 2] -> y FP32[?, 2]."""
    return ModelConfig.from_json(
        {
            "max_batch_size": 4,
            "max_queue_delay_ms": 0,
            "inputs": [{"name": "x", "datatype": "FP32", "dims": [2]}],
            "outputs": [{"name": "y", "datatype": "FP32", "dims": [2]}],
            **overrides,
        }
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    return tmp_path / "repo"


def hub_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("batcher-", "hub-replies", "paho-mqtt-client-tandem-hub"))
    ]


def test_all_names_the_public_api_and_nothing_private():
    assert sorted(cloud_hub.__all__) == cloud_hub.__all__
    for name in cloud_hub.__all__:
        assert not name.startswith("_") and hasattr(cloud_hub, name)
    public = {
        n
        for n, v in vars(cloud_hub).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)  # its subpackages
    }
    assert public <= set(cloud_hub.__all__)


def test_every_hub_error_maps_to_a_wire_code():
    assert cloud_hub.error_code(cloud_hub.OverloadedError()) is ErrorCode.OVERLOADED
    assert cloud_hub.error_code(HubStoppingError()) is ErrorCode.OVERLOADED
    assert cloud_hub.error_code(cloud_hub.RequestTooLargeError()) is ErrorCode.TOO_LARGE
    assert cloud_hub.error_code(ModelNotFoundError()) is ErrorCode.UNKNOWN_MODEL
    assert cloud_hub.error_code(KeyError("x")) is ErrorCode.INTERNAL


def test_the_hub_serves_in_process_without_a_broker(repo):
    with Hub(repo) as hub:
        x = np.ones((2, 16), np.float32)
        result = hub.submit("linear", {"x": x}).result(WAIT_S)
        weight, bias = linear_classifier_weights()
        np.testing.assert_allclose(result.outputs["logits"], x @ weight + bias, rtol=1e-5)
        with pytest.raises(ModelNotFoundError):
            hub.submit("resnet", {"x": x})
        with pytest.raises(ModelNotFoundError, match="version '9'"):
            hub.submit("linear", {"x": x}, version="9")
        with pytest.raises(InvalidRequestError):
            hub.submit("linear", {"x": x.astype(np.float16)})
        assert hub.metrics()["linear@1"].completed == 1
    assert hub_threads() == []


def test_a_model_added_while_running_is_served_and_can_be_replaced():
    with Hub() as hub:
        hub.add_model("double", CallableExecutor(lambda i: {"y": i["x"] * 2}), config=config())
        x = np.ones((1, 2), np.float32)
        assert hub.submit("double", {"x": x}).result(WAIT_S).outputs["y"].tolist() == [[2, 2]]
        hub.add_model(
            "double", CallableExecutor(lambda i: {"y": i["x"] * 3}), version=2, config=config()
        )
        result = hub.submit("double", {"x": x}).result(WAIT_S)
        assert (result.model_version, result.outputs["y"].tolist()) == ("2", [[3, 3]])
        assert list(hub.metrics()) == ["double@2"]


def test_stop_answers_queued_requests_and_refuses_new_ones():
    entered, gate = threading.Event(), threading.Event()

    def slow(inputs):
        if inputs["x"].any():  # warm-up zeros pass straight through
            entered.set()
            assert gate.wait(WAIT_S)
        return {"y": inputs["x"]}

    hub = Hub().start()
    try:
        hub.add_model("slow", CallableExecutor(slow), config=config(max_batch_size=1))
        running = hub.submit("slow", {"x": np.ones((1, 2), np.float32)})
        assert entered.wait(WAIT_S)
        queued = hub.submit("slow", {"x": np.ones((1, 2), np.float32)})
        stopper = threading.Thread(target=hub.stop)
        stopper.start()
        with pytest.raises(HubStoppingError):
            queued.result(WAIT_S)
    finally:
        gate.set()
    stopper.join(WAIT_S)
    assert running.result(WAIT_S).outputs["y"].tolist() == [[1, 1]]
    with pytest.raises(HubStoppingError):
        hub.submit("slow", {"x": np.ones((1, 2), np.float32)})
    hub.stop()  # twice is fine
    assert hub_threads() == []


def test_a_hub_that_cannot_reach_its_broker_fails_start_and_leaves_nothing_running(repo):
    hub = Hub(
        repo,
        mqtt=MqttSettings(port=free_port(), protocol="3.1.1"),
        connect_timeout_s=0.5,
    )
    # the session says why: nothing listens there
    with pytest.raises(BrokerError, match=r"no subscription .*\(cannot reach the MQTT broker"):
        hub.start()
    assert hub_threads() == []
    assert len(hub.repository) == 0  # the models it loaded were released


def test_run_forever_returns_when_asked_to_stop(repo):
    hub = Hub(repo)
    runner = threading.Thread(target=hub.run_forever)
    runner.start()
    deadline = time.monotonic() + WAIT_S
    while not hub.metrics() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "linear@1" in hub.metrics()
    hub.request_stop()
    runner.join(WAIT_S)
    assert not runner.is_alive() and hub_threads() == []


# -- the CLI ---------------------------------------------------------------------------------


def cli():
    import typer

    app = typer.Typer(add_completion=False)
    app.command()(hub_command)
    return app


def test_the_help_teaches_the_layout_and_the_options():
    result = CliRunner().invoke(cli(), ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("--repo", "--broker", "--share-group", "--no-share", "--prefix", "model.onnx"):
        assert text in result.output
    assert "--workers" in result.output


def test_several_workers_without_a_shared_subscription_is_a_usage_error(repo):
    result = CliRunner().invoke(cli(), ["--repo", str(repo), "--workers", "2", "--no-share"])
    assert result.exit_code == 2 and "shared subscription" in result.output


def test_a_missing_repository_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli(), ["--repo", str(tmp_path / "nope")])
    assert result.exit_code == 2


def test_a_bad_broker_url_or_config_is_one_line_and_exit_status_1(repo):
    result = CliRunner().invoke(cli(), ["--repo", str(repo), "--broker", "http://x"])
    assert result.exit_code == 1 and "scheme must be mqtt://" in result.output
    (repo / "linear" / "config.json").write_text('{"max_batch_size": "many"}')
    result = CliRunner().invoke(cli(), ["--repo", str(repo), "--broker", "mqtt://127.0.0.1:1"])
    assert result.exit_code == 1 and "max_batch_size" in result.output
    assert isinstance(result.exception, SystemExit)
