"""Sticky text turns: a conversation's next turn reaches the hub replica holding its KV cache.

Two hub replicas (embedded ``Hub``s with their own hub ids, the tiny language
model each) share the generate subscription on a real Mosquitto, which hands
turns out in turn, so a conversation's second turn sent on the shared topic
would land on the other replica. The device sends it to the replica that
answered the first (``…/generate/{model}/{hub}``), and falls back to any
replica when that one is gone (PUBACK 0x10) or silent (``sticky_s``): the
turn is re-prefilled there, under a new request id, nothing lost and nothing
of the abandoned id shown. Each test has a topic prefix of its own, so no
other module's hubs share its subscriptions. Waits are on conditions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cloud_hub import Hub
from edge_agent import CloudTextSettings, EdgeAgent
from edge_agent.language import Conversation, GenerationRecord, render_turn
from shared import (
    ErrorCode,
    GenerateCancel,
    GenerateChunk,
    GenerateRequest,
    MqttSettings,
    PahoSession,
    Topics,
    decode_text_message,
    encode_text_message,
)
from tandem.demo.language import greedy_generate, load_model

from ._brokers import MosquittoProcess
from ._text_mqtt import SIZED, WAIT_S, Peer, hub_repository, wait_for

# Enough conversations that a device ignoring the hub id fails (the broker alternates the
# shared subscription's two members, so each second turn would reach the other replica).
CONVERSATIONS = 6
PATIENT = CloudTextSettings(sticky_s=30.0)  # a live replica is never given up on here


@dataclass
class Replicas:
    """Two hub replicas on one prefix, and what a device of that prefix needs."""

    hubs: dict[str, Hub]
    topics: Topics
    url: str
    device_model: Any

    def agent(self, device: str, settings: CloudTextSettings = PATIENT) -> EdgeAgent:
        return EdgeAgent(
            None, device_id=device, broker=self.url, topics=self.topics,
            language_model=self.device_model, cloud_language_model="tiny", cloud_text=settings,
        )  # fmt: skip


@pytest.fixture
def replicas(
    models: Any, mosquitto: MosquittoProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    repo = hub_repository(tmp_path_factory.mktemp("sticky-hub"), models.hub_model)
    topics = Topics(f"sticky-{uuid.uuid4().hex[:8]}/v1")
    settings = MqttSettings.from_url(mosquitto.url)
    hubs: dict[str, Hub] = {}
    try:
        for hub_id in ("hub-a", "hub-b"):
            hubs[hub_id] = Hub(
                repo, mqtt=settings, topics=topics, coalescing=SIZED, mqtt_client="paho",
                hub_id=hub_id,
            ).start()  # fmt: skip
        yield Replicas(hubs, topics, mosquitto.url, models.device_model)
    finally:
        for hub in hubs.values():
            hub.stop()


def chat(agent: EdgeAgent, conversation: Conversation, content: str) -> GenerationRecord:
    stream = agent.chat([{"role": "user", "content": content}], conversation=conversation,
                        max_tokens=12, preset="cloud_only")  # fmt: skip
    record = stream.final()
    assert record.finish_reason in ("stop", "length") and record.error is None, record
    assert record.cloud_tokens and not record.degraded, record
    return record


def nobody_reads(replicas: Replicas, hub: str | None) -> bool:
    """Whether the broker answers a publish on ``hub``'s own topic with reason 0x10."""
    probe = PahoSession(MqttSettings.from_url(replicas.url, protocol="5"), "sticky-probe",
                        protocol="5")  # fmt: skip
    try:
        assert probe.start(wait_s=WAIT_S)
        handle = probe.publish(replicas.topics.device_generate("probe", "tiny", hub), b"x")
        return handle.wait(WAIT_S) and handle.no_subscribers
    finally:
        probe.stop(timeout_s=1)


def sticky_turns(hub: Hub) -> int:
    assert hub.text_front is not None
    return hub.text_front.stats().get("sticky", 0)


def test_a_conversations_next_turn_reaches_the_replica_that_holds_its_kv_cache(
    replicas: Replicas,
) -> None:
    firsts, seconds = [], []
    with replicas.agent("phone-s1") as agent:
        for i in range(CONVERSATIONS):
            conversation = Conversation()
            firsts.append(chat(agent, conversation, f"Hi {i}"))
            assert conversation.hub == firsts[-1].hub
            seconds.append(chat(agent, conversation, "And?"))
    # Every second turn went to the replica of its first, which reused its cache...
    for first, second in zip(firsts, seconds, strict=True):
        assert second.hub == first.hub and second.sticky and second.rerouted is None
        assert second.prompt_tokens_reused > 0, second
    # ...though the shared subscription spread the first turns over both replicas.
    assert {r.hub for r in firsts} == set(replicas.hubs)
    assert not any(r.sticky or r.rerouted for r in firsts)
    assert sum(sticky_turns(hub) for hub in replicas.hubs.values()) == CONVERSATIONS


def test_a_turn_for_a_stopped_replica_is_answered_by_the_other_re_prefilled(
    replicas: Replicas, models: Any
) -> None:
    conversation = Conversation()
    with replicas.agent("phone-s2") as agent:
        first = chat(agent, conversation, "Hi")
        assert first.hub is not None
        replicas.hubs[first.hub].stop()  # between the turns: its KV cache is gone with it
        wait_for(lambda: nobody_reads(replicas, first.hub), "the broker dropped its subscription")
        assert agent.language is not None
        prompt = agent.language.decode(conversation.history) + render_turn(
            [{"role": "user", "content": "And?"}], first=False
        )  # what the device sends: the whole history as text
        second = chat(agent, conversation, "And?")
    (other,) = set(replicas.hubs) - {first.hub}
    assert second.hub == other and second.sticky
    assert second.rerouted is not None and "gone" in second.rerouted  # the PUBACK said so
    assert second.prompt_tokens_reused == 0  # re-prefilled there
    # Nothing lost: the whole history, then the other replica's greedy answer to it.
    assert [m["content"] for m in conversation.messages] == ["Hi", first.text, "And?", second.text]
    assert conversation.hub == other
    assert second.text == greedy_generate(load_model(models.hub_model), prompt, 12).text
    assert sticky_turns(replicas.hubs[other]) == 0  # it came on the shared topic


def test_a_silent_replica_s_turn_is_cancelled_and_sent_again_and_its_late_text_is_ignored(
    replicas: Replicas, peer: Callable[[str], Peer], models: Any
) -> None:
    """A replica that subscribes but never answers (stuck): after ``sticky_s`` the device
    cancels that request id and sends the turn to any replica under a new id; text the
    stuck replica sends for the old id afterwards never reaches the stream."""
    p = replicas.topics.prefix
    stuck = peer("stuck-replica")

    def answer_late(topic: str, payload: bytes) -> None:
        message = decode_text_message(payload)
        if isinstance(message, GenerateCancel):  # now its turn was given up: answer it
            for seq in range(10):
                chunk = GenerateChunk(request_id=message.request_id, seq=seq, text="STALE",
                                      token_ids=(5,), hub="stuck")  # fmt: skip
                stuck.client.publish(replicas.topics.text("phone-s3"), encode_text_message(chunk),
                                     qos=1)  # fmt: skip

    stuck.on_message = answer_late
    stuck.subscribe(replicas.topics.hub_generate_filter("stuck"))
    stuck.subscribe(f"{p}/dev/+/cancel")
    conversation = Conversation()
    conversation.hub = "stuck"  # as if its last turn had been answered there
    with replicas.agent("phone-s3", CloudTextSettings(sticky_s=0.5)) as agent:
        record = chat(agent, conversation, "Hi")
    topic, sent = stuck.take()
    assert topic == f"{p}/dev/phone-s3/generate/tiny/stuck" and isinstance(sent, GenerateRequest)
    topic, cancel = stuck.take()
    assert isinstance(cancel, GenerateCancel) and cancel.request_id == sent.request_id
    assert record.sticky and record.rerouted is not None and "sticky time" in record.rerouted
    assert record.hub in replicas.hubs and conversation.hub == record.hub
    assert "STALE" not in record.text
    assert record.text == greedy_generate(load_model(models.hub_model), sent.prompt, 12).text


def test_a_sticky_turn_in_another_devices_name_is_refused_as_a_shared_one_is(
    replicas: Replicas, peer: Callable[[str], Peer]
) -> None:
    """The replica's own topic has the shared topic's trust rules: the device is the one
    the topic names, and the answer goes to that device's text topic only."""
    attacker, victim = peer("attacker-s"), peer("victim-s")
    attacker.subscribe(replicas.topics.text("attacker"))
    victim.subscribe(replicas.topics.text("victim"))
    forged = GenerateRequest(request_id="steal-sticky", model="tiny", max_tokens=4,
                             prompt="hi", device_id="victim")  # fmt: skip
    attacker.publish(replicas.topics.device_generate("attacker", "tiny", "hub-a"),
                     encode_text_message(forged))  # fmt: skip
    topic, final = attacker.take()
    assert topic == replicas.topics.text("attacker") and final.request_id == "steal-sticky"
    assert final.error is ErrorCode.BAD_REQUEST and final.hub == "hub-a"
    assert sticky_turns(replicas.hubs["hub-a"]) == 1 and sticky_turns(replicas.hubs["hub-b"]) == 0
    assert victim.received.empty()
