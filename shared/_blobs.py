"""Model blob codec: content digests, zstd compression and zstd deltas.

The publisher (``model_cdn``) and the device (``edge_agent.updater``) must
agree byte for byte, so both use these functions:

- ``digest(data)``: ``"sha256:<hex>"`` of the stored bytes (what a blob is named by).
- ``compress_blob`` / ``decompress_blob``: one zstd frame. Decompression is
  bounded by the manifest's ``raw_size`` and must produce exactly that many
  bytes (a bomb or a short blob is a ``ManifestError``).
- ``make_delta`` / ``apply_delta``: what rebuilds the new raw model from the
  old one, in one of the :data:`DELTA_METHODS` (the manifest's
  ``deltas[].compression``):

  ``"zstd-patch"``
      the new raw model compressed with the old raw model as a raw-content
      dictionary (the ``--patch-from`` idea): cheap when whole runs of bytes
      recur, as after a change to the graph.
  ``"zstd-bytediff"``
      one zstd frame of ``diff``, where, with ``N = len(new)`` and ``base``
      the old raw model cut to ``N`` bytes or padded with zero bytes to
      ``N``, ``diff[i] = (new[i] - base[i]) mod 256`` for ``0 <= i < N``;
      applying it is ``new[i] = (diff[i] + base[i]) mod 256``. Cheap when
      the two files line up byte for byte and many bytes move a little, as
      after a fine-tune of an INT8 model (weights step by one or two: the
      diff is mostly 0x00, 0x01 and 0xff).

  Either way applying a delta allocates no more than the declared
  ``raw_size`` (plus the old model the caller holds) and must produce exactly
  that many bytes; the caller checks the result's digest.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ._errors import ManifestError

__all__ = [
    "DELTA_METHODS",
    "apply_delta",
    "compress_blob",
    "decompress_blob",
    "digest",
    "make_delta",
]

_LEVEL = 19
DELTA_METHODS = ("zstd-patch", "zstd-bytediff")


def _zstd() -> Any:
    import zstandard

    return zstandard


def digest(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def compress_blob(raw: bytes, level: int = _LEVEL) -> bytes:
    return bytes(_zstd().ZstdCompressor(level=level).compress(raw))


def _bounded(decompressor: Any, data: bytes, raw_size: int, what: str) -> bytes:
    zstd = _zstd()
    try:
        reader = decompressor.stream_reader(data, read_across_frames=False)
        out = reader.read(raw_size + 1)
    except zstd.ZstdError as e:
        raise ManifestError(f"{what} is not valid zstd data: {e}") from e
    if len(out) != raw_size:
        raise ManifestError(
            f"{what} expands to {'more than ' if len(out) > raw_size else ''}{len(out)} bytes; "
            f"the manifest says {raw_size}"
        )
    return bytes(out)


def decompress_blob(data: bytes, raw_size: int) -> bytes:
    return _bounded(_zstd().ZstdDecompressor(), data, raw_size, "blob")


def _dictionary(old_raw: bytes) -> Any:
    zstd = _zstd()
    return zstd.ZstdCompressionDict(old_raw, dict_type=zstd.DICT_TYPE_RAWCONTENT)


def _method(method: str) -> str:
    if method not in DELTA_METHODS:
        known = ", ".join(DELTA_METHODS)
        raise ManifestError(f"unknown delta method {method!r:.40}; known: {known}")
    return method


def _base(old_raw: bytes, size: int) -> np.ndarray:
    """The old model as ``size`` unsigned bytes: cut, or padded with zero bytes."""
    old = np.frombuffer(old_raw, dtype=np.uint8, count=min(len(old_raw), size))
    if len(old) == size:
        return old
    padded = np.zeros(size, dtype=np.uint8)
    padded[: len(old)] = old
    return padded


def make_delta(
    old_raw: bytes, new_raw: bytes, level: int = _LEVEL, *, method: str = "zstd-patch"
) -> bytes:
    """The delta that rebuilds ``new_raw`` from ``old_raw`` (see the module doc for ``method``)."""
    if _method(method) == "zstd-bytediff":
        new = np.frombuffer(new_raw, dtype=np.uint8)
        return compress_blob((new - _base(old_raw, len(new))).tobytes(), level)  # wraps mod 256
    zstd = _zstd()
    params = zstd.ZstdCompressionParameters.from_level(
        level,
        source_size=len(new_raw),
        dict_size=len(old_raw),
        window_log=max(10, min(31, (len(old_raw) + len(new_raw)).bit_length())),
    )
    compressor = zstd.ZstdCompressor(dict_data=_dictionary(old_raw), compression_params=params)
    return bytes(compressor.compress(new_raw))


def apply_delta(
    old_raw: bytes, delta: bytes, raw_size: int, *, method: str = "zstd-patch"
) -> bytes:
    """The ``raw_size`` bytes ``delta`` rebuilds from ``old_raw``; ``ManifestError`` if it
    is not valid, or expands to more or fewer bytes."""
    if _method(method) == "zstd-bytediff":
        diff = _bounded(_zstd().ZstdDecompressor(), delta, raw_size, "delta")
        return (np.frombuffer(diff, np.uint8) + _base(old_raw, raw_size)).tobytes()  # mod 256
    zstd = _zstd()
    window = 1 << max(10, min(31, (len(old_raw) + raw_size).bit_length()))
    decompressor = zstd.ZstdDecompressor(dict_data=_dictionary(old_raw), max_window_size=window)
    return _bounded(decompressor, delta, raw_size, "delta")
