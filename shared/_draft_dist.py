"""The draft model's next-token distributions, compressed for the link (speculative decoding).

A device drafting ``k`` tokens sends, beside the token ids, the distribution
``q_i`` each was drawn from, so that the hub can run the rejection rule that
keeps the output distributed as its own model's. A full row is ``vocab``
floats; ``encode_draft_dists`` keeps the ``top`` most probable ids of each row
and their probabilities quantized to uint16 steps of 1/65535, and the mass left
over (``rest``) is taken as spread uniformly over the other ``vocab - top`` ids.

Layout, little-endian::

    u8  version (1)   u16 k   u16 top
    ids    [k, top]   u16 when vocab <= 65536, else u32 (vocab is known to both ends)
    probs  [k, top]   u16, probability * 65535, rounded; each row sums to <= 65535

so k=4, top=32 is 5 + 4 * 32 * (2 + 2) = 517 bytes for a vocabulary up to 65536.
``rest`` is not sent: it is 1 minus the row's decoded mass.

Exactness needs one thing from the device: it must draw its draft tokens from
the *decoded* distribution (``SparseDists.sample``), the same ``q`` the hub
will test against; drawn from the uncompressed row instead, the output is off
p by at most twice the L1 distance between the two. Rows are compressed
independently, so a device can compress each row as it drafts
(``encode_draft_dists(row[None])``, decode, ``sample``) and send all ``k`` at
the end: that message decodes to the very rows it drew from.

``decode_draft_dists`` checks every size against ``len(data)`` before slicing
and every value (ids in range and unique per row, a row's mass <= 1), raising
``FrameError``, ``LimitExceededError`` or ``UnsupportedVersionError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ._errors import FrameError, LimitExceededError, TensorError, UnsupportedVersionError

__all__ = [
    "DRAFT_DISTS_VERSION",
    "MAX_DRAFT_ROWS",
    "MAX_DRAFT_TOP",
    "SparseDists",
    "decode_draft_dists",
    "encode_draft_dists",
]

DRAFT_DISTS_VERSION = 1
MAX_DRAFT_ROWS = 256  # draft tokens in one round
MAX_DRAFT_TOP = 4096  # ids kept per row
_HEADER = struct.Struct("<BHH")
_SCALE = 65535
_MASS_EPS = 1e-4  # float32 sums of a valid row


def _id_dtype(vocab: int) -> np.dtype[np.unsignedinteger]:
    return np.dtype("<u2") if vocab <= 65536 else np.dtype("<u4")


@dataclass(frozen=True, eq=False)
class SparseDists:
    """``k`` distributions over ``vocab`` ids: ``top`` kept ids each, the ``rest`` spread evenly.

        ``ids`` int32 [k, top] (unique per row, in 0..vocab-1), ``probs`` float32
        [k, top] (finite, >= 0), ``rest`` float32 [k] (>= 0; each row's kept mass
        plus rest is 1 within 1e-4). Validated on construction (``FrameError``), kept
    as read-only copies.
    """

    ids: np.ndarray
    probs: np.ndarray
    rest: np.ndarray
    vocab: int

    def __post_init__(self) -> None:
        ids, probs, rest, vocab = self.ids, self.probs, self.rest, self.vocab
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise FrameError(f"draft distributions: vocab must be an integer >= 1, got {vocab!r}")
        if not (isinstance(ids, np.ndarray) and ids.dtype == np.int32 and ids.ndim == 2):
            raise FrameError("draft distributions: ids must be an int32 array [k, top]")
        k, top = ids.shape
        if not (isinstance(probs, np.ndarray) and probs.dtype == np.float32):
            raise FrameError("draft distributions: probs must be a float32 array [k, top]")
        if probs.shape != (k, top):
            raise FrameError(f"draft distributions: probs are {probs.shape}, ids {(k, top)}")
        if not (isinstance(rest, np.ndarray) and rest.dtype == np.float32 and rest.shape == (k,)):
            raise FrameError(f"draft distributions: rest must be a float32 array [{k}]")
        if top < 1 or top > vocab:
            raise FrameError(f"draft distributions: {top} ids kept of a vocabulary of {vocab}")
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise FrameError(f"draft distributions: an id outside 0..{vocab - 1}")
        if k and np.any(np.diff(np.sort(ids, axis=1), axis=1) == 0):
            raise FrameError("draft distributions: an id kept twice in one row")
        if not (np.all(np.isfinite(probs)) and np.all(np.isfinite(rest))):
            raise FrameError("draft distributions: a probability that is not finite")
        if np.any(probs < 0) or np.any(rest < 0):
            raise FrameError("draft distributions: a negative probability")
        mass = probs.astype(np.float64).sum(axis=1) + rest
        if np.any(np.abs(mass - 1.0) > _MASS_EPS):
            raise FrameError("draft distributions: a row whose mass is not 1")
        if top == vocab and np.any(rest > _MASS_EPS):
            raise FrameError("draft distributions: mass left over with every id kept")
        for name, array in (("ids", ids), ("probs", probs), ("rest", rest)):
            array = array.copy()
            array.setflags(write=False)
            object.__setattr__(self, name, array)

    @property
    def k(self) -> int:
        return int(self.ids.shape[0])

    @property
    def top(self) -> int:
        return int(self.ids.shape[1])

    def _check_row(self, row: int) -> None:
        if isinstance(row, bool) or not isinstance(row, int | np.integer) or not 0 <= row < self.k:
            raise IndexError(f"row {row!r} outside 0..{self.k - 1}")

    def prob(self, row: int, token: int) -> float:
        """q_row(token): its kept probability, else an even share of ``rest``."""
        self._check_row(row)
        if not 0 <= token < self.vocab:
            raise IndexError(f"token {token!r} outside 0..{self.vocab - 1}")
        hit = np.flatnonzero(self.ids[row] == token)
        if hit.size:
            return float(self.probs[row, hit[0]])
        others = self.vocab - self.top
        return float(self.rest[row]) / others if others else 0.0

    def dense(self, row: int, vocab: int | None = None) -> np.ndarray:
        """Row ``row`` as float64 [vocab] (``vocab``, if given, must be this one's)."""
        self._check_row(row)
        if vocab is not None and vocab != self.vocab:
            raise ValueError(f"these distributions are over {self.vocab} ids, not {vocab}")
        others = self.vocab - self.top
        out = np.full(self.vocab, float(self.rest[row]) / others if others else 0.0)
        out[self.ids[row]] = self.probs[row]
        return out

    def sample(self, row: int, rng: np.random.Generator) -> int:
        """Draw a token from row ``row``: what the device must draft from for exactness."""
        weights = self.dense(row)
        return int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), "right"))


def _quantize(kept: np.ndarray) -> np.ndarray:
    """Steps of 1/65535 per kept probability whose row sum is the row's kept mass, rounded.

    Largest remainder: each row's steps sum to ``rint(mass * 65535)`` exactly, so
    the mass left over (``rest``) is right to one step and is exactly 0 when every
    id is kept.
    """
    scaled = kept * _SCALE
    steps = np.floor(scaled).astype(np.int64)
    targets = np.minimum(np.rint(kept.sum(axis=1) * _SCALE).astype(np.int64), _SCALE)
    for r in range(kept.shape[0]):
        short = int(targets[r] - steps[r].sum())
        if short > 0:
            steps[r, np.argsort(steps[r] - scaled[r], kind="stable")[:short]] += 1
    return steps


def encode_draft_dists(probs: np.ndarray, *, top: int = 32) -> bytes:
    """``probs`` float [k, vocab], each row a distribution, to the compact form above.

    Rows are normalized first (float32 sums drift); ``top`` is capped at vocab.
    ``TensorError`` for a shape, a non-finite or negative value or an all-zero row.
    """
    if not isinstance(probs, np.ndarray) or probs.ndim != 2 or probs.dtype.kind != "f":
        raise TensorError("draft distributions: probs must be a float array [k, vocab]")
    k, vocab = probs.shape
    if not 1 <= k <= MAX_DRAFT_ROWS or vocab < 1:
        raise TensorError(f"draft distributions: {k} rows (1..{MAX_DRAFT_ROWS}) of {vocab} ids")
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_DRAFT_TOP:
        raise TensorError(f"draft distributions: top must be in 1..{MAX_DRAFT_TOP}, got {top!r}")
    rows = probs.astype(np.float64)
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise TensorError("draft distributions: probabilities must be finite and >= 0")
    totals = rows.sum(axis=1, keepdims=True)
    if np.any(totals <= 0):
        raise TensorError("draft distributions: a row with no mass")
    rows /= totals
    top = min(top, vocab)
    if top < vocab:  # the top ids without sorting the whole row (ties at the edge: any)
        ids = np.argpartition(-rows, top - 1, axis=1)[:, :top]
    else:
        ids = np.broadcast_to(np.arange(vocab), (k, vocab))
    kept = np.take_along_axis(rows, ids, axis=1)
    order = np.argsort(-kept, axis=1, kind="stable")  # most probable first
    ids, kept = np.take_along_axis(ids, order, axis=1), np.take_along_axis(kept, order, axis=1)
    quantized = _quantize(kept)
    header = _HEADER.pack(DRAFT_DISTS_VERSION, k, top)
    return header + ids.astype(_id_dtype(vocab)).tobytes() + quantized.astype("<u2").tobytes()


def decode_draft_dists(data: bytes, *, k: int, vocab: int) -> SparseDists:
    """Bytes from ``encode_draft_dists`` for ``k`` drafts over ``vocab`` ids, validated."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FrameError("draft distributions: expected bytes")
    view = memoryview(data).cast("B")
    if len(view) < _HEADER.size:
        raise FrameError(f"draft distributions: {len(view)} bytes, shorter than the header")
    version, declared_k, top = _HEADER.unpack_from(view)
    if version != DRAFT_DISTS_VERSION:
        raise UnsupportedVersionError(f"draft distributions: version {version} is not 1")
    if declared_k > MAX_DRAFT_ROWS or top > MAX_DRAFT_TOP:
        raise LimitExceededError(
            f"draft distributions: {declared_k} rows of {top} ids, above "
            f"{MAX_DRAFT_ROWS} rows of {MAX_DRAFT_TOP}"
        )
    if declared_k != k:
        raise FrameError(f"draft distributions: {declared_k} rows for {k} draft tokens")
    if not 1 <= top <= vocab:
        raise FrameError(f"draft distributions: {top} ids kept of a vocabulary of {vocab}")
    id_dtype = _id_dtype(vocab)
    id_bytes = k * top * id_dtype.itemsize
    expected = _HEADER.size + id_bytes + k * top * 2
    if len(view) != expected:
        raise FrameError(f"draft distributions: {len(view)} bytes, expected {expected}")
    body = view[_HEADER.size :]
    ids = np.frombuffer(body[:id_bytes], dtype=id_dtype).reshape(k, top)
    steps = np.frombuffer(body[id_bytes:], dtype="<u2").reshape(k, top).astype(np.int64)
    if ids.size and int(ids.max()) >= vocab:
        raise FrameError(f"draft distributions: an id outside 0..{vocab - 1}")
    if np.any(steps.sum(axis=1) > _SCALE):
        raise FrameError("draft distributions: a row whose mass is above 1")
    probs = (steps / _SCALE).astype(np.float32)
    rest = (1.0 - steps.sum(axis=1) / _SCALE).astype(np.float32)
    return SparseDists(ids=ids.astype(np.int32), probs=probs, rest=rest, vocab=vocab)
