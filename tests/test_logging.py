from __future__ import annotations

import io
import json
import logging
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud_hub import CallableExecutor, Hub, ModelConfig
from shared import (
    ErrorCode,
    Message,
    MqttSettings,
    Topics,
    configure_logging,
    create_client,
    decode_message,
    encode_message,
    new_request_id,
)
from shared._logging import JsonFormatter, TextFormatter

from ._brokers import MosquittoProcess
from ._models import write_linear_classifier

WAIT_S = 15.0


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def record(message: str, *args: Any, exc: bool = False, **extra: Any) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("the model fell over")
        except RuntimeError:
            exc_info = sys.exc_info()
    made = logging.LogRecord("tandem.test", logging.ERROR, __file__, 1, message, args, exc_info)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def test_json_lines_carry_the_fields_and_the_request_context() -> None:
    line = JsonFormatter().format(
        record("request %s failed", "r-1", request_id="r-1", device="cam-7", model="mnist")
    )
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["logger"] == "tandem.test"
    assert entry["message"] == "request r-1 failed"
    assert (entry["request_id"], entry["device"], entry["model"]) == ("r-1", "cam-7", "mnist")
    assert entry["timestamp"].endswith("Z") and "T" in entry["timestamp"]
    assert "model_version" not in entry  # context that was not given is left out


def test_a_traceback_stays_inside_one_json_line() -> None:
    line = JsonFormatter().format(record("boom", exc=True, request_id="r-2"))
    assert "\n" not in line
    entry = json.loads(line)
    assert "RuntimeError: the model fell over" in entry["exception"]
    assert entry["request_id"] == "r-2"


def test_values_json_cannot_carry_are_logged_as_text() -> None:
    entry = json.loads(JsonFormatter().format(record("odd", request_id=uuid.UUID(int=1))))
    assert entry["request_id"] == str(uuid.UUID(int=1))


def test_text_lines_append_the_context() -> None:
    line = TextFormatter().format(record("request failed", request_id="r-3", model="mnist"))
    assert line.endswith("tandem.test: request failed [request_id=r-3 model=mnist]")
    assert TextFormatter().format(record("plain")).endswith("tandem.test: plain")


@pytest.mark.usefixtures("restore_root_logger")
def test_configure_logging_replaces_its_own_handler_only() -> None:
    root = logging.getLogger()
    others = [h for h in root.handlers if not getattr(h, "_tandem_handler", False)]
    first, second = io.StringIO(), io.StringIO()
    configure_logging("debug", json=True, stream=first)
    installed = configure_logging("WARNING", json=True, stream=second)
    assert root.handlers == [*others, installed]  # pytest's own handlers are left alone
    assert root.level == logging.WARNING
    logging.getLogger("tandem.x").warning("hello", extra={"request_id": "r-4"})
    logging.getLogger("tandem.x").info("not shown")
    assert first.getvalue() == ""
    assert [(e["message"], e["request_id"]) for e in json_lines(second)] == [("hello", "r-4")]
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud")


# -- the hub logs the request id of a request that failed ------------------------------------


def broken(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if np.any(inputs["x"]):  # the warm-up's zeros pass; real data makes the model fail
        raise RuntimeError("the model fell over")
    return {"y": inputs["x"]}


BROKEN = ModelConfig.from_json(
    {
        "max_batch_size": 4,
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [2]}],
    }
)


@pytest.mark.usefixtures("restore_root_logger")
def test_the_hub_logs_a_failed_requests_id_as_json(
    mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    stream = io.StringIO()
    configure_logging("warning", json=True, stream=stream)
    topics = Topics(f"t-{uuid.uuid4().hex[:8]}/v1")
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    settings = MqttSettings.from_url(mosquitto.url)
    replies: queue.Queue[Message] = queue.Queue()
    subscribed = threading.Event()
    device = create_client(settings, "dev-log", protocol="5")
    device.on_connect = lambda c, *_: c.subscribe(topics.reply("dev-log"), qos=1)
    device.on_subscribe = lambda *_: subscribed.set()
    device.on_message = lambda _c, _u, msg: replies.put(decode_message(msg.payload))
    device.connect(settings.host, settings.port)
    device.loop_start()
    hub = Hub(tmp_path / "repo", mqtt=settings, topics=topics)
    try:
        hub.add_model("broken", CallableExecutor(broken), config=BROKEN)
        hub.start()
        assert subscribed.wait(WAIT_S)
        request = Message(
            kind="request",
            request_id=new_request_id(),
            model="broken",
            device_id="dev-log",
            reply_to=topics.reply("dev-log"),
            tensors={"x": np.ones((1, 2), np.float32)},
        )
        device.publish(topics.device_infer("dev-log", "broken"), encode_message(request), qos=1)
        reply = replies.get(timeout=WAIT_S)
    finally:
        hub.stop()
        device.disconnect()
        device.loop_stop()
    assert reply.request_id == request.request_id and reply.error is ErrorCode.INTERNAL
    failed = [e for e in json_lines(stream) if e.get("request_id") == request.request_id]
    assert failed, stream.getvalue()
    entry = failed[0]
    assert entry["level"] == "warning" and entry["logger"].startswith("cloud_hub")
    assert entry["device"] == "dev-log" and entry["model"] == "broken"
    assert "the model fell over" in entry["message"]


def test_the_hub_cli_rejects_an_unknown_log_format(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cloud_hub", "--repo", str(tmp_path), "--log-format", "yaml"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--log-format" in result.stderr


@pytest.mark.usefixtures("restore_root_logger")
def test_the_default_handler_writes_to_the_stderr_of_the_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream captured at configure time (a CLI run in-process) may be closed later."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("info")
    logging.getLogger("tandem.test").info("one")
    first.close()  # the first capture ends, as a test runner's or CliRunner's does
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("tandem.test").info("two")
    assert "two" in second.getvalue() and "one" not in second.getvalue()
