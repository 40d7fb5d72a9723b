"""Tensor codec: Open Inference Protocol datatypes, little-endian row-major bytes.

A tensor travels as a *descriptor* (a small JSON object in the frame header)
plus a run of payload bytes. The descriptor says what the receiver will get
(``datatype``, ``shape``) and how the bytes were packed on the wire:

    {"name": "x", "datatype": "FP32", "shape": [1, 28, 28],
     "nbytes": 1234,              # bytes in the payload (after compression)
     "raw_nbytes": 1568,          # bytes before compression
     "wire": "FP16",              # optional reduced-precision transfer
     "scale": 0.01, "zero_point": 0,   # with wire == "INT8"
     "compression": "zstd"}       # optional

Invariants the decoder keeps, in this order, before it allocates anything:
the datatype is known; the shape is a list of at most ``max_rank``
non-negative ints whose product (zero dimensions read as one) is within
``max_tensor_bytes``; the decoded size is within ``max_tensor_bytes``;
``raw_nbytes`` equals elements x wire itemsize (``BYTES`` excepted, whose
elements are length-prefixed as in the protocol's binary extension, so
``raw_nbytes`` is at least 4 x elements; their decoded size counts one object
pointer per element besides the bytes); ``nbytes`` fits in what is left of the
payload. Decompression is bounded by ``raw_nbytes`` (and the zstd window by
``max(raw_nbytes, 8 MiB)``) and must produce exactly that many bytes. Nothing
is pickled.

Reduced precision is lossy, within these bounds: ``fp16`` keeps a relative
error of 2**-11 for magnitudes in FP16's normal range (magnitudes from 65520
up become inf, tiny ones lose precision or flush to zero; NaN and inf pass);
``int8`` keeps an absolute error of ``scale / 2`` (plus the rounding into the
restored datatype), where
``scale = (max(x, 0) - min(x, 0)) / 255`` over the finite values; it cannot
carry NaN (sent as 0) or inf (saturates to the range).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ._errors import LimitExceededError, TensorError
from ._limits import Limits

__all__ = [
    "DATATYPES",
    "ONNX_DATATYPES",
    "TransferOptions",
    "datatype_of",
    "decode_tensors",
    "encode_tensors",
    "numpy_dtype",
    "shape_compatible",
]

# Open Inference Protocol datatype -> numpy dtype (little-endian, explicit).
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
# ONNX element type strings (as ONNX Runtime reports them) -> datatype names.
ONNX_DATATYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
_FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
_BY_KIND_SIZE = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"}
_LEN = struct.Struct("<I")
_MAX_NAME = 256
_OBJECT_POINTER = np.dtype(object).itemsize  # what a BYTES element costs besides its bytes
_MIN_ZSTD_WINDOW = 8 * 1024 * 1024  # what the standard levels 1-19 use at most


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of an Open Inference Protocol datatype name."""
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        raise TensorError(
            f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def datatype_of(array: np.ndarray) -> str:
    """The Open Inference Protocol datatype name of a numpy array."""
    dt = array.dtype
    if dt.kind in "OSU":
        return "BYTES"
    name = _BY_KIND_SIZE.get((dt.kind, dt.itemsize))
    if name is None:
        raise TensorError(f"numpy dtype {dt} has no Open Inference Protocol datatype")
    return name


@dataclass(frozen=True, kw_only=True)
class TransferOptions:
    """How tensors are packed on the wire.

    ``precision="fp16"`` sends float tensors as FP16 and ``"int8"`` as INT8
    with a per-tensor scale and zero point; the receiver restores the original
    datatype. Other tensors always go exact. ``compression="zstd"`` applies to
    tensors of at least ``min_compress_bytes`` bytes and is kept only when it
    saves space.
    """

    compression: Literal["none", "zstd"] = "none"
    zstd_level: int = 3
    min_compress_bytes: int = 512
    precision: Literal["exact", "fp16", "int8"] = "exact"

    def __post_init__(self) -> None:
        if self.compression not in ("none", "zstd"):
            raise ValueError(f"compression must be 'none' or 'zstd', got {self.compression!r}")
        if self.precision not in ("exact", "fp16", "int8"):
            raise ValueError(f"precision must be 'exact', 'fp16' or 'int8', got {self.precision!r}")


def encode_tensors(
    tensors: Mapping[str, np.ndarray], options: TransferOptions | None = None
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Descriptors and payload chunks for ``tensors`` (payload order = descriptor order)."""
    options = options or TransferOptions()
    descriptors: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
            raise TensorError(
                f"tensor names must be strings of 1-{_MAX_NAME} characters, got {name!r:.80}"
            )
        array = np.asarray(value)
        datatype = datatype_of(array)
        desc: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if datatype == "BYTES":
            raw = _pack_bytes(array)
        elif datatype in _FLOAT_TYPES and options.precision != "exact":
            raw = _pack_reduced(array, options.precision, desc)
        else:
            raw = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
        desc["raw_nbytes"] = len(raw)
        if options.compression == "zstd" and len(raw) >= options.min_compress_bytes:
            packed = _zstd().ZstdCompressor(level=options.zstd_level).compress(raw)
            if len(packed) < len(raw):
                desc["compression"] = "zstd"
                raw = packed
        desc["nbytes"] = len(raw)
        descriptors.append(desc)
        chunks.append(raw)
    return descriptors, chunks


def decode_tensors(
    descriptors: object, payload: bytes | bytearray | memoryview, limits: Limits | None = None
) -> dict[str, np.ndarray]:
    """Rebuild tensors from descriptors and payload, checking every size first."""
    limits = limits or Limits()
    if not isinstance(descriptors, list):
        raise TensorError("'tensors' must be a list of descriptors")
    if len(descriptors) > limits.max_tensors:
        raise LimitExceededError(
            f"{len(descriptors)} tensors in one message; the limit is {limits.max_tensors}"
        )
    view = memoryview(payload)
    offset = 0
    total = 0
    out: dict[str, np.ndarray] = {}
    for desc in descriptors:
        name, datatype, shape, count = _check_descriptor(desc, limits)
        if name in out:
            raise TensorError(f"tensor {name!r} appears twice")
        raw_nbytes = _nonneg_int(desc.get("raw_nbytes"), name, "raw_nbytes")
        nbytes = _nonneg_int(desc.get("nbytes"), name, "nbytes")
        if datatype == "BYTES":
            decoded_bytes = raw_nbytes + count * _OBJECT_POINTER
        else:
            decoded_bytes = count * DATATYPES[datatype].itemsize
        if decoded_bytes > limits.max_tensor_bytes or raw_nbytes > limits.max_tensor_bytes:
            raise LimitExceededError(
                f"tensor {name!r} would take {max(decoded_bytes, raw_nbytes)} bytes; "
                f"the limit is {limits.max_tensor_bytes}"
            )
        total += decoded_bytes
        if total > limits.max_total_tensor_bytes:
            raise LimitExceededError(
                f"tensors would take more than {limits.max_total_tensor_bytes} bytes in all"
            )
        if datatype == "BYTES":
            if raw_nbytes < count * _LEN.size:
                raise TensorError(
                    f"tensor {name!r}: {raw_nbytes} bytes cannot hold {count} BYTES elements"
                )
        else:
            wire = _wire_datatype(desc, name, datatype)
            if raw_nbytes != count * DATATYPES[wire].itemsize:
                raise TensorError(
                    f"tensor {name!r}: raw_nbytes {raw_nbytes} does not hold {count} {wire} "
                    f"elements of shape {list(shape)}"
                )
        if nbytes > len(view) - offset:
            raise TensorError(
                f"tensor {name!r} declares {nbytes} payload bytes but only "
                f"{len(view) - offset} remain (truncated frame?)"
            )
        chunk = view[offset : offset + nbytes]
        offset += nbytes
        compression = desc.get("compression")
        if compression == "zstd":
            chunk = memoryview(_bounded_decompress(chunk, raw_nbytes, name))
        elif compression is not None:
            raise TensorError(f"tensor {name!r}: unknown compression {compression!r:.80}")
        elif nbytes != raw_nbytes:
            raise TensorError(f"tensor {name!r}: nbytes {nbytes} != raw_nbytes {raw_nbytes}")
        out[name] = _unpack(chunk, desc, name, datatype, shape, count)
    if offset != len(view):
        raise TensorError(f"{len(view) - offset} trailing payload bytes after the last tensor")
    return out


# -- helpers -------------------------------------------------------------------------------


def _zstd() -> Any:
    import zstandard  # imported on first use: most frames are not compressed

    return zstandard


def _nonneg_int(value: object, name: str, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TensorError(f"{name}.{what} must be a non-negative integer, got {value!r}")
    return value


def _check_descriptor(desc: object, limits: Limits) -> tuple[str, str, tuple[int, ...], int]:
    if not isinstance(desc, dict):
        raise TensorError("each tensor descriptor must be a JSON object")
    name = desc.get("name")
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise TensorError(
            f"tensor name must be a string of 1-{_MAX_NAME} characters, got {name!r:.80}"
        )
    datatype = desc.get("datatype")
    numpy_dtype(datatype if isinstance(datatype, str) else repr(datatype))
    raw_shape = desc.get("shape")
    if not isinstance(raw_shape, list):
        raise TensorError(f"tensor {name!r}: shape must be a list of ints")
    if len(raw_shape) > limits.max_rank:
        raise LimitExceededError(
            f"tensor {name!r} has rank {len(raw_shape)}; the limit is {limits.max_rank}"
        )
    shape = tuple(raw_shape)
    for d in shape:  # plain non-negative ints pass here; anything else gets the full check
        if type(d) is not int or d < 0:
            shape = tuple(_nonneg_int(d, name, f"shape[{i}]") for i, d in enumerate(shape))
            break
    count = math.prod(shape)
    # Every element takes at least one byte. Zero dimensions count as one so that
    # a shape like [0, 10**30] is refused here rather than by numpy's reshape.
    bound = math.prod(d or 1 for d in shape) if count == 0 else count
    if bound > limits.max_tensor_bytes:
        raise LimitExceededError(
            f"tensor {name!r} of shape {list(shape)!s:.80} is above the limit of "
            f"{limits.max_tensor_bytes} bytes"
        )
    return name, str(datatype), shape, count


def _bounded_decompress(chunk: memoryview, raw_nbytes: int, name: str) -> bytes:
    zstd = _zstd()
    try:
        # The window bound keeps a tiny hostile frame from making zstd allocate
        # its default maximum (128 MiB) before a byte is produced.
        decompressor = zstd.ZstdDecompressor(max_window_size=max(raw_nbytes, _MIN_ZSTD_WINDOW))
        reader = decompressor.stream_reader(chunk, read_across_frames=False)
        data = reader.read(raw_nbytes + 1) if raw_nbytes else reader.read(1)
    except zstd.ZstdError as e:
        raise TensorError(f"tensor {name!r}: corrupt zstd data ({e})") from e
    if len(data) != raw_nbytes:
        raise TensorError(
            f"tensor {name!r}: zstd data expands to "
            f"{'more than ' if len(data) > raw_nbytes else ''}{len(data)} bytes, "
            f"expected {raw_nbytes}"
        )
    return bytes(data)


def _pack_bytes(array: np.ndarray) -> bytes:
    parts: list[bytes] = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode()
        if not isinstance(item, bytes | bytearray | memoryview):
            raise TensorError(f"BYTES tensors hold bytes or str, got {type(item).__name__}")
        parts.append(_LEN.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def _unpack_bytes(chunk: memoryview, shape: tuple[int, ...], count: int, name: str) -> np.ndarray:
    if len(chunk) < count * _LEN.size:  # before the object array is allocated
        raise TensorError(f"tensor {name!r}: {len(chunk)} bytes cannot hold {count} elements")
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if len(chunk) - pos < _LEN.size:
            raise TensorError(f"tensor {name!r}: BYTES element {i} is truncated")
        (length,) = _LEN.unpack_from(chunk, pos)
        pos += _LEN.size
        if length > len(chunk) - pos:
            raise TensorError(f"tensor {name!r}: BYTES element {i} runs past the tensor")
        out[i] = bytes(chunk[pos : pos + length])
        pos += length
    if pos != len(chunk):
        raise TensorError(f"tensor {name!r}: {len(chunk) - pos} bytes after the last element")
    return out.reshape(shape)


def _pack_reduced(array: np.ndarray, precision: str, desc: dict[str, Any]) -> bytes:
    # float64 throughout: FP64 values beyond float32's range must not turn into inf.
    values = np.asarray(array, dtype=np.float64)
    if precision == "fp16":
        desc["wire"] = "FP16"
        with np.errstate(over="ignore", under="ignore"):  # documented: out of range -> inf
            return np.ascontiguousarray(values, dtype="<f2").tobytes()
    # Affine per-tensor INT8: the range [lo, hi] (which holds 0) maps onto [-128, 127].
    finite = values[np.isfinite(values)]
    lo = min(float(finite.min()), 0.0) if finite.size else 0.0
    hi = max(float(finite.max()), 0.0) if finite.size else 0.0
    scale = hi / 255.0 - lo / 255.0 or 1.0  # not (hi - lo) / 255: that overflows near 1e308
    zero_point = round(-128 - lo / scale)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.round(values / scale) + zero_point
    q = np.nan_to_num(q, nan=zero_point, posinf=127, neginf=-128)
    desc.update(wire="INT8", scale=scale, zero_point=zero_point)
    return np.clip(q, -128, 127).astype(np.int8).tobytes()


def _wire_datatype(desc: dict[str, Any], name: str, datatype: str) -> str:
    wire = desc.get("wire", datatype)
    if wire != datatype and (datatype not in _FLOAT_TYPES or wire not in ("FP16", "INT8")):
        raise TensorError(f"tensor {name!r}: cannot send {datatype} as {wire!r:.80}")
    return str(wire)


def _quantization(desc: dict[str, Any], name: str) -> tuple[float, int]:
    scale, zero_point = desc.get("scale"), desc.get("zero_point")
    try:
        scale = float(scale) if isinstance(scale, int | float) else math.nan
    except OverflowError:  # an int too large for a float
        scale = math.nan
    if isinstance(desc.get("scale"), bool) or not math.isfinite(scale) or scale <= 0:
        raise TensorError(f"tensor {name!r}: INT8 transfer needs a positive finite scale")
    if (
        not isinstance(zero_point, int)
        or isinstance(zero_point, bool)
        or not -128 <= zero_point <= 127
    ):
        raise TensorError(f"tensor {name!r}: INT8 transfer needs a zero_point in [-128, 127]")
    return scale, zero_point


def _unpack(
    chunk: memoryview,
    desc: dict[str, Any],
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    count: int,
) -> np.ndarray:
    if datatype == "BYTES":
        return _unpack_bytes(chunk, shape, count, name)
    wire = _wire_datatype(desc, name, datatype)
    wire_dtype = DATATYPES[wire]
    if len(chunk) != count * wire_dtype.itemsize:
        raise TensorError(
            f"tensor {name!r}: {len(chunk)} bytes do not hold {count} {wire} elements "
            f"of shape {list(shape)}"
        )
    if datatype == "BOOL":
        # Any byte but 0 is True: numpy must never hold a bool whose byte is not 0 or 1.
        return (np.frombuffer(chunk, dtype=np.uint8, count=count) != 0).reshape(shape)
    target = DATATYPES[datatype]
    if wire == datatype:
        # Copy (the result must be writable and not alias the frame) through a bytearray:
        # numpy's own copy releases the GIL for arrays this size, and taking it back costs
        # a thread switch wherever another thread is busy (the hub decodes on paho's
        # network thread while its batcher encodes replies), far more than the copy.
        return np.frombuffer(bytearray(chunk), dtype=target, count=count).reshape(shape)
    flat = np.frombuffer(chunk, dtype=wire_dtype, count=count)
    if wire == "INT8" and datatype != "INT8":
        scale, zero_point = _quantization(desc, name)
        with np.errstate(over="ignore"):
            restored = (flat.astype(np.float64) - zero_point) * scale
        # Rounding may carry the top code a little past the target's largest finite value.
        limit = float(np.finfo(target).max)
        return np.clip(restored, -limit, limit).astype(target).reshape(shape)
    return flat.astype(target).reshape(shape)  # FP16 on the wire: a new array


def shape_compatible(shape: Sequence[int], declared: Sequence[int | None]) -> bool:
    """Whether ``shape`` matches a declared shape where ``None`` or -1 is any size."""
    return len(shape) == len(declared) and all(
        d is None or d < 0 or d == s for s, d in zip(shape, declared, strict=True)
    )
