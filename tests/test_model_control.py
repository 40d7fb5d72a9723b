"""The supervisor's side of explicit model control (``ModelControl``), on real files in a
folder as the ingress writes them: requests taken once, unloads left out of the plan, pins
kept, restored when a load fails, and every request answered once, with why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cloud_hub.plane._model_control import ControlAnswer, ControlClient, ModelControl
from cloud_hub.plane._spec import ExecutorSpec


def _ask(folder: Path, model: str, rid: str, action: str, version: str | None = None) -> None:
    document = {"id": rid, "action": action, "version": version}
    (folder / f"{model}.request.json").write_text(json.dumps(document))


def _answer(folder: Path, model: str) -> ControlAnswer | None:
    path = folder / f"{model}.answer.json"
    return ControlAnswer.from_json(json.loads(path.read_text())) if path.exists() else None


def _spec(model: str, version: str) -> ExecutorSpec:
    return ExecutorSpec(model=model, version=version, instance=0, device=None, address="a")


def _never(model: str, version: str | None) -> str | None:
    return None


def test_a_request_is_taken_once_and_an_unload_leaves_the_model_out(tmp_path: Path) -> None:
    control = ModelControl(tmp_path)
    _ask(tmp_path, "linear", "r1", "unload")
    assert control.poll() is True
    assert control.poll() is False  # the same request again: nothing new
    plan = (_spec("linear", "2"), _spec("other", "1"))
    assert control.restrict(plan) == (_spec("other", "1"),)
    control.settle({"linear": "2"}, _never, _never)  # still served: not done yet
    assert _answer(tmp_path, "linear") is None
    control.settle({"other": "1"}, _never, _never)
    answer = _answer(tmp_path, "linear")
    assert answer is not None and answer.ok and answer.id == "r1" and answer.action == "unload"
    _ask(tmp_path, "linear", "r2", "load")
    assert control.poll() is True
    assert control.restrict(plan) == plan  # loaded again: the repository's choice
    control.settle({"linear": "2", "other": "1"}, _never, _never)
    answer = _answer(tmp_path, "linear")
    assert answer is not None and (answer.id, answer.ok, answer.version) == ("r2", True, "2")


def test_a_load_pins_its_version_until_a_load_without_one(tmp_path: Path) -> None:
    control = ModelControl(tmp_path)
    _ask(tmp_path, "linear", "r1", "load", "1")
    control.poll()
    assert control.pinned == {"linear": "1"} and control.wanted() == [("linear", "1")]
    control.settle({"linear": "2"}, _never, _never)  # version 2 still serves: waiting
    assert _answer(tmp_path, "linear") is None
    control.settle({"linear": "1"}, _never, _never)
    assert _answer(tmp_path, "linear") == ControlAnswer("r1", "load", True, "READY", "1", "")
    assert control.pinned == {"linear": "1"} and control.wanted() == []
    _ask(tmp_path, "linear", "r2", "load")
    control.poll()
    assert control.pinned == {}


def test_a_failed_load_says_why_and_keeps_what_served_pinned(tmp_path: Path) -> None:
    control = ModelControl(tmp_path)
    _ask(tmp_path, "linear", "r1", "load", "1")
    control.poll()
    control.settle({"linear": "1"}, _never, _never)
    _ask(tmp_path, "linear", "r2", "load", "3")
    control.poll()
    assert control.loading() == {"linear"}

    def broken(model: str, version: str | None) -> str | None:
        return "version 3 did not load: not an onnx model" if version == "3" else None

    control.settle({"linear": "1"}, _never, broken)
    answer = _answer(tmp_path, "linear")
    assert answer is not None and not answer.ok and answer.state == "READY"
    assert "did not load" in answer.reason and "version 1 keeps serving" in answer.reason
    assert control.pinned == {"linear": "1"}  # the pin before the failed load, not dropped
    _ask(tmp_path, "linear", "r3", "load", "9")
    control.poll()
    control.settle({"linear": "1"}, lambda m, v: f"version {v} is not in the repository", _never)
    answer = _answer(tmp_path, "linear")
    assert answer is not None and answer.id == "r3" and "9 is not in" in answer.reason
    assert control.pinned == {"linear": "1"}


def test_a_failed_first_load_unpins(tmp_path: Path) -> None:
    control = ModelControl(tmp_path)
    _ask(tmp_path, "linear", "r1", "load", "3")
    control.poll()
    control.settle({"linear": "2"}, _never, lambda m, v: "did not load")
    assert control.pinned == {}  # the repository's choice again


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"id": 1, "action": "load"},
        {"id": "r", "action": "delete"},
        {"id": "r", "action": "load", "version": "../2"},
        {"id": "r", "action": "load", "version": 2},
    ],
)
def test_what_is_not_a_request_is_left_alone(tmp_path: Path, document: object) -> None:
    (tmp_path / "linear.request.json").write_text(json.dumps(document))
    control = ModelControl(tmp_path)
    assert control.poll() is False and control.pinned == {} and control.unloaded == set()


def test_the_client_waits_for_the_answer_to_its_own_request(tmp_path: Path) -> None:
    control = ModelControl(tmp_path)
    client = ControlClient(tmp_path, poll_s=0.01)

    async def both() -> ControlAnswer | None:
        asking = asyncio.create_task(client.request("linear", "unload", None, timeout_s=30))
        while not control.poll():
            await asyncio.sleep(0.01)
        control.settle({}, _never, _never)
        return await asking

    answer = asyncio.run(both())
    assert answer is not None and answer.ok and client.unloaded() == ["linear"]
    assert asyncio.run(client.request("linear", "load", None, timeout_s=0.05)) is None  # unheard
    with pytest.raises(ValueError):
        asyncio.run(client.request("../x", "load", None, timeout_s=1))
