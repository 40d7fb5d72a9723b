"""The draft's compressed distributions (shared's encode_draft_dists / decode_draft_dists)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from shared import (
    FrameError,
    LimitExceededError,
    SparseDists,
    TensorError,
    UnsupportedVersionError,
    decode_draft_dists,
    encode_draft_dists,
)


def softmax_rows(rng: np.random.Generator, k: int, vocab: int, scale: float = 3.0) -> np.ndarray:
    logits = rng.normal(size=(k, vocab)) * scale
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def test_round_trip_keeps_the_top_ids_and_their_mass() -> None:
    rng = np.random.default_rng(1)
    probs = softmax_rows(rng, 4, 1000)
    dists = decode_draft_dists(encode_draft_dists(probs, top=32), k=4, vocab=1000)
    assert dists.k == 4 and dists.top == 32 and dists.vocab == 1000
    for row in range(4):
        want = np.argsort(-probs[row], kind="stable")[:32]
        assert list(dists.ids[row]) == list(want)
        assert np.allclose(dists.probs[row], probs[row, want], atol=1 / 65535)
        kept = float(probs[row, want].astype(np.float64).sum())
        assert dists.rest[row] == pytest.approx(1 - kept, abs=1 / 65535)
        dense = dists.dense(row, 1000)
        assert dense.sum() == pytest.approx(1.0, abs=1e-6)
        outside = np.setdiff1d(np.arange(1000), want)
        assert np.allclose(dense[outside], dists.rest[row] / (1000 - 32))
        t = int(want[3])
        assert dists.prob(row, t) == pytest.approx(float(probs[row, t]), abs=1 / 65535)
        assert dists.prob(row, int(outside[0])) == pytest.approx(dense[outside[0]])


def test_size_for_four_drafts_of_thirty_two_ids() -> None:
    probs = softmax_rows(np.random.default_rng(2), 4, 32000)
    assert len(encode_draft_dists(probs, top=32)) == 5 + 4 * 32 * 4  # 517 bytes
    big = softmax_rows(np.random.default_rng(2), 4, 70000)
    assert len(encode_draft_dists(big, top=32)) == 5 + 4 * 32 * 6  # u32 ids above 65536


def test_every_id_kept_leaves_no_rest_and_rounding_never_exceeds_one() -> None:
    rng = np.random.default_rng(3)
    probs = softmax_rows(rng, 8, 6, scale=1.0)
    dists = decode_draft_dists(encode_draft_dists(probs, top=32), k=8, vocab=6)
    assert dists.top == 6
    assert np.all(dists.rest == 0)
    for row in range(8):
        assert dists.dense(row).sum() == pytest.approx(1.0, abs=1e-6)
        assert np.allclose(dists.dense(row), probs[row], atol=1 / 65535)


def test_sample_draws_from_the_decoded_distribution() -> None:
    probs = np.array([[0.5, 0.3, 0.2, 0.0, 0.0, 0.0]], np.float32)
    dists = decode_draft_dists(encode_draft_dists(probs, top=2), k=1, vocab=6)
    rng = np.random.default_rng(4)
    draws = np.bincount([dists.sample(0, rng) for _ in range(20000)], minlength=6) / 20000
    assert np.abs(draws - dists.dense(0)).max() < 0.02
    assert draws[2] > 0.03  # the rest (0.2) is spread over ids 2..5


def test_bad_arrays_are_refused_when_encoding() -> None:
    ok = np.full((2, 4), 0.25, np.float32)
    with pytest.raises(TensorError, match="float array"):
        encode_draft_dists(ok.astype(np.int32))
    with pytest.raises(TensorError, match="finite"):
        encode_draft_dists(np.array([[np.nan, 1.0]], np.float32))
    with pytest.raises(TensorError, match="finite"):
        encode_draft_dists(np.array([[-0.1, 1.1]], np.float32))
    with pytest.raises(TensorError, match="no mass"):
        encode_draft_dists(np.zeros((1, 4), np.float32))
    with pytest.raises(TensorError, match="top"):
        encode_draft_dists(ok, top=0)


def frame(version: int, k: int, top: int, ids: list[int], steps: list[int]) -> bytes:
    header = struct.pack("<BHH", version, k, top)
    return header + np.array(ids, "<u2").tobytes() + np.array(steps, "<u2").tobytes()


def test_decode_refuses_bad_frames_with_one_clear_line() -> None:
    good = frame(1, 1, 2, [3, 1], [40000, 20000])
    assert decode_draft_dists(good, k=1, vocab=6).prob(0, 3) == pytest.approx(40000 / 65535)
    cases: list[tuple[bytes, type[Exception], str]] = [
        (b"\x01\x01", FrameError, "shorter than the header"),
        (frame(2, 1, 2, [3, 1], [1, 1]), UnsupportedVersionError, "version 2"),
        (frame(1, 300, 2, [], []), LimitExceededError, "above"),
        (frame(1, 2, 2, [3, 1], [1, 1]), FrameError, "2 rows for 1 draft"),
        (frame(1, 1, 7, [], []), FrameError, "7 ids kept of a vocabulary of 6"),
        (good[:-1], FrameError, "expected 13"),
        (good + b"\x00", FrameError, "expected 13"),
        (frame(1, 1, 2, [3, 6], [1, 1]), FrameError, "outside 0..5"),
        (frame(1, 1, 2, [3, 3], [1, 1]), FrameError, "kept twice"),
        (frame(1, 1, 2, [3, 1], [40000, 40000]), FrameError, "above 1"),
        (frame(1, 1, 6, [0, 1, 2, 3, 4, 5], [100] * 6), FrameError, "mass left over"),
    ]
    for data, error, words in cases:
        with pytest.raises(error, match=words) as caught:
            decode_draft_dists(data, k=1, vocab=6)
        assert "\n" not in str(caught.value)
    with pytest.raises(FrameError, match="bytes"):
        decode_draft_dists("text", k=1, vocab=6)  # type: ignore[arg-type]


def test_sparse_dists_validate_on_construction() -> None:
    ids = np.array([[0, 1]], np.int32)
    probs = np.array([[0.5, 0.25]], np.float32)
    rest = np.array([0.25], np.float32)
    dists = SparseDists(ids=ids, probs=probs, rest=rest, vocab=4)
    assert dists.prob(0, 3) == pytest.approx(0.125)
    with pytest.raises(ValueError, match="over 4 ids, not 5"):
        dists.dense(0, 5)
    with pytest.raises(IndexError):
        dists.prob(1, 0)
    with pytest.raises(FrameError, match="negative"):
        SparseDists(ids=ids, probs=np.array([[1.25, -0.5]], np.float32), rest=rest, vocab=4)
    with pytest.raises(FrameError, match="not finite"):
        SparseDists(ids=ids, probs=np.array([[np.inf, 0.0]], np.float32), rest=rest, vocab=4)
    with pytest.raises(FrameError, match="mass is not 1"):
        SparseDists(ids=ids, probs=probs, rest=np.array([0.5], np.float32), vocab=4)
    with pytest.raises(FrameError, match="int32"):
        SparseDists(ids=ids.astype(np.int64), probs=probs, rest=rest, vocab=4)
    with pytest.raises(FrameError, match="outside"):
        SparseDists(ids=np.array([[0, 4]], np.int32), probs=probs, rest=rest, vocab=4)
    assert not dists.ids.flags.writeable and ids.flags.writeable  # a read-only copy


def test_rows_compress_alone_as_they_do_together() -> None:
    """A device compresses each row as it drafts; the k-row message must decode to the same."""
    rng = np.random.default_rng(5)
    probs = softmax_rows(rng, 6, 3000, scale=0.5)
    probs[2, :40] = probs[2, 0]  # ties across the edge of the kept ids
    probs[2] /= probs[2].sum()
    together = decode_draft_dists(encode_draft_dists(probs, top=32), k=6, vocab=3000)
    for row in range(6):
        alone = decode_draft_dists(encode_draft_dists(probs[row][None], top=32), k=1, vocab=3000)
        assert np.array_equal(alone.dense(0), together.dense(row))
