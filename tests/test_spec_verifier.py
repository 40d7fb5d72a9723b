"""The hub's verifier on the tiny hub model, without MQTT: acceptance, rollback, bounds.

Rounds go through ``Verifier.submit`` as the front sends them; the hub's own
greedy continuation (``greedy_generate``, ONNX Runtime GenAI) is the
reference, so a draft is known right or wrong before it is sent.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any

import numpy as np
import pytest

from cloud_hub.language import SessionLimits, Verifier, VerifyModel, target_probs
from shared import (
    ErrorCode,
    TextSampling,
    VerifyFinish,
    VerifyRequest,
    VerifyResult,
    decode_draft_dists,
    encode_draft_dists,
)
from tandem.demo.language import greedy_generate, load_model

PROMPT = 'The "assert" statement'


@pytest.fixture(scope="module")
def hub_dir(tiny_language_models: Any) -> Any:
    return tiny_language_models.hub_model


@pytest.fixture(scope="module")
def prompt_ids(hub_dir: Any) -> list[int]:
    return [int(t) for t in load_model(hub_dir)[1].encode(PROMPT)]


@pytest.fixture(scope="module")
def reference(hub_dir: Any, prompt_ids: list[int]) -> list[int]:
    return list(greedy_generate(hub_dir, prompt_ids, 20).tokens)


class Rounds:
    """A verifier and a device's view of one session: send a round, wait for its verdict."""

    def __init__(self, verifier: Verifier, device: str = "dev-1", session: str = "s1") -> None:
        self.verifier, self.device, self.session = verifier, device, session
        self.results: queue.Queue[VerifyResult] = queue.Queue()
        self.round = 0

    def send(self, *, base: int, committed: list[int], drafts: list[int],
             max_tokens: int = 40, **kw: Any) -> VerifyResult:  # fmt: skip
        self.round += 1
        request = VerifyRequest(
            request_id=f"r{self.round}", model="tiny", session=self.session, round=self.round,
            base=base, committed=tuple(committed), drafts=tuple(drafts), max_tokens=max_tokens,
            **kw,
        )  # fmt: skip
        self.verifier.submit(self.device, request, self.results.put)
        return self.results.get(timeout=30)


@pytest.fixture
def verifier(hub_dir: Any) -> Any:
    v = Verifier(VerifyModel(hub_dir), hub_id="hub-t")
    yield v
    v.stop()


def test_the_verifier_s_logits_give_the_hub_engine_s_greedy_tokens(
    hub_dir: Any, prompt_ids: list[int], reference: list[int]
) -> None:
    """Raw ONNX Runtime over the served folder: every row's argmax is the next greedy id."""
    model = VerifyModel(hub_dir)
    logits, kv = model.forward(prompt_ids + reference[:5], model.empty())
    assert logits.shape == (len(prompt_ids) + 5, model.vocab_size)
    assert logits[len(prompt_ids) - 1 :].argmax(-1).tolist() == reference[:6]
    assert kv[0].shape[2] == len(prompt_ids) + 5


def test_a_round_accepts_the_longest_agreeing_prefix_then_the_hub_s_token(
    verifier: Verifier, prompt_ids: list[int], reference: list[int]
) -> None:
    rounds = Rounds(verifier)
    wrong = (reference[2] + 1) % verifier.model.vocab_size
    drafts = [reference[0], reference[1], wrong, reference[3]]
    r = rounds.send(base=0, committed=prompt_ids, drafts=drafts)
    assert (r.finish, r.accepted, r.tokens) == (VerifyFinish.MORE, 2, (reference[2],))
    assert r.committed == len(prompt_ids) + 3 and r.hub == "hub-t"
    # The rejected draft left nothing behind: the next round continues the hub's decoding.
    r = rounds.send(base=r.committed, committed=[], drafts=reference[3:7])
    assert (r.accepted, r.tokens) == (4, (reference[7],))
    r = rounds.send(base=r.committed, committed=[], drafts=[])  # no drafts: one hub token
    assert (r.accepted, r.tokens) == (0, (reference[8],))
    stats = verifier.stats()
    assert stats["verify_forwards"] == stats["verify_rounds"] == 3
    assert stats["tokens_committed"] == 3 + 5 + 1
    assert stats["drafts_accepted"] == 6 and stats["drafts_received"] == 8


def test_max_tokens_cuts_a_round_and_ends_the_turn(
    verifier: Verifier, prompt_ids: list[int], reference: list[int]
) -> None:
    r = Rounds(verifier).send(base=0, committed=prompt_ids, drafts=reference[:4], max_tokens=3)
    assert (r.finish, r.accepted, r.tokens) == (VerifyFinish.LENGTH, 3, ())


def test_a_session_the_hub_does_not_hold_is_answered_resend(
    verifier: Verifier, prompt_ids: list[int], reference: list[int]
) -> None:
    rounds = Rounds(verifier)
    assert rounds.send(base=9, committed=[], drafts=reference[:2]).finish is VerifyFinish.RESEND
    r = rounds.send(base=0, committed=prompt_ids, drafts=reference[:2])
    assert r.finish is VerifyFinish.MORE
    # Out of step (the device thinks the hub holds more): resend, never a wrong token.
    assert rounds.send(base=r.committed + 1, committed=[], drafts=[]).finish is (
        VerifyFinish.RESEND
    )
    # Another device's rounds cannot reach this session.
    other = Rounds(verifier, device="dev-2")
    assert other.send(base=r.committed, committed=[], drafts=[]).finish is VerifyFinish.RESEND


def test_bad_rounds_are_typed_errors(verifier: Verifier, prompt_ids: list[int]) -> None:
    rounds = Rounds(verifier)
    vocab = verifier.model.vocab_size
    r = rounds.send(base=0, committed=prompt_ids, drafts=[vocab])
    assert (r.finish, r.error) == (VerifyFinish.ERROR, ErrorCode.INVALID_INPUT)
    r = rounds.send(base=0, committed=prompt_ids, drafts=[1], sampling=TextSampling(temperature=1))
    assert (r.finish, r.error) == (VerifyFinish.ERROR, ErrorCode.INVALID_INPUT)


def test_sessions_are_bounded_least_recently_used_first(
    hub_dir: Any, prompt_ids: list[int], reference: list[int]
) -> None:
    verifier = Verifier(VerifyModel(hub_dir), limits=SessionLimits(max_sessions=2))
    try:
        a, b, c = (Rounds(verifier, session=s) for s in ("a", "b", "c"))
        ra = a.send(base=0, committed=prompt_ids, drafts=[])
        rb = b.send(base=0, committed=prompt_ids, drafts=[])
        a.send(base=ra.committed, committed=[], drafts=[])  # a is now the most recent
        c.send(base=0, committed=prompt_ids, drafts=[])  # evicts b
        assert b.send(base=rb.committed, committed=[], drafts=[]).finish is VerifyFinish.RESEND
        assert verifier.stats()["sessions_evicted"] == 1
        assert verifier.stats()["sessions"] == 2
    finally:
        verifier.stop()


def test_sampled_rounds_give_the_hub_model_s_distribution_whatever_the_draft(
    hub_dir: Any, prompt_ids: list[int]
) -> None:
    """The wiring of the sampled rule: drafts drawn from a ``q`` far from the hub's ``p``
    (the 32 ids the hub finds least likely), sent compressed; the first committed token
    follows ``p`` (temperature 2, the model's top-k 50), not ``q``. The math itself is
    ``tests/test_accept_drafts.py``'s."""
    verifier = Verifier(VerifyModel(hub_dir))
    model = verifier.model
    try:
        logits, _ = model.forward(prompt_ids, model.empty())
        p = target_probs(logits[-1], temperature=2.0, top_k=model.top_k)
        q = np.zeros(model.vocab_size, dtype=np.float32)
        q[np.argsort(p, kind="stable")[:32]] = 1 / 32
        rng = np.random.default_rng(7)
        dists = encode_draft_dists(q[None], top=32)
        row = decode_draft_dists(dists, k=1, vocab=model.vocab_size)
        rounds = Rounds(verifier)
        counts = np.zeros(model.vocab_size)
        n = 1500
        for i in range(n):
            draft = row.sample(0, rng)
            r = rounds.send(base=0, committed=prompt_ids, drafts=[draft], draft_dists=dists,
                            sampling=TextSampling(temperature=2.0, seed=i))  # fmt: skip
            first = draft if r.accepted else r.tokens[0]
            counts[first] += 1
        tv = 0.5 * np.abs(counts / n - p).sum()
        assert tv < 0.08, tv  # sampling noise at n=1500 is ~0.03; q is ~1 away from p
    finally:
        verifier.stop()


def test_the_attention_kernel_refuses_a_batch_of_rounds_with_a_kv_cache(
    hub_dir: Any, prompt_ids: list[int]
) -> None:
    """Why rounds of several sessions run one forward each (``_verify_model``): should a
    newer ONNX Runtime lift this, this test fails and batching can be built."""
    import onnxruntime as ort

    model = VerifyModel(hub_dir)
    _, kv = model.forward(prompt_ids, model.empty())
    session = ort.InferenceSession(str(hub_dir / "model.onnx"))
    total = kv[0].shape[2] + 2
    feeds = {
        "input_ids": np.ones((2, 2), np.int64),
        "attention_mask": np.ones((2, total), np.int64),
    }
    for layer in range(model.layers):
        feeds[f"past_key_values.{layer}.key"] = np.concatenate([kv[2 * layer]] * 2)
        feeds[f"past_key_values.{layer}.value"] = np.concatenate([kv[2 * layer + 1]] * 2)
    with pytest.raises(Exception, match="batch_size must be 1"):
        session.run(None, feeds)


def test_stopping_answers_every_round_still_queued(hub_dir: Any, prompt_ids: list[int]) -> None:
    """No round is left without a verdict: those not run are answered ``overloaded``."""
    verifier = Verifier(VerifyModel(hub_dir))
    answers: queue.Queue[VerifyResult] = queue.Queue()
    for i in range(30):
        request = VerifyRequest(
            request_id=f"q{i}", model="tiny", session=f"s{i}", round=1, base=0,
            committed=tuple(prompt_ids), drafts=(), max_tokens=4,
        )  # fmt: skip
        verifier.submit("dev-q", request, answers.put)
    verifier.stop()
    got = [answers.get(timeout=30) for _ in range(30)]
    assert sorted(r.request_id for r in got) == sorted(f"q{i}" for i in range(30))
    assert {r.error for r in got} <= {ErrorCode.OK, ErrorCode.OVERLOADED}
    with pytest.raises(Exception, match="stopping"):
        verifier.submit("dev-q", dataclasses.replace(request, request_id="late"), answers.put)


def test_a_batched_forward_of_fresh_sequences_equals_their_forwards_alone(
    hub_dir: Any, prompt_ids: list[int]
) -> None:
    model = VerifyModel(hub_dir)
    rows = [prompt_ids, prompt_ids[::-1], [(t + 7) % model.vocab_size for t in prompt_ids]]
    for (logits, kv), row in zip(model.forward_batch(rows), rows, strict=True):
        alone, alone_kv = model.forward(row, model.empty())
        np.testing.assert_allclose(logits, alone, rtol=0, atol=1e-5)
        for x, y in zip(kv, alone_kv, strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


def test_fresh_rounds_waiting_at_once_run_in_one_forward_and_give_the_same_verdicts(
    hub_dir: Any, prompt_ids: list[int]
) -> None:
    """Rounds queue behind a round whose reply holds the worker; released, the three fresh
    sessions of one length run in one batched forward. Their verdicts, and the next round
    of each (on the KV cache the batch left), are those of a verifier taking them alone."""
    prompts = [prompt_ids, prompt_ids[::-1], [(t + 7) % 320 for t in prompt_ids]]
    drafts = [[5, 6], [7, 8], [9, 10]]

    def alone() -> list[tuple[Any, Any]]:
        v = Verifier(VerifyModel(hub_dir))
        try:
            out = []
            for i, (p, d) in enumerate(zip(prompts, drafts, strict=True)):
                r = Rounds(v, device=f"d{i}")
                first = r.send(base=0, committed=p, drafts=d)
                second = r.send(base=first.committed, committed=[], drafts=[3])
                out.append(((first.accepted, first.tokens), (second.accepted, second.tokens)))
            return out
        finally:
            v.stop()

    verifier = Verifier(VerifyModel(hub_dir))
    try:
        gate, held = threading.Event(), threading.Event()

        def hold(_: VerifyResult) -> None:
            held.set()
            assert gate.wait(30)

        blocker = VerifyRequest(request_id="b", model="tiny", session="b", round=1, base=0,
                                committed=(1,), drafts=(), max_tokens=4)  # fmt: skip
        verifier.submit("blocker", blocker, hold)
        assert held.wait(30)
        rounds = [Rounds(verifier, device=f"d{i}") for i in range(3)]
        for i, r in enumerate(rounds):
            r.round += 1
            request = VerifyRequest(request_id="r1", model="tiny", session=r.session, round=1,
                                    base=0, committed=tuple(prompts[i]), drafts=tuple(drafts[i]),
                                    max_tokens=40)  # fmt: skip
            verifier.submit(r.device, request, r.results.put)
        forwards = verifier.stats()["verify_forwards"]
        gate.set()
        firsts = [r.results.get(timeout=30) for r in rounds]
        assert verifier.stats()["verify_forwards"] == forwards + 1
        assert verifier.stats()["verify_batched_rounds"] == 3
        seconds = [r.send(base=f.committed, committed=[], drafts=[3])
                   for r, f in zip(rounds, firsts, strict=True)]  # fmt: skip
        got = [((f.accepted, f.tokens), (s.accepted, s.tokens))
               for f, s in zip(firsts, seconds, strict=True)]  # fmt: skip
    finally:
        verifier.stop()
    assert got == alone()
