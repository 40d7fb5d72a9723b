"""The tensor codec: round trips of every datatype and transfer option, and hostile descriptors."""

from __future__ import annotations

import dataclasses
import math
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shared import (
    DATATYPES,
    LimitExceededError,
    Limits,
    ProtocolError,
    TensorError,
    TransferOptions,
    datatype_of,
    decode_tensors,
    encode_tensors,
    numpy_dtype,
    shape_compatible,
)

FLOAT_TYPES = ("FP16", "FP32", "FP64")
NUMERIC_TYPES = tuple(name for name in DATATYPES if name != "BYTES")
ALL_OPTIONS = [
    TransferOptions(compression=compression, precision=precision, min_compress_bytes=0)
    for compression in ("none", "zstd")
    for precision in ("exact", "fp16", "int8")
]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
MiB = 1024 * 1024
# Big arrays and byte strings are the point here; a slow CI runner must not fail on them.
SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]


# -- strategies (the envelope tests use them too) -----------------------------------------


@st.composite
def bytes_arrays(draw: st.DrawFn, shape: tuple[int, ...] | None = None) -> np.ndarray:
    shape = draw(SHAPES) if shape is None else shape
    count = math.prod(shape)
    items = draw(st.lists(st.binary(max_size=12), min_size=count, max_size=count))
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(shape)


def arrays_of(datatype: str, elements: st.SearchStrategy[Any] | None = None) -> Any:
    """Arrays of one Open Inference Protocol datatype; BYTES holds bytes, empty ones too."""
    if datatype == "BYTES":
        return bytes_arrays()
    return hnp.arrays(DATATYPES[datatype], SHAPES, elements=elements)


any_array = st.sampled_from(list(DATATYPES)).flatmap(arrays_of)


def tensor_maps(max_tensors: int = 4) -> st.SearchStrategy[dict[str, np.ndarray]]:
    names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
    return st.dictionaries(names, any_array, max_size=max_tensors)


def assert_same_tensor(got: np.ndarray, sent: np.ndarray) -> None:
    """Bit-exact equality (NaN payloads included) for the datatype ``sent`` travels as."""
    assert got.shape == sent.shape
    if datatype_of(sent) == "BYTES":
        assert got.dtype == object
        assert got.reshape(-1).tolist() == [bytes(x) for x in sent.reshape(-1)]
    else:
        assert got.dtype == DATATYPES[datatype_of(sent)]
        assert got.tobytes() == np.ascontiguousarray(sent, dtype=got.dtype).tobytes()
        assert got.flags.owndata or got.base is not None  # not a view of the frame
        assert got.flags.writeable


def round_trip(
    tensors: dict[str, np.ndarray], options: TransferOptions | None = None
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    descriptors, chunks = encode_tensors(tensors, options)
    return descriptors, decode_tensors(descriptors, b"".join(chunks))


@contextmanager
def peak_traced_bytes() -> Iterator[Callable[[], int]]:
    """The peak of Python and numpy allocations inside the block, readable after it."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield lambda: peak[0]
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def descriptor(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "x",
        "datatype": "FP32",
        "shape": [1],
        "raw_nbytes": 4,
        "nbytes": 4,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def int8_descriptor(**fields: Any) -> dict[str, Any]:
    return descriptor(wire="INT8", raw_nbytes=1, nbytes=1, **fields)


# -- exact round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("compression", ["none", "zstd"])
@settings(max_examples=25, deadline=None, suppress_health_check=SLOW_DATA)
@given(data=st.data())
def test_exact_round_trip_of_every_datatype(
    datatype: str, compression: str, data: st.DataObject
) -> None:
    array = data.draw(arrays_of(datatype))
    options = TransferOptions(compression=compression, min_compress_bytes=0)  # type: ignore[arg-type]
    descriptors, out = round_trip({"t": array}, options)
    assert descriptors[0]["datatype"] == datatype
    assert "wire" not in descriptors[0]
    assert_same_tensor(out["t"], array)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_DATA)
@given(tensors=tensor_maps(), options=st.sampled_from(ALL_OPTIONS))
def test_non_float_tensors_are_exact_under_every_option(
    tensors: dict[str, np.ndarray], options: TransferOptions
) -> None:
    _, out = round_trip(tensors, options)
    assert list(out) == list(tensors)
    for name, array in tensors.items():
        if datatype_of(array) not in FLOAT_TYPES:
            assert_same_tensor(out[name], array)
        else:
            assert out[name].dtype == array.dtype.newbyteorder("<")
            assert out[name].shape == array.shape


def test_nan_inf_and_negative_zero_survive_exact_transfer() -> None:
    for datatype in FLOAT_TYPES:
        info = np.finfo(DATATYPES[datatype])
        special = [np.nan, np.inf, -np.inf, -0.0, 0.0, info.smallest_subnormal, info.max]
        array = np.array(special, dtype=DATATYPES[datatype])
        array = np.append(array, array.view(f"u{info.bits // 8}")[:1].view(array.dtype))
        for compression in ("none", "zstd"):
            opts = TransferOptions(compression=compression, min_compress_bytes=0)
            _, out = round_trip({"t": array}, opts)
            assert_same_tensor(out["t"], array)


def test_bytes_tensor_with_empty_elements_and_zero_size_dims() -> None:
    tensors = {
        "empty_items": np.array([b"", b"a", b"", b"\x00\xff"], dtype=object),
        "zero_dim": np.empty((0, 3), dtype=object),
        "zero_rank": np.array(b"scalar", dtype=object),
        "strings": np.array(["héllo", ""]),  # str goes as UTF-8 and comes back as bytes
    }
    _, out = round_trip(tensors)
    assert out["empty_items"].tolist() == [b"", b"a", b"", b"\x00\xff"]
    assert out["zero_dim"].shape == (0, 3)
    assert out["zero_rank"].shape == ()
    assert out["zero_rank"].item() == b"scalar"
    assert out["strings"].tolist() == ["héllo".encode(), b""]


def test_zero_size_tensor_of_every_datatype_and_option() -> None:
    for datatype in DATATYPES:
        for options in ALL_OPTIONS:
            array = np.empty((2, 0, 5), dtype=DATATYPES[datatype])
            _, out = round_trip({"t": array}, options)
            assert out["t"].shape == (2, 0, 5)
            assert out["t"].dtype == DATATYPES[datatype]


def test_big_endian_and_non_contiguous_inputs_go_little_endian_row_major() -> None:
    array = np.arange(12, dtype=">f4").reshape(3, 4).T
    descriptors, chunks = encode_tensors({"t": array})
    assert chunks[0] == np.ascontiguousarray(array, dtype="<f4").tobytes()
    assert descriptors[0]["shape"] == [4, 3]
    _, out = round_trip({"t": array})
    np.testing.assert_array_equal(out["t"], array)


def test_large_compressible_tensor_comes_back_whole() -> None:
    # zstd's stream reader must return every byte asked for, not one buffer's worth.
    array = np.tile(np.arange(256, dtype=np.uint8), 24 * 1024 * 4)  # 24 MiB
    descriptors, out = round_trip({"t": array}, TransferOptions(compression="zstd"))
    assert descriptors[0]["compression"] == "zstd"
    assert descriptors[0]["nbytes"] < descriptors[0]["raw_nbytes"] == array.nbytes
    assert_same_tensor(out["t"], array)


def test_incompressible_tensor_is_sent_plain() -> None:
    array = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    descriptors, out = round_trip({"t": array}, TransferOptions(compression="zstd"))
    assert "compression" not in descriptors[0]
    assert_same_tensor(out["t"], array)


def test_small_tensor_is_not_compressed() -> None:
    descriptors, _ = round_trip({"t": np.zeros(10, np.uint8)}, TransferOptions(compression="zstd"))
    assert "compression" not in descriptors[0]


def test_stream_compressed_payload_from_another_encoder_decodes() -> None:
    # A peer that streams (no content size, a 2 MiB window) must still be understood.
    raw = np.arange(1000, dtype="<i4").tobytes()
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    packed = compressor.compress(raw) + compressor.flush()
    desc = descriptor(
        datatype="INT32", shape=[1000], raw_nbytes=len(raw), nbytes=len(packed), compression="zstd"
    )
    out = decode_tensors([desc], packed)
    np.testing.assert_array_equal(out["x"], np.arange(1000))


# -- reduced precision ----------------------------------------------------------------------

FP16_RANGE = st.floats(-65504, 65504, width=32)
FINITE_ELEMENTS = {
    "FP16": st.floats(allow_nan=False, allow_infinity=False, width=16),
    "FP32": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "FP64": st.floats(allow_nan=False, allow_infinity=False, width=64),
}


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW_DATA)
@given(
    datatype=st.sampled_from(FLOAT_TYPES),
    data=st.data(),
    compression=st.sampled_from(["none", "zstd"]),
)
def test_fp16_transfer_keeps_dtype_shape_and_relative_error(
    datatype: str, data: st.DataObject, compression: str
) -> None:
    array = data.draw(hnp.arrays(DATATYPES[datatype], SHAPES, elements=FP16_RANGE))
    options = TransferOptions(precision="fp16", compression=compression, min_compress_bytes=0)  # type: ignore[arg-type]
    descriptors, out = round_trip({"t": array}, options)
    assert descriptors[0]["wire"] == "FP16"
    assert descriptors[0]["raw_nbytes"] == array.size * 2
    restored = out["t"]
    assert restored.dtype == DATATYPES[datatype]
    assert restored.shape == array.shape
    sent = array.astype(np.float64)
    # 2**-11 relative in FP16's normal range; half the subnormal step below it.
    bound = np.maximum(np.abs(sent) * 2.0**-11, 2.0**-25)
    assert np.all(np.abs(restored.astype(np.float64) - sent) <= bound)


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW_DATA)
@given(
    datatype=st.sampled_from(FLOAT_TYPES),
    data=st.data(),
    compression=st.sampled_from(["none", "zstd"]),
)
def test_int8_transfer_keeps_dtype_shape_and_half_a_step(
    datatype: str, data: st.DataObject, compression: str
) -> None:
    elements = FINITE_ELEMENTS[datatype]
    array = data.draw(hnp.arrays(DATATYPES[datatype], SHAPES, elements=elements))
    options = TransferOptions(precision="int8", compression=compression, min_compress_bytes=0)  # type: ignore[arg-type]
    descriptors, out = round_trip({"t": array}, options)
    desc = descriptors[0]
    assert desc["wire"] == "INT8"
    assert desc["raw_nbytes"] == array.size
    assert -128 <= desc["zero_point"] <= 127
    restored = out["t"]
    assert restored.dtype == DATATYPES[datatype]
    assert restored.shape == array.shape
    assert np.all(np.isfinite(restored))
    target = np.finfo(DATATYPES[datatype])
    sent = array.astype(np.float64)
    # scale / 2, plus the rounding of the restored value into the target datatype.
    bound = desc["scale"] / 2 * (1 + 1e-9) + np.abs(sent) * target.eps + target.smallest_subnormal
    assert np.all(np.abs(restored.astype(np.float64) - sent) <= bound)


def test_int8_scale_covers_the_range_including_zero() -> None:
    array = np.array([2.0, 4.0, 6.0], dtype=np.float32)
    descriptors, out = round_trip({"t": array}, TransferOptions(precision="int8"))
    assert descriptors[0]["scale"] == pytest.approx(6.0 / 255)
    np.testing.assert_allclose(out["t"], array, atol=descriptors[0]["scale"] / 2 + 1e-6)


def test_int8_transfer_of_extreme_fp64_values_stays_finite() -> None:
    # (hi - lo) / 255 would overflow to inf and make the descriptor unsendable.
    array = np.array([-1.7e308, 0.0, 1.7e308], dtype=np.float64)
    descriptors, out = round_trip({"t": array}, TransferOptions(precision="int8"))
    assert math.isfinite(descriptors[0]["scale"])
    np.testing.assert_allclose(out["t"], array, rtol=0, atol=descriptors[0]["scale"] / 2 * 1.001)


def test_int8_transfer_of_fp64_values_beyond_float32_range() -> None:
    array = np.array([-1e300, 5e299, 1e300], dtype=np.float64)
    descriptors, out = round_trip({"t": array}, TransferOptions(precision="int8"))
    np.testing.assert_allclose(out["t"], array, rtol=0, atol=descriptors[0]["scale"] / 2 * 1.001)


def test_int8_transfer_maps_nan_to_zero_and_saturates_inf() -> None:
    array = np.array([np.nan, np.inf, -np.inf, -1.0, 1.0], dtype=np.float32)
    _, out = round_trip({"t": array}, TransferOptions(precision="int8"))
    restored = out["t"]
    assert np.all(np.isfinite(restored))
    step = 2.0 / 255
    np.testing.assert_allclose(restored, [0.0, 1.0, -1.0, -1.0, 1.0], atol=step / 2 + 1e-6)


def test_int8_transfer_of_fp16_at_its_largest_value_stays_finite() -> None:
    # The top code can land a little past 65504; it must not become inf.
    array = np.array([-3.0, 65504.0], dtype=np.float16)
    _, out = round_trip({"t": array}, TransferOptions(precision="int8"))
    assert np.all(np.isfinite(out["t"]))


def test_fp16_transfer_passes_nan_inf_and_overflows_to_inf_without_warning() -> None:
    array = np.array([np.nan, np.inf, -np.inf, 1e6, -1e6, 1e-30], dtype=np.float64)
    _, out = round_trip({"t": array}, TransferOptions(precision="fp16"))
    restored = out["t"]
    assert np.isnan(restored[0])
    assert restored[1:5].tolist() == [np.inf, -np.inf, np.inf, -np.inf]
    assert restored[5] == 0.0


def test_reduced_precision_leaves_fp16_exact_when_sent_as_fp16() -> None:
    array = np.array([0.1, 1000.5, -3.25], dtype=np.float16)
    _, out = round_trip({"t": array}, TransferOptions(precision="fp16"))
    assert_same_tensor(out["t"], array)


# -- hostile descriptors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("desc", "payload", "error"),
    [
        (descriptor(datatype="FP128"), b"\0" * 4, TensorError),
        (descriptor(datatype=None), b"\0" * 4, TensorError),
        (descriptor(datatype=["FP32"]), b"\0" * 4, TensorError),
        (descriptor(name=""), b"\0" * 4, TensorError),
        (descriptor(name=7), b"\0" * 4, TensorError),
        (descriptor(name="n" * 257), b"\0" * 4, TensorError),
        (descriptor(shape="1"), b"\0" * 4, TensorError),
        (descriptor(shape=[-1]), b"\0" * 4, TensorError),
        (descriptor(shape=[1.0]), b"\0" * 4, TensorError),
        (descriptor(shape=[True]), b"\0" * 4, TensorError),
        (descriptor(raw_nbytes=-4), b"\0" * 4, TensorError),
        (descriptor(raw_nbytes="4"), b"\0" * 4, TensorError),
        (descriptor(nbytes=None), b"\0" * 4, TensorError),
        (descriptor(raw_nbytes=8, nbytes=8), b"\0" * 8, TensorError),  # shape says 4 bytes
        (descriptor(nbytes=3), b"\0" * 3, TensorError),
        (descriptor(), b"\0" * 3, TensorError),  # truncated
        (descriptor(), b"\0" * 5, TensorError),  # trailing byte
        (descriptor(compression="gzip"), b"\0" * 4, TensorError),
        (descriptor(compression="zstd"), b"\0" * 4, TensorError),  # not zstd data
        (descriptor(wire="FP16"), b"\0" * 4, TensorError),  # wire size mismatch
        (descriptor(datatype="INT32", wire="FP16", raw_nbytes=2, nbytes=2), b"\0\0", TensorError),
        (descriptor(wire="BYTES"), b"\0" * 4, TensorError),
        (descriptor(wire=["FP16"]), b"\0" * 4, TensorError),
        (int8_descriptor(), b"\0", TensorError),  # no scale
        (int8_descriptor(scale=0.0, zero_point=0), b"\0", TensorError),
        (int8_descriptor(scale=10**400, zero_point=0), b"\0", TensorError),
        (int8_descriptor(scale=True, zero_point=0), b"\0", TensorError),
        (int8_descriptor(scale=0.1, zero_point=10**400), b"\0", TensorError),
        (int8_descriptor(scale=0.1, zero_point=200), b"\0", TensorError),
        (int8_descriptor(scale=0.1, zero_point=0.5), b"\0", TensorError),
        (descriptor(datatype="BYTES", raw_nbytes=3, nbytes=3), b"\0\0\0", TensorError),
        (descriptor(datatype="BYTES", raw_nbytes=5, nbytes=5), b"\x02\0\0\0a", TensorError),
        (descriptor(datatype="BYTES", raw_nbytes=6, nbytes=6), b"\x01\0\0\0ab", TensorError),
        # [0, 10**30] holds no element, but numpy cannot even describe it.
        (descriptor(shape=[0, 10**30], raw_nbytes=0, nbytes=0), b"", LimitExceededError),
        (descriptor(shape=[10**5, 10**5]), b"\0" * 4, LimitExceededError),
        (descriptor(shape=[1] * 9), b"\0" * 4, LimitExceededError),
        (descriptor(raw_nbytes=10**12), b"\0" * 4, LimitExceededError),
    ],
)
def test_bad_descriptor_is_refused(
    desc: dict[str, Any], payload: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        decode_tensors([desc], payload)


def test_descriptors_must_be_a_list_of_objects() -> None:
    value: object
    for value in (None, {}, "x", 3):
        with pytest.raises(TensorError):
            decode_tensors(value, b"")
    with pytest.raises(TensorError):
        decode_tensors(["x"], b"")


def test_duplicate_tensor_names_are_refused() -> None:
    with pytest.raises(TensorError, match="twice"):
        decode_tensors([descriptor(), descriptor()], b"\0" * 8)


def test_too_many_tensors_are_refused_before_any_is_read() -> None:
    descs = [descriptor(name=f"t{i}", shape=[0], raw_nbytes=0, nbytes=0) for i in range(65)]
    with pytest.raises(LimitExceededError, match="65 tensors"):
        decode_tensors(descs, b"")
    assert len(decode_tensors(descs[:64], b"")) == 64


def test_total_size_limit_counts_every_tensor() -> None:
    limits = Limits(max_tensor_bytes=100, max_total_tensor_bytes=150)
    descs = [descriptor(name=f"t{i}", shape=[20], raw_nbytes=80, nbytes=80) for i in range(2)]
    with pytest.raises(LimitExceededError, match="in all"):
        decode_tensors(descs, b"\0" * 160, limits)
    assert len(decode_tensors(descs[:1], b"\0" * 80, limits)) == 1


def test_declared_ten_gigabyte_tensor_fails_fast_without_allocating() -> None:
    desc = descriptor(shape=[50_000, 50_000], raw_nbytes=10 * 1024**3, nbytes=4)
    with peak_traced_bytes() as peak, pytest.raises(LimitExceededError):
        decode_tensors([desc], b"\0" * 4)
    assert peak() < MiB


def test_bytes_element_count_bomb_fails_before_allocating_objects() -> None:
    # Eight million empty elements would cost 64 MiB of object pointers from a 0-byte payload.
    desc = descriptor(datatype="BYTES", shape=[8_000_000], raw_nbytes=0, nbytes=0)
    with peak_traced_bytes() as peak, pytest.raises(ProtocolError):
        decode_tensors([desc], b"")
    assert peak() < MiB


def test_bytes_elements_count_their_object_pointers_against_the_limit() -> None:
    items = np.array([b""] * 1000, dtype=object)
    descriptors, chunks = encode_tensors({"t": items})
    with pytest.raises(LimitExceededError):
        decode_tensors(descriptors, b"".join(chunks), Limits(max_tensor_bytes=4000))
    assert decode_tensors(descriptors, b"".join(chunks), Limits(max_tensor_bytes=12000))


def test_zstd_bomb_stops_at_raw_nbytes() -> None:
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (16 * MiB))
    desc = descriptor(
        datatype="UINT8", shape=[100], raw_nbytes=100, nbytes=len(bomb), compression="zstd"
    )
    with peak_traced_bytes() as peak, pytest.raises(TensorError, match="more than"):
        decode_tensors([desc], bomb)
    assert peak() < MiB


def test_zstd_payload_shorter_than_raw_nbytes_is_refused() -> None:
    packed = zstandard.ZstdCompressor().compress(b"\0" * 50)
    desc = descriptor(
        datatype="UINT8", shape=[100], raw_nbytes=100, nbytes=len(packed), compression="zstd"
    )
    with pytest.raises(TensorError):
        decode_tensors([desc], packed)


def test_zstd_raw_nbytes_must_match_the_shape_before_decompressing() -> None:
    packed = zstandard.ZstdCompressor().compress(b"\0" * 4000)
    desc = descriptor(shape=[1], raw_nbytes=4000, nbytes=len(packed), compression="zstd")
    with pytest.raises(TensorError, match="raw_nbytes"):
        decode_tensors([desc], packed)


def test_zstd_frame_asking_for_a_huge_window_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters(window_log=27, compression_level=3)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()
    packed = stream.compress(b"\0" * 100) + stream.flush()
    desc = descriptor(
        datatype="UINT8", shape=[100], raw_nbytes=100, nbytes=len(packed), compression="zstd"
    )
    with pytest.raises(TensorError, match="zstd"):
        decode_tensors([desc], packed)


def test_bool_bytes_other_than_zero_and_one_read_as_true() -> None:
    desc = descriptor(datatype="BOOL", shape=[3], raw_nbytes=3, nbytes=3)
    out = decode_tensors([desc], b"\x00\x01\x02")["x"]
    assert out.tolist() == [False, True, True]
    assert out.view(np.uint8).tolist() == [0, 1, 1]


def test_decoded_tensors_do_not_alias_the_payload() -> None:
    payload = bytearray(np.arange(4, dtype="<f4").tobytes())
    out = decode_tensors([descriptor(shape=[4], raw_nbytes=16, nbytes=16)], payload)["x"]
    payload[:4] = b"\xff\xff\xff\xff"
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    out[0] = 7.0  # writable


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_DATA)
@given(
    descs=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "name": st.one_of(st.text(max_size=3), st.integers(), st.none()),
                "datatype": st.one_of(st.sampled_from([*DATATYPES, "FP8"]), st.integers()),
                "shape": st.one_of(
                    st.lists(st.integers(-2, 2**40), max_size=10),
                    st.lists(st.one_of(st.floats(), st.text(max_size=2)), max_size=3),
                    st.integers(),
                ),
                "raw_nbytes": st.one_of(st.integers(-2, 2**40), st.floats(), st.text(max_size=2)),
                "nbytes": st.one_of(st.integers(-2, 64), st.floats(), st.none()),
                "wire": st.sampled_from(["FP16", "INT8", "FP32", "BYTES", "x"]),
                "scale": st.one_of(st.floats(), st.integers(), st.booleans(), st.text(max_size=2)),
                "zero_point": st.one_of(st.integers(), st.floats(), st.booleans()),
                "compression": st.one_of(st.sampled_from(["zstd", "gzip"]), st.integers()),
            },
        ),
        max_size=3,
    ),
    payload=st.binary(max_size=64),
)
def test_random_descriptors_raise_only_protocol_errors(
    descs: list[dict[str, Any]], payload: bytes
) -> None:
    try:
        out = decode_tensors(descs, payload)
    except ProtocolError:
        return
    for array in out.values():  # whatever decodes can be sent on
        encode_tensors({"t": array})


# -- helpers of the public surface ----------------------------------------------------------


def test_datatype_names_map_to_little_endian_numpy_dtypes() -> None:
    for name in NUMERIC_TYPES:
        dtype = numpy_dtype(name)
        assert dtype.byteorder in ("<", "|", "=")
        assert datatype_of(np.empty(0, dtype)) == name
    assert numpy_dtype("BYTES") == np.dtype(object)
    assert datatype_of(np.array([b"a"])) == "BYTES"
    assert datatype_of(np.array(["a"])) == "BYTES"
    for bad in ("fp32", "", None, 3):
        with pytest.raises(TensorError):
            numpy_dtype(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["complex64", "datetime64[s]", "timedelta64[s]", "V4"])
def test_numpy_dtypes_without_a_datatype_are_refused(dtype: str) -> None:
    with pytest.raises(TensorError):
        encode_tensors({"t": np.zeros(2, dtype=dtype)})


def test_bytes_tensor_of_other_objects_is_refused() -> None:
    with pytest.raises(TensorError):
        encode_tensors({"t": np.array([1, b"a"], dtype=object)})


@pytest.mark.parametrize("name", ["", 3, "n" * 257])
def test_encode_refuses_names_the_decoder_would_refuse(name: Any) -> None:
    with pytest.raises(TensorError):
        encode_tensors({name: np.zeros(1)})


def test_transfer_options_validate() -> None:
    with pytest.raises(ValueError, match="compression"):
        TransferOptions(compression="gzip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="precision"):
        TransferOptions(precision="bf16")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TransferOptions("zstd")  # type: ignore[call-arg]  # keyword-only


def test_limits_validate_their_fields() -> None:
    names = [field.name for field in dataclasses.fields(Limits)]
    assert {"max_frame_bytes", "max_text_bytes", "max_token_ids"} <= set(names)
    for field in names:
        bad: Any
        for bad in (0, -1, 1.5, "8", True, None):
            with pytest.raises(ValueError, match=field):
                Limits(**{field: bad})
        assert getattr(Limits(**{field: 1}), field) == 1
    with pytest.raises(TypeError):
        Limits(1)  # type: ignore[call-arg]  # keyword-only


def test_shape_compatible() -> None:
    assert shape_compatible((1, 28, 28), (None, 28, 28))
    assert shape_compatible((5, 16), (-1, 16))
    assert shape_compatible((), ())
    assert not shape_compatible((1, 16), (1, 17))
    assert not shape_compatible((1, 16), (1, 16, 1))
