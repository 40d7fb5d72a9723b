"""The binary records that carry requests and replies through a ring (``_ring``).

Pure packing and unpacking, no I/O. Both ends are processes of one hub built
from the same code, so the format has no version: what is checked here is
what a bug or a crashed peer could get wrong (lengths, indices, dtypes).

A request (``REQUEST``)::

    u64 key   f64 deadline (monotonic s; NaN: none)   f64 arrival (monotonic s)
    u32 rows  u16 tensors  u16 flags
    tensors

A reply (``REPLY``)::

    u64 key   u8 error code index   u8 pad   u16 tensors   u32 message bytes
    f64 queue_ms   f64 compute_ms   u32 batch rows   u32 batch requests
    message (UTF-8, padded to 8)   tensors

A tensor::

    u16 index (into the model's inputs or outputs)   u8 datatype code   u8 rank
    u32 pad   u64 dims[rank]   u64 nbytes   bytes (padded to 8)

Numeric tensors are raw little-endian row-major bytes; ``BYTES`` tensors use
the Open Inference Protocol's length-prefixed layout through ``shared``'s
codec. ``CLOCK_MONOTONIC`` is one clock for every process of a machine, so a
deadline computed by an ingress process means the same in its executor.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import DATATYPES, ErrorCode, Limits, decode_tensors, encode_tensors

__all__ = [
    "REPLY",
    "REQUEST",
    "ReplyRecord",
    "RequestRecord",
    "read_reply",
    "read_request",
    "reply_size",
    "request_size",
    "write_reply",
    "write_request",
]

REQUEST = 1
REPLY = 2

_REQUEST = struct.Struct("<QddIHH")
_REPLY = struct.Struct("<QBxHIddII")
_TENSOR = struct.Struct("<HBB4x")
_U64 = struct.Struct("<Q")
_DATATYPE_NAMES = tuple(DATATYPES)
_CODES = {name: code for code, name in enumerate(_DATATYPE_NAMES)}
_DTYPES = tuple(DATATYPES.values())
_CODE_OF = {dtype: code for code, dtype in enumerate(_DTYPES)}  # numpy dtype -> code
_BYTES = _CODES["BYTES"]
_ERROR_CODES = tuple(ErrorCode)
_ERROR_INDEX = {code: i for i, code in enumerate(_ERROR_CODES)}
_UNBOUNDED = Limits(
    max_frame_bytes=2**62,
    max_tensor_bytes=2**62,
    max_total_tensor_bytes=2**62,
    max_tensors=2**16,
)

Tensors = Sequence[tuple[int, np.ndarray]]


@dataclass(frozen=True)
class RequestRecord:
    key: int
    deadline: float | None
    arrival: float
    rows: int
    tensors: list[tuple[int, np.ndarray]]


@dataclass(frozen=True)
class ReplyRecord:
    key: int
    error: ErrorCode
    message: str
    queue_ms: float
    compute_ms: float
    batch_rows: int
    batch_requests: int
    tensors: list[tuple[int, np.ndarray]]


def _align(n: int) -> int:
    return (n + 7) & ~7


def _raw(array: np.ndarray) -> bytes | np.ndarray:
    """What a tensor's bytes are: the array itself when contiguous numeric, else packed."""
    if array.dtype == object:
        _, chunks = encode_tensors({"t": array})
        return chunks[0]
    return np.ascontiguousarray(array)


def _tensors_size(raws: Sequence[tuple[int, np.ndarray, bytes | np.ndarray]]) -> int:
    size = 0
    for _, array, raw in raws:
        size += (
            _TENSOR.size
            + 8 * array.ndim
            + 8
            + _align(len(raw) if isinstance(raw, bytes) else raw.nbytes)
        )
    return size


def _prepare(tensors: Tensors) -> list[tuple[int, np.ndarray, bytes | np.ndarray]]:
    return [(index, array, _raw(array)) for index, array in tensors]


def request_size(tensors: Tensors) -> tuple[int, list[tuple[int, np.ndarray, Any]]]:
    """Bytes a request with ``tensors`` takes, and the prepared tensors to write."""
    prepared = _prepare(tensors)
    return _REQUEST.size + _tensors_size(prepared), prepared


def reply_size(message: str, tensors: Tensors) -> tuple[int, bytes, list[Any]]:
    """Bytes a reply takes, its encoded message, and the prepared tensors to write."""
    text = message.encode("utf-8", "replace")[:4000]
    prepared = _prepare(tensors)
    return _REPLY.size + _align(len(text)) + _tensors_size(prepared), text, prepared


def write_request(
    view: memoryview,
    key: int,
    deadline: float | None,
    arrival: float,
    rows: int,
    prepared: list[tuple[int, np.ndarray, Any]],
) -> None:
    _REQUEST.pack_into(
        view, 0, key, math.nan if deadline is None else deadline, arrival, rows, len(prepared), 0
    )
    _write_tensors(view, _REQUEST.size, prepared)


def write_reply(
    view: memoryview,
    key: int,
    error: ErrorCode,
    text: bytes,
    *,
    queue_ms: float = 0.0,
    compute_ms: float = 0.0,
    batch_rows: int = 0,
    batch_requests: int = 0,
    prepared: list[tuple[int, np.ndarray, Any]] = (),  # type: ignore[assignment]
) -> None:
    _REPLY.pack_into(
        view,
        0,
        key,
        _ERROR_INDEX[error],
        len(prepared),
        len(text),
        queue_ms,
        compute_ms,
        batch_rows,
        batch_requests,
    )
    offset = _REPLY.size
    view[offset : offset + len(text)] = text
    _write_tensors(view, offset + _align(len(text)), prepared)


def _write_tensors(
    view: memoryview, offset: int, prepared: list[tuple[int, np.ndarray, Any]]
) -> None:
    for index, array, raw in prepared:
        nbytes = len(raw) if isinstance(raw, bytes) else raw.nbytes
        rank = array.ndim
        _head(rank).pack_into(view, offset, index, _code(array), rank, *array.shape, nbytes)
        offset += _TENSOR.size + 8 * rank + 8
        if isinstance(raw, bytes):
            view[offset : offset + nbytes] = raw
        elif nbytes:
            view[offset : offset + nbytes] = raw.reshape(-1).view(np.uint8)
        offset += _align(nbytes)


@functools.cache
def _head(rank: int) -> struct.Struct:
    """A tensor's header with ``rank`` dims: index, code, rank, dims, byte count."""
    return struct.Struct(f"<HBB4x{rank}QQ")


@functools.cache
def _dims(rank: int) -> struct.Struct:
    return struct.Struct(f"<{rank}Q")


def _code(array: np.ndarray) -> int:
    code = _CODE_OF.get(array.dtype)
    if code is None:
        raise ValueError(f"no Open Inference Protocol datatype for {array.dtype}")
    return code


def read_request(view: memoryview, *, copy: bool = True) -> RequestRecord:
    key, deadline, arrival, rows, count, _flags = _REQUEST.unpack_from(view, 0)
    tensors = _read_tensors(view, _REQUEST.size, count, copy)
    return RequestRecord(key, None if math.isnan(deadline) else deadline, arrival, rows, tensors)


def read_reply(view: memoryview, *, copy: bool = True) -> ReplyRecord:
    fields = _REPLY.unpack_from(view, 0)
    key, error, count, text_len, queue_ms, compute_ms, batch_rows, batch_requests = fields
    offset = _REPLY.size
    if error >= len(_ERROR_CODES) or offset + text_len > len(view):
        raise ValueError(f"corrupt reply record (error {error}, message {text_len} bytes)")
    text = bytes(view[offset : offset + text_len]).decode("utf-8", "replace")
    tensors = _read_tensors(view, offset + _align(text_len), count, copy)
    return ReplyRecord(
        key, _ERROR_CODES[error], text, queue_ms, compute_ms, batch_rows, batch_requests, tensors
    )


def _read_tensors(
    view: memoryview, offset: int, count: int, copy: bool
) -> list[tuple[int, np.ndarray]]:
    out: list[tuple[int, np.ndarray]] = []
    for _ in range(count):
        index, code, rank = _TENSOR.unpack_from(view, offset)
        offset += _TENSOR.size
        if code >= len(_DTYPES):
            raise ValueError(f"corrupt record: datatype code {code}")
        shape = _dims(rank).unpack_from(view, offset)
        offset += 8 * rank
        (nbytes,) = _U64.unpack_from(view, offset)
        offset += 8
        if offset + nbytes > len(view):
            raise ValueError(f"corrupt record: tensor of {nbytes} bytes runs past the record")
        chunk = view[offset : offset + nbytes]
        offset += _align(nbytes)
        if code == _BYTES:
            descriptor = {
                "name": "t",
                "datatype": "BYTES",
                "shape": list(shape),
                "nbytes": nbytes,
                "raw_nbytes": nbytes,
            }
            array = decode_tensors([descriptor], chunk, _UNBOUNDED)["t"]
        else:
            dtype = _DTYPES[code]
            if nbytes != math.prod(shape) * dtype.itemsize:
                raise ValueError(f"corrupt record: {nbytes} bytes for shape {list(shape)}")
            array = np.frombuffer(chunk, dtype=dtype).reshape(shape)
            if copy:
                array = array.copy()
        out.append((index, array))
    return out
