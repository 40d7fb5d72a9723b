"""Speculative decoding's verification rule (cloud_hub.language.accept_drafts), pure numpy."""

from __future__ import annotations

import numpy as np
import pytest

from cloud_hub import InvalidRequestError
from cloud_hub.language import Acceptance, Sampling, accept_drafts, target_probs
from shared import SparseDists, TextSampling, decode_draft_dists, encode_draft_dists

GREEDY = Sampling()
NEG = -np.inf


def logits_with_argmax(best: list[int], vocab: int = 6) -> np.ndarray:
    rows = np.zeros((len(best), vocab), np.float32)
    for i, b in enumerate(best):
        rows[i, b] = 5.0
        rows[i, (b + 1) % vocab] = 4.0  # a close second: argmax, not luck
    return rows


def test_greedy_keeps_drafts_while_they_are_the_argmax() -> None:
    rng = np.random.default_rng(0)
    logits = logits_with_argmax([2, 4, 1, 3])
    assert accept_drafts(logits, [2, 4, 1], None, GREEDY, rng) == Acceptance(3, 3)
    assert accept_drafts(logits, [2, 4, 0], None, GREEDY, rng) == Acceptance(2, 1)
    assert accept_drafts(logits, [2, 5, 1], None, GREEDY, rng) == Acceptance(1, 4)
    assert accept_drafts(logits, [0, 4, 1], None, GREEDY, rng) == Acceptance(0, 2)
    assert accept_drafts(logits[:1], [], None, GREEDY, rng) == Acceptance(0, 2)  # no drafts
    ties = np.zeros((2, 6), np.float32)  # argmax of a tie is the lowest id, as np.argmax
    assert accept_drafts(ties, [0], None, GREEDY, rng) == Acceptance(1, 0)
    assert accept_drafts(ties, [1], None, GREEDY, rng) == Acceptance(0, 0)


def test_greedy_ignores_the_draft_distributions_and_temperature_zero_is_greedy() -> None:
    logits = logits_with_argmax([2, 4, 1])
    uniform = decode_draft_dists(encode_draft_dists(np.full((2, 6), 1 / 6)), k=2, vocab=6)
    rng = np.random.default_rng(0)
    zero = Sampling(temperature=0.0, top_p=0.5)
    assert accept_drafts(logits, [2, 4], uniform, zero, rng) == Acceptance(2, 1)


def test_target_probs_applies_temperature_then_top_k_then_top_p() -> None:
    row = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    assert np.allclose(target_probs(row, temperature=1.0), [0.1, 0.4, 0.2, 0.3])
    hot = np.array([0.1, 0.4, 0.2, 0.3]) ** 0.5
    assert np.allclose(target_probs(row, temperature=2.0), hot / hot.sum())
    assert np.allclose(target_probs(row, temperature=1.0, top_k=2), [0, 4 / 7, 0, 3 / 7])
    # top_p keeps the smallest most-probable set reaching it, the crossing id included
    assert np.allclose(target_probs(row, temperature=1.0, top_p=0.7), [0, 4 / 7, 0, 3 / 7])
    assert np.allclose(target_probs(row, temperature=1.0, top_p=0.71), [0, 4 / 9, 2 / 9, 3 / 9])
    assert np.allclose(target_probs(row, temperature=1.0, top_p=0.05), [0, 1, 0, 0])
    assert np.allclose(target_probs(row, temperature=1.0, top_k=3, top_p=0.5), [0, 4 / 7, 0, 3 / 7])
    assert np.allclose(target_probs(row, temperature=0.0), [0, 1, 0, 0])
    masked = np.array([NEG, 0.0, NEG, 0.0])
    assert np.allclose(target_probs(masked, temperature=0.7), [0, 0.5, 0, 0.5])
    for bad in (np.array([np.nan, 0.0]), np.array([np.inf, 0.0]), np.array([NEG, NEG])):
        with pytest.raises(InvalidRequestError):
            target_probs(bad, temperature=1.0)


def reference_target_probs(row: np.ndarray, temperature: float, top_p: float, top_k: int | None):
    """The truncation by a full stable sort, for comparison."""
    weights = np.exp((row - row.max()) / temperature)
    order = np.argsort(-weights, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    probs = weights[order] / weights[order].sum()
    keep = (
        max(1, int(np.count_nonzero(np.cumsum(probs) - probs < top_p))) if top_p < 1 else order.size
    )
    out = np.zeros(row.size)
    out[order[:keep]] = weights[order[:keep]]
    return out / out.sum()


def test_target_probs_sorts_only_the_head_and_still_matches_a_full_sort() -> None:
    rng = np.random.default_rng(11)
    for vocab, scale in ((1000, 0.1), (1000, 3.0), (32000, 2.0)):
        for _ in range(5):
            row = np.round(rng.normal(size=vocab) * scale, 1)  # rounded: many ties
            for top_p, top_k in ((0.9, None), (0.5, 40), (0.99, 2000), (1.0, 7), (0.3, None)):
                got = target_probs(row, temperature=0.9, top_p=top_p, top_k=top_k)
                want = reference_target_probs(row, 0.9, top_p, top_k)
                assert np.array_equal(got > 0, want > 0), (vocab, scale, top_p, top_k)
                assert np.allclose(got, want, rtol=1e-9, atol=1e-15)


def emitted_positions(
    sampling: Sampling, target: np.ndarray, q: np.ndarray, k: int, n: int, seed: int
) -> np.ndarray:
    """Counts [positions, vocab] of the tokens emitted at positions 0..k over ``n`` turns.

    The target's row at a position does not depend on the prefix, so each position's
    emitted token must follow that row's p. The device drafts from the decoded q.
    """
    rng = np.random.default_rng(seed)
    positions, vocab = k + 1, target.shape[1]
    dists = [  # drafts of a round starting at position s use q rows s..s+k-1, top 3 of 6
        decode_draft_dists(encode_draft_dists(q[s : s + k], top=3), k=k, vocab=vocab)
        for s in range(positions)
    ]
    counts = np.zeros((positions, vocab), np.int64)
    for _ in range(n):
        tokens: list[int] = []
        while len(tokens) < positions:
            s = len(tokens)
            drafts = [dists[s].sample(j, rng) for j in range(k)]
            got = accept_drafts(target[s : s + k + 1], drafts, dists[s], sampling, rng)
            tokens += [*drafts[: got.accepted], got.next_token]
        for position in range(positions):
            counts[position, tokens[position]] += 1
    return counts


def chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    n = counts.sum()
    assert np.all(counts[p == 0] == 0), "a token p gives 0 was emitted"
    live = p > 0
    return float((((counts[live] - n * p[live]) ** 2) / (n * p[live])).sum())


K = 2
TARGET = np.log(
    np.array(
        [
            [0.40, 0.25, 0.15, 0.10, 0.06, 0.04],
            [0.05, 0.05, 0.10, 0.20, 0.25, 0.35],
            [0.30, 0.02, 0.30, 0.02, 0.30, 0.06],
            [0.16, 0.16, 0.16, 0.16, 0.16, 0.20],
            [0.50, 0.10, 0.10, 0.10, 0.10, 0.10],
        ]
    )
)
DRAFT = np.array(  # far from the target: many rejections, so the residual matters
    [
        [0.05, 0.10, 0.50, 0.20, 0.10, 0.05],
        [0.40, 0.30, 0.10, 0.10, 0.05, 0.05],
        [0.10, 0.40, 0.10, 0.30, 0.05, 0.05],
        [0.30, 0.30, 0.10, 0.10, 0.10, 0.10],
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
    ]
)


@pytest.mark.parametrize(
    "sampling", [Sampling(temperature=1.0), Sampling(temperature=0.8, top_p=0.85)]
)
def test_sampled_output_follows_the_target_distribution(sampling: Sampling) -> None:
    """Chi-square of the emitted tokens at positions 0, 1 and 2 (k=2) against p.

    5 degrees of freedom (fewer with top_p): the 0.1% critical value is 20.5, the
    threshold 25. Mutants (residual p, inverted ratio, always accept, the bonus
    token from the wrong row) reach hundreds.
    """
    counts = emitted_positions(sampling, TARGET, DRAFT, K, n=12000, seed=7)
    for position in range(K + 1):
        p = target_probs(TARGET[position], temperature=sampling.temperature, top_p=sampling.top_p)
        assert chi_square(counts[position], p) < 25, (position, counts[position], p)


def test_sampled_rounds_accept_often_when_the_draft_is_the_target() -> None:
    p = np.exp(TARGET[:3]) / np.exp(TARGET[:3]).sum(axis=1, keepdims=True)
    dists = decode_draft_dists(encode_draft_dists(p[:2], top=6), k=2, vocab=6)
    rng = np.random.default_rng(3)
    kept = [
        accept_drafts(TARGET[:3], [dists.sample(0, rng), dists.sample(1, rng)], dists,
                      Sampling(temperature=1.0), rng).accepted
        for _ in range(400)
    ]  # fmt: skip
    assert min(kept) == 2  # q == p to quantization: every draft is kept


def test_a_token_q_gives_zero_is_kept_when_p_gives_it_mass() -> None:
    q = SparseDists(
        ids=np.array([[0, 1, 2, 3]], np.int32),
        probs=np.array([[0.5, 0.5, 0.0, 0.0]], np.float32),
        rest=np.zeros(1, np.float32),
        vocab=4,
    )
    logits = np.log(np.array([[0.25, 0.25, 0.5, 1e-30], [0.25] * 4]))
    logits[0, 3] = NEG  # p(3) = 0
    sampling = Sampling(temperature=1.0)
    rng = np.random.default_rng(5)
    for _ in range(50):
        assert accept_drafts(logits, [2], q, sampling, rng).accepted == 1
        got = accept_drafts(logits, [3], q, sampling, rng)  # p = q = 0: rejected
        assert got.accepted == 0 and got.next_token == 2  # max(0, p - q) is all on id 2


def test_a_target_with_all_mass_on_one_token_always_emits_it() -> None:
    logits = np.full((3, 6), NEG)
    logits[:, 4] = 0.0
    q = decode_draft_dists(encode_draft_dists(np.full((2, 6), 1 / 6), top=2), k=2, vocab=6)
    sampling = Sampling(temperature=1.3, top_p=0.9)
    rng = np.random.default_rng(6)
    for _ in range(50):
        assert accept_drafts(logits, [4, 4], q, sampling, rng) == Acceptance(2, 4)
        assert accept_drafts(logits, [4, 1], q, sampling, rng) == Acceptance(1, 4)
        assert accept_drafts(logits, [0, 4], q, sampling, rng) == Acceptance(0, 4)


def test_the_same_seed_gives_the_same_round() -> None:
    dists = decode_draft_dists(encode_draft_dists(DRAFT[:2], top=3), k=2, vocab=6)
    runs = [
        [accept_drafts(TARGET[:3], [2, 0], dists, Sampling(temperature=1.0), rng)
         for _ in range(30)]
        for rng in (np.random.default_rng(9), np.random.default_rng(9))
    ]  # fmt: skip
    assert runs[0] == runs[1]


def test_inputs_that_do_not_match_are_refused() -> None:
    rng = np.random.default_rng(0)
    logits = np.zeros((3, 6), np.float32)
    q = decode_draft_dists(encode_draft_dists(DRAFT[:2]), k=2, vocab=6)
    sampled = Sampling(temperature=1.0)
    cases = [
        (np.zeros((2, 6), np.float32), [1, 2], q, GREEDY, "must be \\[3, vocab\\]"),
        (logits, [1, 6], q, GREEDY, "outside 0..5"),
        (logits, [1, -1], q, GREEDY, "outside 0..5"),
        (logits, [1, 2], None, sampled, "needs the draft's q"),
        (np.zeros((2, 6), np.float32), [1], q, sampled, "2 rows over 6 ids, expected 1"),
        (np.zeros((3, 7), np.float32), [1, 2], q, sampled, "expected 2 over 7"),
        (np.full((3, 6), np.nan), [1, 2], q, GREEDY, "NaN"),
        (np.zeros((3, 6), np.int64), [1, 2], q, GREEDY, "floats"),
    ]
    for target, drafts, draft, sampling, words in cases:
        with pytest.raises(InvalidRequestError, match=words):
            accept_drafts(target, drafts, draft, sampling, rng)


def test_the_engines_top_k_truncates_the_target() -> None:
    """A top_k beside Sampling (the engine's search.top_k): ids outside it never come out."""
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    q = decode_draft_dists(encode_draft_dists(np.full((1, 4), 0.25)), k=1, vocab=4)
    rng = np.random.default_rng(8)
    sampling = Sampling(temperature=1.0)
    out = set()
    for _ in range(300):
        got = accept_drafts(logits, [2], q, sampling, rng, top_k=2)
        assert got.accepted == 0  # p(2) = 0 under top_k 2
        out.add(got.next_token)
        full = accept_drafts(logits, [0], q, sampling, rng, top_k=2)
        if full.accepted == 1:
            out.add(100 + full.next_token)
    assert out <= {0, 1, 102, 103} and {0, 1} <= out
    with pytest.raises(InvalidRequestError, match="top_k"):
        accept_drafts(logits, [2], q, sampling, rng, top_k=0)


def test_the_wires_text_sampling_is_taken_too() -> None:
    """shared.TextSampling: temperature None is greedy, top_p None is 1, its top_k applies."""
    rng = np.random.default_rng(12)
    logits = logits_with_argmax([2, 4, 1])
    assert accept_drafts(logits, [2, 4], None, TextSampling(), rng) == Acceptance(2, 1)
    rows = np.log(np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    q = decode_draft_dists(encode_draft_dists(np.full((1, 4), 0.25)), k=1, vocab=4)
    wire = TextSampling(temperature=1.0, top_k=2)
    for _ in range(100):
        got = accept_drafts(rows, [2], q, wire, rng)
        assert got.accepted == 0 and got.next_token in (0, 1)
    kept = {accept_drafts(rows, [2], q, TextSampling(temperature=1.0), rng).accepted
            for _ in range(100)}  # fmt: skip
    assert kept == {0, 1}  # no top_k: id 2 has p = 0.2, q = 0.25, kept 80% of the time
