"""Text generation over MQTT: streaming, ordering, cancels and the trust rules.

The served hub, the device models and the peers are in ``tests/_text_mqtt.py``,
which says how they are built and compared.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud_hub import Hub
from edge_agent import (
    AsyncEdgeAgent,
    Conversation,
    EdgeAgent,
    FinishReason,
    Source,
)
from shared import (
    ErrorCode,
    GenerateChunk,
    GenerateFinal,
    GenerateRequest,
    MqttSettings,
    Topics,
    decode_text_message,
    encode_text_message,
)
from tandem.demo.language import greedy_generate

from ._brokers import MosquittoProcess
from ._text_mqtt import (
    PROMPT,
    WAIT_S,
    P,
    Peer,
    Served,
    bad_frame,
    front_stats,
    hub_repository,
    raw_frame,
    wait_for,
)


def test_a_cloud_only_turn_is_the_hub_engine_s_greedy_text_in_coalesced_chunks(
    served: Served, reference: Any, peer: Callable[[str], Peer]
) -> None:
    spy = peer("spy-1")
    spy.subscribe(f"{P}/dev/phone-1/text")
    with served.agent("phone-1") as agent:
        assert agent.text_offload_available
        stream = agent.generate(PROMPT, max_tokens=40, preset="cloud_only")
        chunks = list(stream)
    record = stream.result
    assert record is not None
    expected = greedy_generate(reference, PROMPT, 40)
    assert "".join(c.text for c in chunks) == record.text == expected.text
    assert {c.source for c in chunks} == {Source.CLOUD}
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert record.output_ids[: len(expected.tokens)] == tuple(expected.tokens)
    assert record.cloud_tokens == len(record.output_ids) and record.edge_tokens == 0
    assert record.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert not record.degraded and record.error is None and record.fallbacks == ()
    # On the wire: seqs 0..n-1, then the final with seq n; fewer chunks than tokens.
    wire: list[Any] = []
    while not wire or not isinstance(wire[-1], GenerateFinal):
        wire.append(spy.take()[1])
    seqs = [m.seq for m in wire]
    assert seqs == list(range(len(wire)))
    final = wire[-1]
    assert final.ok and final.completion_tokens == record.cloud_tokens
    assert final.prompt_tokens == len(reference[1].encode(PROMPT))
    assert record.prompt_tokens == final.prompt_tokens and record.prompt_tokens_reused == 0
    assert 1 < len(wire) - 1 < final.completion_tokens  # coalesced: not a packet per token
    assert sum(m.tokens for m in wire[:-1]) == final.completion_tokens


def test_duplicated_chunks_never_repeat_text(
    served: Served, reference: Any, peer: Callable[[str], Peer]
) -> None:
    """A real extra client republishes every chunk the hub sends: each arrives twice or more."""
    echo = peer("echo-1")
    echoed: list[bytes] = []

    def republish(topic: str, payload: bytes) -> None:
        if isinstance(decode_text_message(payload), GenerateChunk) and payload not in echoed:
            echoed.append(payload)
            echo.client.publish(topic, payload, qos=1)  # from the paho thread: not awaited

    echo.on_message = republish
    echo.subscribe(f"{P}/dev/phone-2/text")
    with served.agent("phone-2") as agent:
        stream = agent.generate(PROMPT, max_tokens=40, preset="cloud_only")
        text = "".join(c.text for c in stream)
    assert text == greedy_generate(reference, PROMPT, 40).text
    assert echoed  # the duplicates were sent


def test_reordered_and_duplicated_chunks_arrive_in_order_once(
    served: Served, peer: Callable[[str], Peer]
) -> None:
    """A scripted hub (a real client, on a prefix no real hub serves) answers out of order."""
    topics = Topics("scripted/v1")
    fake_hub = peer("fake-hub")
    fake_hub.subscribe(topics.device_generate("phone-3", "tiny"))
    parts = ["Al", "pha ", "bé", "ta ", "ü"]

    def answer(topic: str, payload: bytes) -> None:
        request = decode_text_message(payload)
        if not isinstance(request, GenerateRequest):
            return
        frames = [
            GenerateChunk(request_id=request.request_id, seq=i, text=t, token_ids=(i,))
            for i, t in enumerate(parts)
        ]
        final = GenerateFinal(request_id=request.request_id, seq=len(parts), finish="stop")
        order = [frames[2], frames[0], final, frames[0], frames[4], frames[1], frames[2],
                 frames[3], frames[1]]  # fmt: skip
        for message in order:
            fake_hub.client.publish(topics.text("phone-3"), encode_text_message(message), qos=1)

    fake_hub.on_message = answer
    agent = EdgeAgent(
        None, device_id="phone-3", broker=served.url, language_model=served.device_model,
        cloud_language_model="tiny", topics=topics,
    )  # fmt: skip
    with agent:
        stream = agent.generate(PROMPT, max_tokens=10, preset="cloud_only")
        chunks = list(stream)
    assert [c.text for c in chunks] == parts
    assert stream.result is not None and stream.result.finish_reason is FinishReason.STOP
    assert stream.result.output_ids == (0, 1, 2, 3, 4)


def test_closing_the_stream_cancels_the_turn_and_frees_the_hub_slot(served: Served) -> None:
    gated = served.gated
    gated.gate.clear()
    gated.held.clear()
    gated.gated_max_tokens = 50
    before = gated.stats()
    with served.agent("phone-4", cloud="gated") as agent:
        stream = agent.generate(PROMPT, max_tokens=50, preset="cloud_only")
        first = next(stream)  # the first chunk went out at once; the engine now waits
        assert first.source is Source.CLOUD
        assert gated.held.wait(WAIT_S)
        cancels = front_stats(served).get("cancels", 0)
        stream.close()
        wait_for(lambda: front_stats(served).get("cancels", 0) == cancels + 1, "the cancel")
        gated.gate.set()
        wait_for(lambda: gated.stats()["active"] == 0, "the slot freed")
    after = gated.stats()
    assert after["cancelled"] == before.get("cancelled", 0) + 1
    assert after.get("completed", 0) == before.get("completed", 0)  # it did not run to its end
    assert stream.result is not None and stream.result.finish_reason is FinishReason.CANCELLED


def test_bad_requests_get_typed_error_finals_and_unanswerable_frames_are_dropped(
    served: Served, peer: Callable[[str], Peer]
) -> None:
    rogue = peer("rogue")
    rogue.subscribe(f"{P}/dev/rogue/text")
    topic = f"{P}/dev/rogue/generate/tiny"
    head = {"kind": "generate", "model": "tiny", "max_tokens": 4}
    cases: list[tuple[str, bytes, ErrorCode]] = [
        (
            f"{P}/dev/rogue/generate/nope",
            bad_frame("rogue", id="r1", model="nope"),
            ErrorCode.UNKNOWN_MODEL,
        ),
        (topic, bad_frame("rogue", id="r2", max_tokens=500), ErrorCode.INVALID_INPUT),  # > 60
        (topic, bad_frame("rogue", id="r3", model="other"), ErrorCode.BAD_REQUEST),
        (topic, bad_frame("rogue", id="r4", device_id="phone-9"), ErrorCode.BAD_REQUEST),
        (topic, raw_frame({**head, "id": "r5", "text_bytes": 2}, b"\xc3("), ErrorCode.BAD_REQUEST),
        (topic, raw_frame({**head, "id": "r6", "text_bytes": 2**21}), ErrorCode.TOO_LARGE),
        (
            topic,
            raw_frame({**head, "id": "r7", "token_count": 1}, struct.pack("<i", 5000)),
            ErrorCode.INVALID_INPUT,
        ),
        (
            topic,
            raw_frame(
                {**head, "id": "r8", "text_bytes": 2, "sampling": {"temperature": -1}}, b"hi"
            ),
            ErrorCode.BAD_REQUEST,
        ),
    ]
    for where, frame, _ in cases:
        rogue.publish(where, frame)
    answers = {}
    while len(answers) < len(cases):
        where, final = rogue.take()
        assert where == f"{P}/dev/rogue/text" and isinstance(final, GenerateFinal)
        answers[final.request_id] = final
    for i, (_, _, code) in enumerate(cases, start=1):
        final = answers[f"r{i}"]
        assert (final.error, final.finish, final.seq) == (code, "error", 0), final
    # Junk without an id to answer: dropped and counted; nothing goes back.
    dropped = front_stats(served).get("dropped", 0)
    rogue.publish(topic, b"\x00junk")
    rogue.publish(topic, raw_frame({"kind": "generate", "model": "tiny", "text_bytes": "x"}))
    wait_for(lambda: front_stats(served).get("dropped", 0) == dropped + 2, "the drops")
    rogue.publish(topic, bad_frame("rogue", id="r9", model="nope"))  # positive control, in order
    _, final = rogue.take()
    assert final.request_id == "r9"  # nothing came for the junk before it


def test_a_retained_request_is_never_run(
    models: Any, mosquitto: MosquittoProcess, tmp_path: Path, peer: Callable[[str], Peer]
) -> None:
    """The hub starts after a retained turn exists: the broker hands it over on subscribing."""
    topics = Topics("retained/v1")
    replayer = peer("replayer")
    replayer.subscribe(topics.text("replayer"))
    topic = topics.device_generate("replayer", "tiny")
    replayer.publish(topic, bad_frame("replayer", id="old"), retain=True)
    settings = MqttSettings.from_url(mosquitto.url)
    hub = Hub(hub_repository(tmp_path, models.hub_model), mqtt=settings, topics=topics,
              mqtt_client="paho")  # fmt: skip
    try:
        hub.start()
        assert hub.text_front is not None
        front = hub.text_front
        wait_for(lambda: front.stats().get("dropped", 0) == 1, "the retained turn dropped")
        replayer.publish(topic, bad_frame("replayer", id="new", model="nope"))
        _, final = replayer.take()
        assert final.request_id == "new"  # the retained one got no answer before it
        assert hub.language.get("tiny").engine.stats().get("submitted", 0) == 0
    finally:
        replayer.publish(topic, b"", retain=True)  # clear it
        hub.stop()


def test_another_device_cannot_get_the_replies(served: Served, peer: Callable[[str], Peer]) -> None:
    victim = peer("victim-spy")
    victim.subscribe(f"{P}/dev/victim/text")
    attacker = peer("attacker")
    attacker.subscribe(f"{P}/dev/attacker/text")
    # The header names the victim, and asks for replies on the victim's topic: neither counts.
    frame = bad_frame("attacker", id="steal", extra={"reply_to": f"{P}/dev/victim/text"})
    attacker.publish(f"{P}/dev/attacker/generate/tiny", frame)
    while True:  # answered (chunks, then the final) on the sender's own topic
        _, final = attacker.take()
        if isinstance(final, GenerateFinal):
            break
    assert final.request_id == "steal" and final.ok
    frame = bad_frame("attacker", id="steal2", device_id="victim")
    attacker.publish(f"{P}/dev/attacker/generate/tiny", frame)
    while True:
        _, message = attacker.take()
        if isinstance(message, GenerateFinal) and message.request_id == "steal2":
            break
    assert message.error is ErrorCode.BAD_REQUEST
    assert victim.received.empty()


def test_a_conversation_sends_its_id_and_turn_and_keeps_the_hub_s_replies(
    served: Served, reference: Any, peer: Callable[[str], Peer]
) -> None:
    spy = peer("spy-5")
    spy.subscribe(f"{P}/dev/phone-5/generate/#")
    conversation = Conversation()
    with served.agent("phone-5") as agent:
        first = agent.chat([{"role": "user", "content": "Hi"}], conversation=conversation,
                           max_tokens=8, preset="prefer_cloud").final()  # fmt: skip
        second = agent.chat([{"role": "user", "content": "And?"}], conversation=conversation,
                            max_tokens=8, preset="prefer_cloud").final()  # fmt: skip
    sent = [spy.take(), spy.take()]
    requests = [message for _, message in sent]
    # The second turn went to the replica that answered the first (tests/test_text_sticky.py).
    hub = served.hub.hub_id
    assert [topic for topic, _ in sent] == [
        f"{P}/dev/phone-5/generate/tiny",
        f"{P}/dev/phone-5/generate/tiny/{hub}",
    ]
    assert first.hub == second.hub == hub and second.sticky and second.rerouted is None
    assert [(r.conversation, r.turn) for r in requests] == [
        (conversation.id, 0),
        (conversation.id, 1),
    ]
    assert requests[1].prompt.startswith(requests[0].prompt + first.text)
    assert second.text == greedy_generate(reference, requests[1].prompt, 8).text
    assert first.cloud_tokens and second.cloud_tokens and not second.degraded
    assert [m["content"] for m in conversation.messages] == ["Hi", first.text, "And?", second.text]
    # The hub kept the conversation: the second turn prefilled only what the first had not.
    assert first.prompt_tokens_reused == 0
    assert second.prompt_tokens_reused > 0
    assert served.hub.language.get("tiny").engine.stats()["conversation_hits"] >= 1


def test_the_async_twin_streams_the_same_text(served: Served, reference: Any) -> None:
    async def main() -> str:
        agent = AsyncEdgeAgent(
            None, device_id="phone-6", broker=served.url, language_model=served.device_model,
            cloud_language_model="tiny",
        )  # fmt: skip
        async with agent:
            stream = agent.generate(PROMPT, max_tokens=20, preset="cloud_only")
            return "".join([c.text async for c in stream])

    assert asyncio.run(main()) == greedy_generate(reference, PROMPT, 20).text


# -- faults: the hub goes away mid-stream ------------------------------------------------------
