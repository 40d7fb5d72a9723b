"""Text over MQTT across restarts: the broker mid-stream, the device's own process between turns.

The tiny models, the served hub's repository and the gated engine are in
``tests/_text_mqtt.py``. Greedy answers are compared with ``greedy_generate``
on the same models, never with stored strings; waits are on conditions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloud_hub import Hub
from edge_agent import CloudTextSettings, EdgeAgent, GenerationRecord, Source, TextChunk
from shared import MqttSettings
from tandem.demo.language import greedy_generate, load_model

from ._brokers import MosquittoProcess
from ._text_mqtt import (
    PROMPT,
    SIZED,
    WAIT_S,
    GatedEngine,
    P,
    Peer,
    Served,
    hub_repository,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]


def _served_turn(agent: EdgeAgent, max_tokens: int) -> tuple[list[TextChunk], GenerationRecord]:
    stream = agent.generate(PROMPT, max_tokens=max_tokens, preset="prefer_cloud")
    chunks = list(stream)
    assert stream.result is not None
    return chunks, stream.result


@pytest.mark.slow
def test_the_broker_restarted_mid_stream_loses_and_repeats_no_text(
    models: Any, own_mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """The broker stops while the hub streams a prefer_cloud turn and starts again on the
    same port: the turn ends whole (by the hub after reconnecting, or by the device, marked
    degraded), and the next turn is the hub's again."""
    settings = MqttSettings.from_url(own_mosquitto.url, reconnect_max_delay_s=1.0)
    repo = hub_repository(tmp_path, models.hub_model)
    hub = Hub(repo, mqtt=settings, coalescing=SIZED, mqtt_client="paho").start()
    gated = GatedEngine(models.hub_model)
    gated.gated_max_tokens = 30
    hub.language.add_engine("gated", gated)
    # Patient: the lost connection (or the hub after it), not a silence timeout, ends the leg.
    patient = CloudTextSettings(stall_s=WAIT_S, first_chunk_s=WAIT_S)
    agent = EdgeAgent(
        None, device_id="phone-restart", broker=own_mosquitto.url,
        language_model=models.device_model, cloud_language_model="gated", cloud_text=patient,
    )  # fmt: skip
    try:
        with agent:
            stream = agent.generate(PROMPT, max_tokens=30, preset="prefer_cloud")
            chunks = [next(stream)]
            assert gated.held.wait(WAIT_S)
            own_mosquitto.stop()
            own_mosquitto.start()  # same port: both clients reconnect by themselves
            gated.gate.set()  # the hub's engine goes on; its later chunks meet the new broker
            chunks += list(stream)
            record = stream.result
            assert agent.text_link is not None
            wait_for(lambda: agent.text_link is not None and agent.text_link.connected, "device")
            wait_for(lambda: not hub.missing(), "the hub subscribed again")
            after, after_record = _served_turn(agent, 20)
    finally:
        gated.gate.set()
        hub.stop(timeout_s=1.0)
    assert record is not None and chunks[0].source is Source.CLOUD
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert record.text == "".join(c.text for c in chunks)
    hub_model, device_model = load_model(models.hub_model), load_model(models.device_model)
    hub_prompt = [int(t) for t in hub_model[1].encode(PROMPT)]
    hub_text = greedy_generate(hub_model, hub_prompt, 30).text
    cloud = "".join(c.text for c in chunks if c.source is Source.CLOUD)
    local = "".join(c.text for c in chunks if c.source is Source.EDGE)
    sources = [c.source for c in chunks]  # the hub's text, then (maybe) the device's
    assert sources == sorted(sources, key=lambda s: s is not Source.CLOUD)
    assert hub_text.startswith(cloud)  # what the hub sent: its greedy text, none twice
    if record.degraded:  # finished by the device, from the prompt and what the user saw
        assert local and any("finished on the device" in f for f in record.fallbacks)
        ids = [int(t) for t in device_model[1].encode(PROMPT)]
        ids += [int(t) for t in device_model[1].encode(cloud)]
        assert local == greedy_generate(device_model, ids, 30 - record.cloud_tokens).text
        assert record.prompt_tokens == len(ids)  # it read the hub's text, not only the prompt
    else:  # finished by the hub after the reconnect
        assert not local and record.text == hub_text
    # The next turn is the hub's again, whole and not degraded.
    assert not after_record.degraded, after_record.fallbacks
    assert {c.source for c in after} == {Source.CLOUD}
    assert after_record.text == greedy_generate(hub_model, hub_prompt, 20).text


def _device_turn(state: Path, served: Served, message: str) -> dict[str, Any]:
    """One chat turn in a device process of its own, which then exits."""
    env = {**os.environ, "TANDEM_TEST_MESSAGE": message, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests._chat_device", str(state), served.url,
         str(served.device_model), "phone-reborn"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    turn: dict[str, Any] = json.loads(state.read_text())
    return turn


@pytest.mark.slow
def test_the_device_process_restarted_between_turns_keeps_the_conversation(
    served: Served, reference: Any, peer: Callable[[str], Peer], tmp_path: Path
) -> None:
    """Turn 1 in one device process, turn 2 in a new one with the same device id and the
    conversation the app kept: turn 2 is the hub's greedy answer to the whole history, and
    the hub's kept conversation served it (it prefilled only the new tokens)."""
    spy = peer("spy-reborn")
    spy.subscribe(f"{P}/dev/phone-reborn/generate/#")
    engine = served.hub.language.get("tiny").engine
    hits = engine.stats().get("conversation_hits", 0)
    state = tmp_path / "conversation.json"
    first = _device_turn(state, served, "Hi")
    second = _device_turn(state, served, "And?")
    sent = [spy.take(), spy.take()]
    requests = [message for _, message in sent]
    kept = second["conversation"]
    # The kept hub id sent turn 2 to the replica holding the conversation (sticky).
    assert sent[1][0] == f"{P}/dev/phone-reborn/generate/tiny/{served.hub.hub_id}"
    assert kept["hub"] == served.hub.hub_id
    assert [(r.conversation, r.turn) for r in requests] == [(kept["id"], 0), (kept["id"], 1)]
    for turn in (first, second):
        assert not turn["degraded"], turn["fallbacks"]
        assert [c[0] for c in turn["chunks"]] == list(range(len(turn["chunks"])))
        assert {c[1] for c in turn["chunks"]} == {Source.CLOUD.value}
        assert turn["text"] == "".join(c[2] for c in turn["chunks"])
    # Nothing of turn 1 is lost: turn 2's prompt is all of it, and the answer is the hub's.
    assert requests[1].prompt.startswith(requests[0].prompt + first["text"])
    assert second["text"] == greedy_generate(reference, requests[1].prompt, 8).text
    contents = [m["content"] for m in kept["messages"]]
    assert contents == ["Hi", first["text"], "And?", second["text"]]
    assert first["reused"] == 0 and second["reused"] > 0
    assert engine.stats().get("conversation_hits", 0) >= hits + 1
