"""Model blob codec: content digests, zstd compression and zstd deltas.

The publisher (``model_cdn``) and the device (``edge_agent.updater``) must
agree byte for byte, so both use these functions:

- ``digest(data)``: ``"sha256:<hex>"`` of the stored bytes (what a blob is named by).
- ``compress_blob`` / ``decompress_blob``: one zstd frame. Decompression is
  bounded by the manifest's ``raw_size`` and must produce exactly that many
  bytes (a bomb or a short blob is a ``ManifestError``).
- ``make_delta`` / ``apply_delta``: the new raw model compressed with the old
  raw model as a raw-content dictionary (the ``--patch-from`` idea), so what a
  device downloads is what changed.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ._errors import ManifestError

__all__ = ["apply_delta", "compress_blob", "decompress_blob", "digest", "make_delta"]

_LEVEL = 19


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


def make_delta(old_raw: bytes, new_raw: bytes, level: int = _LEVEL) -> bytes:
    zstd = _zstd()
    params = zstd.ZstdCompressionParameters.from_level(
        level,
        source_size=len(new_raw),
        dict_size=len(old_raw),
        window_log=max(10, min(31, (len(old_raw) + len(new_raw)).bit_length())),
    )
    compressor = zstd.ZstdCompressor(dict_data=_dictionary(old_raw), compression_params=params)
    return bytes(compressor.compress(new_raw))


def apply_delta(old_raw: bytes, delta: bytes, raw_size: int) -> bytes:
    zstd = _zstd()
    window = 1 << max(10, min(31, (len(old_raw) + raw_size).bit_length()))
    decompressor = zstd.ZstdDecompressor(dict_data=_dictionary(old_raw), max_window_size=window)
    return _bounded(decompressor, delta, raw_size, "delta")
