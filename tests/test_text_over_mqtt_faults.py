"""Text over MQTT when the hub or the link fails mid-turn: the device finishes the turn.

The served hub, the device models and the peers are in ``tests/_text_mqtt.py``,
which says how they are built and compared.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_hub import Coalescing, Hub
from cloud_hub.language import LanguageEngine, TurnUpdate
from edge_agent import (
    CloudTextSettings,
    EdgeAgent,
    FinishReason,
    LanguageRuntime,
    Source,
)
from edge_agent.language import DeviceRates
from shared import (
    GenerateFinal,
    MqttSettings,
    Topics,
)
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
    bad_frame,
    front_stats,
    hub_repository,
    wait_for,
)


def test_a_silent_hub_mid_stream_the_device_finishes_the_turn(served: Served) -> None:
    gated = served.gated
    gated.gate.clear()
    gated.held.clear()
    gated.gated_max_tokens = 30
    quick = CloudTextSettings(stall_s=0.5, first_chunk_s=WAIT_S)
    try:
        with served.agent("phone-7", cloud="gated", cloud_text=quick) as agent:
            stream = agent.generate(PROMPT, max_tokens=30, preset="prefer_cloud")
            chunks = list(stream)
    finally:
        gated.gate.set()
    record = stream.result
    assert record is not None and record.degraded
    cloud = "".join(c.text for c in chunks if c.source is Source.CLOUD)
    local = "".join(c.text for c in chunks if c.source is Source.EDGE)
    assert cloud and local and record.text == cloud + local
    assert [c.source for c in chunks] == sorted(
        (c.source for c in chunks), key=lambda s: s != Source.CLOUD
    )
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert record.cloud_tokens + record.edge_tokens <= 30 and record.edge_tokens > 0
    assert any("no word from the hub" in f for f in record.fallbacks)
    device = load_model(served.device_model)
    prompt_ids = [int(t) for t in device[1].encode(PROMPT)]
    assert local == _continuation_from(device, prompt_ids, cloud, 30 - record.cloud_tokens)
    # The device model read the prompt and the hub's text (what the user has), then went on.
    assert record.prompt_tokens == len(prompt_ids) + len(device[1].encode(cloud))


def test_a_cloud_only_turn_whose_hub_falls_silent_ends_with_an_error(served: Served) -> None:
    gated = served.gated
    gated.gate.clear()
    gated.held.clear()
    gated.gated_max_tokens = 31
    quick = CloudTextSettings(stall_s=0.5, first_chunk_s=WAIT_S)
    try:
        with served.agent("phone-8", cloud="gated", cloud_text=quick) as agent:
            stream = agent.generate(PROMPT, max_tokens=31, preset="cloud_only")
            chunks = list(stream)  # no exception mid-iteration
    finally:
        gated.gate.set()
    record = stream.result
    assert record is not None and record.finish_reason is FinishReason.ERROR
    assert record.error is not None and "no word from the hub" in record.error
    assert chunks and {c.source for c in chunks} == {Source.CLOUD} and record.edge_tokens == 0


def test_the_hub_stopped_mid_stream_the_device_finishes_the_turn(
    models: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """``Hub.stop`` answers the turn ``overloaded``: the device goes on at once, locally."""
    repo = hub_repository(tmp_path, models.hub_model)
    topics = Topics("stopping/v1")  # the module's hub serves tandem/v1
    hub = Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), coalescing=SIZED,
              mqtt_client="paho", topics=topics).start()  # fmt: skip
    gated = GatedEngine(models.hub_model)
    gated.gated_max_tokens = 30
    hub.language.add_engine("gated", gated)
    stopper = threading.Thread(target=hub.stop)
    agent = EdgeAgent(
        None, device_id="phone-10", broker=mosquitto.url, language_model=models.device_model,
        cloud_language_model="gated", topics=topics,
    )  # fmt: skip
    try:
        with agent:
            stream = agent.generate(PROMPT, max_tokens=30, preset="prefer_cloud")
            chunks = [next(stream)]
            assert gated.held.wait(WAIT_S)
            stopper.start()
            chunks += list(stream)
    finally:
        gated.gate.set()
        stopper.join(WAIT_S) if stopper.is_alive() else hub.stop()
    record = stream.result
    assert record is not None and record.degraded
    assert any("overloaded" in f for f in record.fallbacks)
    cloud = "".join(c.text for c in chunks if c.source is Source.CLOUD)
    local = "".join(c.text for c in chunks if c.source is Source.EDGE)
    assert cloud == chunks[0].text and local and record.text == cloud + local
    device = load_model(models.device_model)
    prompt_ids = [int(t) for t in device[1].encode(PROMPT)]
    assert local == _continuation_from(device, prompt_ids, cloud, 30 - record.cloud_tokens)
    # The device model read the prompt and the hub's text (what the user has), then went on.
    assert record.prompt_tokens == len(prompt_ids) + len(device[1].encode(cloud))


def _continuation_from(device: Any, prompt_ids: list[int], text: str, max_new: int) -> str:
    ids = prompt_ids + [int(t) for t in device[1].encode(text)]
    return greedy_generate(device, ids, max_new).text


def test_a_redelivered_turn_runs_once(served: Served, peer: Callable[[str], Peer]) -> None:
    twice = peer("twice")
    twice.subscribe(f"{P}/dev/twice/text")
    engine = served.hub.language.get("tiny").engine
    submitted = engine.stats().get("submitted", 0)
    duplicates = front_stats(served).get("duplicates", 0)
    frame = bad_frame("twice", id="same", max_tokens=3)
    twice.publish(f"{P}/dev/twice/generate/tiny", frame)
    twice.publish(f"{P}/dev/twice/generate/tiny", frame)
    wait_for(lambda: front_stats(served).get("duplicates", 0) == duplicates + 1, "the duplicate")
    finals = 0
    while finals == 0:
        finals += isinstance(twice.take()[1], GenerateFinal)
    assert engine.stats().get("submitted", 0) == submitted + 1


def test_the_broker_gone_mid_stream_the_device_finishes_the_turn_at_once(
    models: Any, own_mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """The connection drops: the turn goes on locally without waiting out its stall timeout."""
    settings = MqttSettings.from_url(own_mosquitto.url)
    repo = hub_repository(tmp_path, models.hub_model)
    hub = Hub(repo, mqtt=settings, coalescing=SIZED, mqtt_client="paho").start()
    gated = GatedEngine(models.hub_model)
    gated.gated_max_tokens = 30
    hub.language.add_engine("gated", gated)
    patient = CloudTextSettings(stall_s=WAIT_S * 10, first_chunk_s=WAIT_S * 10)
    agent = EdgeAgent(
        None, device_id="phone-11", broker=own_mosquitto.url, language_model=models.device_model,
        cloud_language_model="gated", cloud_text=patient,
    )  # fmt: skip
    try:
        with agent:
            stream = agent.generate(PROMPT, max_tokens=30, preset="prefer_cloud")
            chunks = [next(stream)]
            assert gated.held.wait(WAIT_S)
            own_mosquitto.stop()
            chunks += list(stream)  # a stall timeout of minutes: only the lost link ends it
    finally:
        gated.gate.set()
        hub.stop(timeout_s=1.0)
    record = stream.result
    assert record is not None and record.degraded
    assert any("connection was lost" in f for f in record.fallbacks), record.fallbacks
    assert chunks[0].source is Source.CLOUD and chunks[-1].source is Source.EDGE
    assert record.text == "".join(c.text for c in chunks)


class SecondUpdateGate(GatedEngine):
    """Holds its thread after a gated turn's second update instead of its first."""

    def _deliver(self, turn: Any, update: TurnUpdate) -> None:
        LanguageEngine._deliver(self, turn, update)
        gated = turn.max_tokens == self.gated_max_tokens and update.finish is None
        if gated and (len(update.tokens) >= 2 or self.held.is_set()):
            self.held.set()
            assert self.gate.wait(WAIT_S)


def test_pending_text_goes_out_on_time_while_the_engine_is_busy(
    models: Any, mosquitto: MosquittoProcess, tmp_path: Path, peer: Callable[[str], Peer]
) -> None:
    """The second token waits for the pace (1 s after the first chunk), then the timer sends
    it although no further update comes from the engine."""
    topics = Topics("paced/v1")
    paced = Coalescing(max_delay_s=1.0, max_tokens=10_000, max_bytes=10**6)
    settings = MqttSettings.from_url(mosquitto.url)
    hub = Hub(hub_repository(tmp_path, models.hub_model), mqtt=settings, topics=topics,
              coalescing=paced, mqtt_client="paho").start()  # fmt: skip
    engine = SecondUpdateGate(models.hub_model)
    engine.gated_max_tokens = 20
    hub.language.add_engine("gated", engine)
    device = peer("paced-device")
    device.subscribe(topics.text("paced-device"))
    try:
        device.publish(
            topics.device_generate("paced-device", "gated"),
            bad_frame("paced-device", id="p1", model="gated", max_tokens=20),
        )
        assert engine.held.wait(WAIT_S)
        first, second = device.take()[1], device.take()[1]
        assert engine.held.is_set() and not engine.gate.is_set()  # the engine sent nothing since
        assert (first.seq, second.seq) == (0, 1) and first.tokens + second.tokens >= 2
    finally:
        engine.gate.set()
        hub.stop()


def test_a_turn_past_its_budget_is_cut_at_the_hub_and_ends_deadline(
    served: Served, peer: Callable[[str], Peer]
) -> None:
    gated = served.gated
    gated.gate.clear()
    gated.held.clear()
    gated.gated_max_tokens = 45
    device = peer("budget")
    device.subscribe(f"{P}/dev/budget/text")
    cancels = gated.stats().get("cancel_requests", 0)
    try:
        frame = bad_frame("budget", id="b1", model="gated", max_tokens=45, timeout_ms=300.0)
        device.publish(f"{P}/dev/budget/generate/gated", frame)
        wait_for(lambda: gated.stats().get("cancel_requests", 0) == cancels + 1, "the cut")
    finally:
        gated.gate.set()
    while True:
        _, message = device.take()
        if isinstance(message, GenerateFinal):
            break
    assert message.finish == "deadline" and message.ok
    assert message.completion_tokens < 45


class SlowDevice(LanguageRuntime):
    """The real device model, reporting the rates of a device far slower than this machine
    (one token per second), so the heavy rule decides without timing anything."""

    @property
    def rates(self) -> DeviceRates:
        return DeviceRates(prefill_tokens_per_s=1.0, decode_tokens_per_s=1.0)


def test_a_heavy_prefer_edge_turn_goes_to_the_hub(served: Served, reference: Any) -> None:
    slow = SlowDevice(served.device_model)
    agent = EdgeAgent(
        None, device_id="phone-12", broker=served.url, language_model=slow,
        cloud_language_model="tiny",
    )  # fmt: skip
    with agent:
        light = agent.generate(PROMPT, max_tokens=20, preset="prefer_edge").final()
        # Predicted: the prompt's tokens and 20 more at 1 token/s, past a 10 s deadline.
        stream = agent.generate(PROMPT, max_tokens=20, preset="prefer_edge", deadline_ms=10_000)
        chunks = list(stream)
    record = stream.result
    assert light.reason == "prefer_edge" and light.cloud_tokens == 0  # no deadline: not heavy
    assert record is not None and record.reason == "heavy" and record.edge_tokens == 0
    assert {c.source for c in chunks} == {Source.CLOUD}
    assert record.text == greedy_generate(reference, PROMPT, 20).text
