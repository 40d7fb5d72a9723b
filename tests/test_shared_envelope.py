"""The binary frame and ``Message``: round trips, unknown fields, and hostile frames."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import (
    FORMAT_MAJOR,
    FORMAT_MINOR,
    MAGIC,
    ErrorCode,
    FrameError,
    LimitExceededError,
    Limits,
    Message,
    ProtocolError,
    TensorError,
    TransferOptions,
    UnsupportedVersionError,
    decode_header,
    decode_message,
    encode_message,
    new_request_id,
)

from .test_shared_tensors import ALL_OPTIONS, assert_same_tensor, peak_traced_bytes, tensor_maps

KNOWN_FIELDS = {
    "kind",
    "id",
    "model",
    "version",
    "reply_to",
    "timeout_ms",
    "device",
    "sent_at_ms",
    "error",
    "timing",
    "tensors",
}
MiB = 1024 * 1024
# Big arrays and byte strings are the point here; a slow CI runner must not fail on them.
SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]


def raw_frame(
    header: object | bytes,
    payload: bytes = b"",
    *,
    major: int = FORMAT_MAJOR,
    minor: int = FORMAT_MINOR,
    header_len: int | None = None,
) -> bytes:
    """A frame built by hand, so that tests can say things ``encode_message`` never would."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if header_len is None else header_len
    return struct.pack("<4sBBHI", MAGIC, major, minor, 0, length) + raw + payload


def request_header(**fields: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"kind": "request", "id": "r1", "model": "m", "tensors": []}
    header.update(fields)
    return header


def sample_message(**fields: Any) -> Message:
    values: dict[str, Any] = {
        "kind": "request",
        "request_id": "req-1",
        "model": "mnist",
        "model_version": "3",
        "reply_to": "tandem/v1/dev/cam-1/reply",
        "timeout_ms": 250.0,
        "device_id": "cam-1",
        "sent_at_ms": 1_700_000_000_000,
        "tensors": {
            "x": np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 8, 8),
            "labels": np.array([b"cat", b"", b"dog"], dtype=object),
            "mask": np.array([True, False]),
        },
        "extra": {"trace": {"span": "abc"}},
    }
    values.update(fields)
    return Message(**values)


# -- strategies -----------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), FINITE, st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
EXTRA = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k not in KNOWN_FIELDS), JSON_VALUES, max_size=4
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    optional = st.none() | TEXT
    reply_to = st.none() | TEXT.filter(lambda t: not any(c in t for c in "+#\0"))
    number = st.none() | st.floats(0, 1e15) | st.integers(0, 2**53)
    return Message(
        kind=draw(st.sampled_from(["request", "reply"])),
        request_id=draw(TEXT),
        model=draw(TEXT),
        model_version=draw(optional),
        reply_to=draw(reply_to),
        timeout_ms=draw(number),
        device_id=draw(optional),
        sent_at_ms=draw(number),
        error=draw(st.sampled_from(list(ErrorCode))),
        error_message=draw(st.text(max_size=30)),
        timing=draw(st.dictionaries(st.text(max_size=8), FINITE, max_size=3)),
        tensors=draw(tensor_maps(max_tensors=3)),
        extra=draw(EXTRA),
    )


def assert_same_fields(got: Message, sent: Message) -> None:
    assert got.kind == sent.kind
    assert got.request_id == sent.request_id
    assert got.model == sent.model
    assert got.model_version == sent.model_version
    assert got.reply_to == sent.reply_to
    assert got.timeout_ms == sent.timeout_ms
    assert got.device_id == sent.device_id
    assert got.sent_at_ms == sent.sent_at_ms
    assert got.error is sent.error
    assert got.error_message == (sent.error_message if not sent.ok else "")
    assert got.timing == sent.timing
    assert got.extra == sent.extra
    assert list(got.tensors) == list(sent.tensors)


# -- round trips ----------------------------------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=SLOW_DATA)
@given(message=messages())
def test_message_round_trip_is_exact(message: Message) -> None:
    got = decode_message(encode_message(message))
    assert_same_fields(got, message)
    for name, array in message.tensors.items():
        assert_same_tensor(got.tensors[name], array)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_DATA)
@given(message=messages(), options=st.sampled_from(ALL_OPTIONS))
def test_message_round_trip_under_every_transfer_option(
    message: Message, options: TransferOptions
) -> None:
    got = decode_message(encode_message(message, options))
    assert_same_fields(got, message)
    for name, array in message.tensors.items():
        assert got.tensors[name].shape == array.shape
        assert got.tensors[name].dtype == np.dtype(array.dtype.newbyteorder("<"))
        if options.precision == "exact":
            assert_same_tensor(got.tensors[name], array)


def test_frame_starts_with_magic_version_and_header_length() -> None:
    frame = encode_message(sample_message())
    magic, major, minor, flags, header_len = struct.unpack_from("<4sBBHI", frame)
    assert (magic, major, minor, flags) == (MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0)
    header = json.loads(frame[12 : 12 + header_len])
    assert header == decode_header(frame)
    assert header["id"] == "req-1"
    assert [t["name"] for t in header["tensors"]] == ["x", "labels", "mask"]


def test_nan_and_inf_tensors_survive_exact_transfer_in_a_message() -> None:
    values = np.array([np.nan, np.inf, -np.inf, -0.0, 1.5], dtype=np.float32)
    for options in (TransferOptions(), TransferOptions(compression="zstd", min_compress_bytes=0)):
        got = decode_message(encode_message(sample_message(tensors={"x": values}), options))
        assert_same_tensor(got.tensors["x"], values)


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_DATA)
@given(extra=EXTRA)
def test_unknown_header_fields_are_kept_through_decode_and_encode(extra: dict[str, Any]) -> None:
    # A newer peer (same major, higher minor) adds fields; we must pass them on untouched.
    frame = raw_frame(request_header(**extra), minor=FORMAT_MINOR + 7)
    message = decode_message(frame)
    assert message.extra == extra
    again = decode_header(encode_message(message))
    assert {k: v for k, v in again.items() if k not in KNOWN_FIELDS} == extra


def test_extra_cannot_shadow_known_fields_on_encode() -> None:
    message = sample_message(extra={"error": {"code": "overloaded"}, "id": "forged", "x": 1})
    header = decode_header(encode_message(message))
    assert header["id"] == "req-1"
    assert "error" not in header
    assert header["x"] == 1


def test_extra_that_json_cannot_carry_is_a_frame_error() -> None:
    for extra in ({"when": object()}, {"nan": float("nan")}):
        with pytest.raises(FrameError):
            encode_message(sample_message(extra=extra))


def test_reply_is_correlated_with_its_request() -> None:
    request = sample_message()
    reply = request.reply(
        tensors={"y": np.ones(2, np.float32)}, timing={"compute_ms": 1.5}, model_version="4"
    )
    got = decode_message(encode_message(reply))
    assert (got.kind, got.request_id, got.model, got.device_id) == (
        "reply",
        "req-1",
        "mnist",
        "cam-1",
    )
    assert got.ok
    assert got.model_version == "4"
    assert got.timing == {"compute_ms": 1.5}


def test_error_reply_round_trips_code_and_message() -> None:
    reply = sample_message().reply(error=ErrorCode.OVERLOADED, error_message="queue full")
    got = decode_message(encode_message(reply))
    assert got.error is ErrorCode.OVERLOADED
    assert not got.ok
    assert got.error_message == "queue full"
    assert got.tensors == {}


def test_unknown_error_code_from_a_newer_peer_reads_as_internal() -> None:
    got = decode_message(raw_frame(request_header(error={"code": "quota", "message": "m"})))
    assert got.error is ErrorCode.INTERNAL
    assert ErrorCode.parse(None) is ErrorCode.INTERNAL
    assert ErrorCode.parse("overloaded") is ErrorCode.OVERLOADED


def test_new_request_ids_are_unique_hex() -> None:
    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_decode_header_reads_a_frame_whose_tensors_are_bad() -> None:
    # The hub must still be able to answer (and correlate) a request it cannot decode.
    frame = raw_frame(request_header(tensors=[{"name": "x", "datatype": "FP128"}]))
    assert decode_header(frame)["id"] == "r1"
    with pytest.raises(TensorError):
        decode_message(frame)


# -- Message validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "push"},
        {"kind": None},
        {"request_id": ""},
        {"request_id": 7},
        {"request_id": "x" * 129},
        {"request_id": "\ud800"},
        {"model": None},
        {"model_version": ""},
        {"reply_to": "a/+/b"},
        {"reply_to": "a/#"},
        {"reply_to": "a\0b"},
        {"device_id": 3},
        {"timeout_ms": -1},
        {"timeout_ms": float("nan")},
        {"timeout_ms": float("inf")},
        {"timeout_ms": True},
        {"timeout_ms": "10"},
        {"timeout_ms": 10**400},
        {"sent_at_ms": -0.5},
        {"timing": [1]},
        {"timing": {"a": "1"}},
        {"timing": {"a": float("nan")}},
        {"timing": {"a": True}},
        {"timing": {1: 1.0}},
        {"extra": []},
        {"extra": {1: "x"}},
        {"error_message": 3},
    ],
)
def test_message_constructor_validates(fields: dict[str, Any]) -> None:
    with pytest.raises(FrameError):
        sample_message(**fields)


def test_message_error_accepts_wire_strings() -> None:
    assert sample_message(error="overloaded").error is ErrorCode.OVERLOADED


# -- hostile frames -------------------------------------------------------------------------


def some_frames() -> list[bytes]:
    message = sample_message(
        tensors={
            "x": np.arange(300, dtype=np.float32),
            "b": np.array([b"", b"ab"], dtype=object),
            "z": np.zeros((0, 2), np.int8),
        }
    )
    return [
        encode_message(message),
        encode_message(message, TransferOptions(compression="zstd", min_compress_bytes=0)),
        encode_message(message, TransferOptions(precision="int8")),
        encode_message(message.reply(error=ErrorCode.INTERNAL, error_message="boom")),
    ]


def test_every_truncation_of_a_valid_frame_is_a_protocol_error() -> None:
    for frame in some_frames():
        decode_message(frame)
        for cut in range(len(frame)):
            with pytest.raises(ProtocolError):
                decode_message(frame[:cut])


def test_trailing_bytes_after_the_last_tensor_are_a_protocol_error() -> None:
    for frame in some_frames():
        with pytest.raises(ProtocolError):
            decode_message(frame + b"\0")


def check_decodes_or_refuses(frame: bytes) -> None:
    """Decoding yields a ``ProtocolError`` or a message that can be sent on unchanged."""
    try:
        message = decode_message(frame)
    except ProtocolError:
        return
    again = decode_message(encode_message(message))
    assert_same_fields(again, message)
    for name, array in message.tensors.items():
        assert_same_tensor(again.tensors[name], array)


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_DATA)
@given(frame_index=st.integers(0, 3), bits=st.lists(st.integers(0, 2**20), min_size=1, max_size=3))
def test_random_bit_flips_raise_only_protocol_errors(frame_index: int, bits: list[int]) -> None:
    frame = bytearray(some_frames()[frame_index])
    for bit in bits:
        bit %= len(frame) * 8
        frame[bit // 8] ^= 1 << (bit % 8)
    check_decodes_or_refuses(bytes(frame))


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_DATA)
@given(data=st.binary(max_size=300))
def test_random_garbage_raises_only_protocol_errors(data: bytes) -> None:
    check_decodes_or_refuses(data)
    check_decodes_or_refuses(struct.pack("<4sBBHI", MAGIC, 1, 0, 0, len(data)) + data)


@settings(max_examples=200, deadline=None, suppress_health_check=SLOW_DATA)
@given(header=st.dictionaries(st.sampled_from(sorted(KNOWN_FIELDS)), JSON_VALUES), tail=st.binary())
def test_random_header_values_raise_only_protocol_errors(
    header: dict[str, Any], tail: bytes
) -> None:
    check_decodes_or_refuses(raw_frame({**request_header(), **header}, tail))


@pytest.mark.parametrize("major", [0, 2, 255])
def test_other_major_version_is_unsupported(major: int) -> None:
    with pytest.raises(UnsupportedVersionError):
        decode_message(raw_frame(request_header(), major=major))
    with pytest.raises(UnsupportedVersionError):
        decode_header(raw_frame(request_header(), major=major))


def test_newer_minor_version_and_flags_are_read() -> None:
    frame = bytearray(raw_frame(request_header(), minor=255))
    frame[6:8] = b"\x01\x00"
    assert decode_message(bytes(frame)).request_id == "r1"


def test_bad_magic_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="magic"):
        decode_message(b"HTTP" + raw_frame(request_header())[4:])


def test_huge_declared_header_length_fails_before_reading() -> None:
    with peak_traced_bytes() as peak, pytest.raises(LimitExceededError):
        decode_message(raw_frame(b"{}", header_len=0xFFFFFFFF))
    assert peak() < MiB
    with pytest.raises(FrameError):  # within the limit but past the end
        decode_message(raw_frame(b"{}", header_len=1000))


def test_header_length_limit_is_configurable() -> None:
    frame = raw_frame(request_header(pad="x" * 200))
    with pytest.raises(LimitExceededError):
        decode_message(frame, Limits(max_header_bytes=100))
    with pytest.raises(LimitExceededError):
        decode_header(frame, Limits(max_header_bytes=100))


def test_frame_size_limit() -> None:
    frame = encode_message(sample_message())
    with pytest.raises(LimitExceededError):
        decode_message(frame, Limits(max_frame_bytes=len(frame) - 1))
    assert decode_message(frame, Limits(max_frame_bytes=len(frame)))


def test_frame_declaring_a_ten_gigabyte_tensor_fails_fast_without_allocating() -> None:
    desc = {"name": "x", "datatype": "FP32", "shape": [50_000, 50_000]}
    frame = raw_frame(request_header(tensors=[{**desc, "raw_nbytes": 10**10, "nbytes": 4}]))
    with peak_traced_bytes() as peak, pytest.raises(LimitExceededError):
        decode_message(frame + b"\0" * 4)
    assert peak() < MiB


def test_too_many_tensors_rank_too_high_and_raw_nbytes_too_big() -> None:
    empty = {"datatype": "FP32", "shape": [0], "raw_nbytes": 0, "nbytes": 0}
    cases = [
        request_header(tensors=[{"name": f"t{i}", **empty} for i in range(65)]),
        request_header(tensors=[{**empty, "name": "x", "shape": [1] * 9}]),
        request_header(tensors=[{**empty, "name": "x", "raw_nbytes": 2**40}]),
    ]
    for header in cases:
        with pytest.raises(LimitExceededError):
            decode_message(raw_frame(header))


def test_zstd_bomb_in_a_frame_is_refused() -> None:
    import zstandard

    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (16 * MiB))
    desc = {
        "name": "x",
        "datatype": "UINT8",
        "shape": [64],
        "raw_nbytes": 64,
        "nbytes": len(bomb),
        "compression": "zstd",
    }
    with peak_traced_bytes() as peak, pytest.raises(TensorError):
        decode_message(raw_frame(request_header(tensors=[desc]), bomb))
    assert peak() < MiB


@pytest.mark.parametrize(
    "header",
    [
        b"[]",
        b'"request"',
        b"3",
        b"null",
        b"",
        b"{",
        b'{"kind": "request"',  # truncated JSON
        b"\xff\xfe{}",  # not UTF-8
        json.dumps(request_header()).encode("utf-16"),  # json.loads(bytes) would take it
        json.dumps(request_header()).encode("utf-8-sig"),  # BOM
        b'{"kind":"request","id":"\xed\xa0\x80","model":"m"}',  # an encoded lone surrogate
        b"[" * 20_000 + b"]" * 20_000,  # deep enough for RecursionError
        json.dumps(request_header(x=json.loads("[" * 40 + "]" * 40))).encode(),
        b'{"kind":"request","id":"r","model":"m","x":NaN}',
        b'{"kind":"request","id":"r","model":"m","x":-Infinity}',
        b'{"kind":"request","id":"r","model":"m","x":1e999}',
        b'{"kind":"request","id":"r","model":"m","x":' + b"9" * 5000 + b"}",
        b'{"kind":"request","id":"r","model":"m","timeout_ms":1' + b"0" * 400 + b"}",
        b'{"kind":"request","id":"r","model":"m","timing":{"a":true}}',
        b'{"kind":"request","id":"r","model":"m","error":"overloaded"}',
        b'{"kind":"request","id":"r","model":"m","reply_to":"a/#"}',
        b'{"kind":"request","id":"\\ud800","model":"m"}',  # a lone surrogate, escaped
    ],
)
def test_bad_header_is_a_frame_error(header: bytes) -> None:
    with pytest.raises(FrameError):
        decode_message(raw_frame(header))


def test_header_nesting_up_to_the_limit_is_read() -> None:
    nested: Any = "leaf"
    for _ in range(30):
        nested = [nested]
    assert decode_message(raw_frame(request_header(x=nested))).extra["x"] == nested


def test_encoding_does_not_write_nan_into_the_header() -> None:
    with pytest.raises(FrameError):
        sample_message(timing={"a": float("inf")})
