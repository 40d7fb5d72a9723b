"""Speculative decoding across the link: real Mosquitto, the tiny models, the embedded Hub.

The device drafts with its model, the hub verifies with its own; the text is
compared with the hub's own greedy decoding (``cloud_only``) and with
``greedy_generate`` on the same models, never with stored strings. A
``DraftControl`` of the test's (``Hook``) runs code between rounds: the hub
stopping, another device's turn evicting the session.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloud_hub import Hub
from cloud_hub.language import SessionLimits, VerifyModel, target_probs
from edge_agent import EdgeAgent, FinishReason, InvalidInputError, Sampling, Source
from edge_agent.language import DraftLength
from shared import (
    ErrorCode,
    MqttSettings,
    Topics,
    VerifyFinish,
    VerifyRequest,
    decode_draft_dists,
    decode_verify_message,
    encode_verify_message,
)
from tandem.demo.language import build_language_models, greedy_generate, load_model

from ._brokers import MosquittoProcess
from ._text_mqtt import SIZED, TINY, WAIT_S, P, Peer, Served, hub_repository, raw_frame, wait_for

PROMPTS = ['The "assert" statement', "Once upon a time", "def main():", "In 1999 the"]


class Hook:
    """A fixed draft length that calls ``after(round)`` once each verdict is applied."""

    def __init__(self, k: int, after: Callable[[int], None]) -> None:
        self.k = k
        self.rounds = 0
        self.after = after
        self.seen: list[tuple[int, int]] = []

    def observe(self, rtt_s: float, drafted: int, accepted: int, draft_s_per_token: float) -> None:
        self.rounds += 1
        self.seen.append((drafted, accepted))
        self.after(self.rounds)


def spec_stats(served: Served) -> dict[str, int]:
    assert served.hub.spec_front is not None
    return served.hub.spec_front.stats()


def spec_agent(served: Served, device: str, model: Path) -> EdgeAgent:
    return EdgeAgent(None, device_id=device, broker=served.url, language_model=model,
                     cloud_language_model="tiny")  # fmt: skip


def hub_greedy(served: Served, prompt: str, n: int) -> list[int]:
    hub = load_model(served.hub_model)
    return list(greedy_generate(hub, [int(t) for t in hub[1].encode(prompt)], n).tokens)


@pytest.mark.parametrize("draft", ["device", "hub"])
def test_greedy_speculative_text_is_the_hub_s_own_greedy_decoding(
    served: Served, draft: str
) -> None:
    """Drafted by the device model (drafts rejected) and by a copy of the hub model (every
    draft accepted): both give exactly the hub's cloud-only tokens, prompt after prompt."""
    model = served.device_model if draft == "device" else served.hub_model
    before = spec_stats(served)
    rounds = 0
    with spec_agent(served, f"spec-{draft}", model) as agent:
        for prompt in PROMPTS:
            cloud = agent.generate(prompt, max_tokens=24, preset="cloud_only").final()
            stream = agent.generate(prompt, max_tokens=24, preset="speculative", draft_length=4)
            chunks = list(stream)
            record = stream.result
            assert record is not None and not record.degraded, record
            assert record.output_ids == cloud.output_ids
            assert list(record.output_ids) == hub_greedy(served, prompt, 24)
            assert record.text == cloud.text == "".join(c.text for c in chunks)
            assert all(c.source is Source.CLOUD for c in chunks)
            spec = record.speculation
            assert spec is not None and spec.rounds == len(spec.rtt_ms) >= 1
            assert spec.accepted + spec.hub_tokens == len(record.output_ids)
            assert record.finish_reason is FinishReason.LENGTH
            rounds += spec.rounds
            if draft == "hub":
                assert spec.accepted == spec.drafted > 0
    after = spec_stats(served)
    forwards = after["verify_forwards"] - before.get("verify_forwards", 0)
    committed = after["tokens_committed"] - before.get("tokens_committed", 0)
    assert committed == 24 * len(PROMPTS)
    assert forwards == rounds  # one hub forward pass per round, whatever was accepted
    if draft == "hub":  # k=4, all accepted: 5 tokens a forward
        assert forwards / committed <= 0.5


def test_the_async_agent_decodes_speculatively_too(served: Served) -> None:
    import asyncio

    from edge_agent import AsyncEdgeAgent

    async def run() -> Any:
        async with AsyncEdgeAgent(
            None, device_id="spec-async", broker=served.url,
            language_model=served.hub_model, cloud_language_model="tiny",
        ) as agent:  # fmt: skip
            return await agent.generate(PROMPTS[0], max_tokens=12, preset="speculative").final()

    record = asyncio.run(run())
    assert list(record.output_ids) == hub_greedy(served, PROMPTS[0], 12)
    assert record.speculation.rounds >= 1


def test_speculative_turns_are_refused_at_call_time_where_they_cannot_run(
    served: Served,
) -> None:
    with served.agent("spec-refused") as agent:
        with pytest.raises(InvalidInputError, match="draft_length"):
            agent.generate("hi", max_tokens=4, preset="speculative", draft_length=17)
        with pytest.raises(InvalidInputError, match="chat"):
            agent.chat([{"role": "user", "content": "hi"}], max_tokens=4, preset="speculative")


def test_without_a_hub_a_speculative_turn_is_the_device_s_own(served: Served) -> None:
    agent = EdgeAgent(None, device_id="spec-alone", language_model=served.device_model)
    with agent:
        record = agent.generate(PROMPTS[1], max_tokens=10, preset="speculative").final()
    device = load_model(served.device_model)
    ids = [int(t) for t in device[1].encode(PROMPTS[1])]
    assert list(record.output_ids) == list(greedy_generate(device, ids, 10).tokens)
    assert any("edge_only" in note for note in record.fallbacks)


def _own_hub(models: Any, mosquitto: MosquittoProcess, root: Path, prefix: str,
             **kw: Any) -> Hub:  # fmt: skip
    repo = hub_repository(root, models.hub_model)
    return Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), coalescing=SIZED,
               mqtt_client="paho", topics=Topics(prefix), **kw).start()  # fmt: skip


def test_the_hub_gone_mid_turn_the_device_finishes_it_alone(
    models: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """After two verified rounds the hub stops: the turn is complete, every committed token
    shown once, the rest the device model's greedy continuation of them."""
    hub = _own_hub(models, mosquitto, tmp_path, "gone/v1")
    stopped = threading.Event()

    def stop_hub(rounds: int) -> None:
        if rounds == 2:
            hub.stop()
            stopped.set()

    agent = EdgeAgent(None, device_id="spec-gone", broker=mosquitto.url, topics=Topics("gone/v1"),
                      language_model=models.device_model, cloud_language_model="tiny")  # fmt: skip
    try:
        with agent:
            stream = agent.generate(PROMPTS[0], max_tokens=30, preset="speculative",
                                    draft_length=Hook(3, stop_hub))  # fmt: skip
            chunks = list(stream)
    finally:
        hub.stop()
    record = stream.result
    assert record is not None and stopped.is_set()
    assert record.degraded and any("finished on the device" in f for f in record.fallbacks)
    spec = record.speculation
    assert spec is not None and spec.rounds == 2 and spec.alone_tokens > 0
    assert len(record.output_ids) == 30 and record.finish_reason is FinishReason.LENGTH
    verified = list(record.output_ids[: 30 - spec.alone_tokens])
    hub_model, device = load_model(models.hub_model), load_model(models.device_model)
    prompt = [int(t) for t in hub_model[1].encode(PROMPTS[0])]
    assert verified == list(greedy_generate(hub_model, prompt, len(verified)).tokens)
    rest = greedy_generate(device, prompt + verified, spec.alone_tokens).tokens
    assert list(record.output_ids[len(verified) :]) == list(rest)
    assert record.text == "".join(c.text for c in chunks)  # shown once each, none lost
    assert [c.source for c in chunks][-1] is Source.EDGE


def test_an_evicted_session_is_sent_again_whole_and_the_text_is_unchanged(
    models: Any, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    """One session at a time: another device's turn between two rounds evicts the first
    session; its next round is answered ``resend``, the device sends its context again."""
    hub = _own_hub(models, mosquitto, tmp_path, "evict/v1",
                   verify_sessions=SessionLimits(max_sessions=1))  # fmt: skip
    kw: dict[str, Any] = {
        "broker": mosquitto.url,
        "topics": Topics("evict/v1"),
        "language_model": models.device_model,
        "cloud_language_model": "tiny",
    }
    other = EdgeAgent(None, device_id="spec-other", **kw)
    other_records: list[Any] = []

    def evict(rounds: int) -> None:
        if rounds == 1:
            other_records.append(other.generate(PROMPTS[2], max_tokens=6,
                                                preset="speculative").final())  # fmt: skip

    try:
        with other, EdgeAgent(None, device_id="spec-evicted", **kw) as agent:
            record = agent.generate(PROMPTS[0], max_tokens=20, preset="speculative",
                                    draft_length=Hook(3, evict)).final()  # fmt: skip
        assert hub.spec_front is not None
        evicted = hub.spec_front.stats()["sessions_evicted"]
    finally:
        hub.stop()
    spec = record.speculation
    assert spec is not None and spec.resent == 1 and not record.degraded
    assert evicted >= 1 and other_records and not other_records[0].degraded
    hub_model = load_model(models.hub_model)
    prompt = [int(t) for t in hub_model[1].encode(PROMPTS[0])]
    assert list(record.output_ids) == list(greedy_generate(hub_model, prompt, 20).tokens)


def test_closing_a_speculative_stream_mid_turn_cancels_it(served: Served) -> None:
    with served.agent("spec-close") as agent:
        stream = agent.generate(PROMPTS[0], max_tokens=40, preset="speculative", draft_length=2)
        first = next(stream)
        stream.close()
    record = stream.result
    assert first.text and record is not None
    assert record.finish_reason is FinishReason.CANCELLED


def _verdict(p: Peer) -> Any:
    topic, payload = p.received.get(timeout=WAIT_S)
    return topic, decode_verify_message(payload)


def test_bad_rounds_get_typed_error_verdicts_on_the_sender_s_topic(
    served: Served, peer: Callable[[str], Peer]
) -> None:
    p = peer("spec-bad")
    p.subscribe(f"{P}/dev/spec-bad/verified")
    ok = VerifyRequest(request_id="b1", model="tiny", session="s", round=1, base=0,
                       committed=(5, 6), drafts=(7,), max_tokens=4)  # fmt: skip
    cases = [
        (dataclasses.replace(ok, request_id="b1", drafts=(10**6,)), ErrorCode.INVALID_INPUT),
        (dataclasses.replace(ok, request_id="b2", device_id="someone-else"), ErrorCode.BAD_REQUEST),
        (dataclasses.replace(ok, request_id="b3", model="gated"), ErrorCode.BAD_REQUEST),
    ]
    for request, code in cases:
        p.publish(f"{P}/dev/spec-bad/verify/tiny", encode_verify_message(request))
        topic, verdict = _verdict(p)
        assert topic == f"{P}/dev/spec-bad/verified"
        assert (verdict.request_id, verdict.finish, verdict.error) == (
            request.request_id, VerifyFinish.ERROR, code)  # fmt: skip
    unknown = dataclasses.replace(ok, request_id="b4", model="nope")
    p.publish(f"{P}/dev/spec-bad/verify/nope", encode_verify_message(unknown))
    assert _verdict(p)[1].error is ErrorCode.UNKNOWN_MODEL
    too_many = raw_frame({"kind": "verify", "id": "b5", "model": "tiny", "session": "s",
                          "round": 1, "base": 0, "committed_count": 1, "draft_count": 17,
                          "max_tokens": 4}, b"\0" * 72)  # fmt: skip
    p.publish(f"{P}/dev/spec-bad/verify/tiny", too_many)
    verdict = _verdict(p)[1]
    assert (verdict.request_id, verdict.error) == ("b5", ErrorCode.TOO_LARGE)
    dropped = spec_stats(served).get("dropped", 0)
    p.publish(f"{P}/dev/spec-bad/verify/tiny", b"not a frame at all")
    wait_for(lambda: spec_stats(served).get("dropped", 0) > dropped, "the garbage dropped")
    # A round for a session the hub does not hold: resend, not an error.
    p.publish(f"{P}/dev/spec-bad/verify/tiny",
              encode_verify_message(dataclasses.replace(ok, request_id="b6", base=3)))  # fmt: skip
    assert _verdict(p)[1].finish is VerifyFinish.RESEND


@pytest.fixture(scope="module")
def trained_hub(tmp_path_factory: pytest.TempPathFactory, models: Any) -> Path:
    """A hub model trained longer than the device's (same tokenizer): it disagrees with the
    device model's drafts, so rounds reject drafts and the device rewinds."""
    built = build_language_models(tmp_path_factory.mktemp("lm-trained"),
                                  recipe=dataclasses.replace(TINY, steps=60))  # fmt: skip
    same = (built.hub_model / "tokenizer.json").read_bytes()
    assert same == (models.device_model / "tokenizer.json").read_bytes()
    return Path(built.hub_model)


def test_rejected_drafts_are_rewound_and_the_text_is_still_the_hub_s(
    models: Any, trained_hub: Path, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    repo = hub_repository(tmp_path, trained_hub)
    hub = Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), coalescing=SIZED,
              mqtt_client="paho", topics=Topics("trained/v1")).start()  # fmt: skip
    agent = EdgeAgent(None, device_id="spec-trained", broker=mosquitto.url,
                      topics=Topics("trained/v1"), language_model=models.device_model,
                      cloud_language_model="tiny")  # fmt: skip
    reference = load_model(trained_hub)
    drafted = accepted = 0
    try:
        with agent:
            for prompt in PROMPTS:
                cloud = agent.generate(prompt, max_tokens=20, preset="cloud_only").final()
                record = agent.generate(prompt, max_tokens=20, preset="speculative",
                                        draft_length=3).final()  # fmt: skip
                ids = [int(t) for t in reference[1].encode(prompt)]
                assert list(record.output_ids) == greedy_generate(reference, ids, 20).tokens
                assert record.output_ids == cloud.output_ids and not record.degraded
                spec = record.speculation
                assert spec is not None
                drafted, accepted = drafted + spec.drafted, accepted + spec.accepted
    finally:
        hub.stop()
    assert 0 < accepted < drafted  # some drafts held, some were rejected and rewound


def test_a_sampled_speculative_turn_sends_the_draft_s_rows_and_keeps_the_hub_s_support(
    served: Served, peer: Callable[[str], Peer]
) -> None:
    """Sampling, wired end to end: every round carries the compressed rows its drafts were
    drawn from and the turn's sampling; every committed token is one the hub's model could
    sample there (its top-k at that temperature)."""
    spy = peer("spec-sample-spy")
    spy.subscribe(f"{P}/dev/spec-sample/verify/#")
    sampling = Sampling(temperature=1.5, seed=11)
    with spec_agent(served, "spec-sample", served.device_model) as agent:
        record = agent.generate(PROMPTS[1], max_tokens=16, preset="speculative",
                                sampling=sampling, draft_length=3).final()  # fmt: skip
    assert record.finish_reason is FinishReason.LENGTH and not record.degraded
    assert len(record.output_ids) == 16 and record.speculation is not None
    rounds = []
    while not spy.received.empty():
        message = decode_verify_message(spy.received.get()[1])
        if isinstance(message, VerifyRequest):
            rounds.append(message)
    assert len(rounds) == record.speculation.rounds
    off_top = 0  # drafts that are not their row's most probable id: drawn, not argmax
    for message in rounds:
        assert message.sampling.temperature == 1.5 and message.sampling.seed == 11
        if message.drafts:
            rows = decode_draft_dists(message.draft_dists or b"", k=len(message.drafts),
                                      vocab=320)  # fmt: skip
            assert all(rows.prob(i, d) > 0 for i, d in enumerate(message.drafts))
            off_top += sum(int(rows.ids[i, 0]) != d for i, d in enumerate(message.drafts))
    assert off_top > 0
    hub = VerifyModel(served.hub_model)
    ids = [int(t) for t in load_model(served.hub_model)[1].encode(PROMPTS[1])]
    logits, _ = hub.forward(ids + list(record.output_ids), hub.empty())
    for i, token in enumerate(record.output_ids):
        p = target_probs(logits[len(ids) - 1 + i], temperature=1.5, top_k=hub.top_k)
        assert p[token] > 0, (i, token)


def test_the_broker_gone_mid_turn_the_device_finishes_it_alone_at_once(
    models: Any, own_mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    hub = _own_hub(models, own_mosquitto, tmp_path, "broker/v1")

    def stop_broker(rounds: int) -> None:
        if rounds == 1:
            own_mosquitto.stop()

    agent = EdgeAgent(None, device_id="spec-broker", broker=own_mosquitto.url,
                      topics=Topics("broker/v1"), language_model=models.device_model,
                      cloud_language_model="tiny")  # fmt: skip
    try:
        with agent:
            record = agent.generate(PROMPTS[3], max_tokens=20, preset="speculative",
                                    draft_length=Hook(2, stop_broker)).final()  # fmt: skip
    finally:
        hub.stop(timeout_s=2.0)
    spec = record.speculation
    assert spec is not None and spec.rounds == 1 and record.degraded
    assert len(record.output_ids) == 20 and spec.alone_tokens == 20 - spec.accepted - 1
    assert not any("no verdict" in f for f in record.fallbacks), record.fallbacks  # no wait


def test_the_adaptive_draft_length_is_fed_every_round(served: Served) -> None:
    """A ``DraftLength`` given as ``draft_length`` learns the link from each verdict: every
    draft of a copy of the hub model is accepted, so its acceptance is exactly 1."""
    draft = DraftLength(start=2, k_max=6)
    with spec_agent(served, "spec-adaptive", served.hub_model) as agent:
        record = agent.generate(PROMPTS[0], max_tokens=30, preset="speculative",
                                draft_length=draft).final()  # fmt: skip
    spec = record.speculation
    assert spec is not None and spec.k[0] == 2 and all(1 <= k <= 6 for k in spec.k[:-1])
    assert draft.alpha == 1.0 and draft.rtt_s is not None and draft.rtt_s > 0
    assert list(record.output_ids) == hub_greedy(served, PROMPTS[0], 30)
