"""Big JSON tensors parsed straight into numpy: same answers as the ordinary parse, less memory."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_hub import BadRequestError, InvalidRequestError
from cloud_hub.http import decode_infer_request
from cloud_hub.http._json_numbers import CHUNK_BYTES, MIN_SPAN_BYTES, NumberSpan, parse_request
from shared import DATATYPES, Limits

CODEC_ERRORS = (ValueError,)  # every codec error is a ValueError (BadRequest, InvalidRequest...)
NUMERIC = ["UINT8", "INT8", "INT16", "INT32", "INT64", "UINT32", "UINT64", "FP16", "FP32", "FP64"]


def _body(datatype: str, shape: list[int], data: Any, *, spaces: bool = False) -> bytes:
    document = {"id": "r", "inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                       "data": data}]}  # fmt: skip
    return json.dumps(document, separators=(", ", ": ") if spaces else (",", ":")).encode()


def _decode(body: bytes) -> np.ndarray | Exception:
    try:
        return decode_infer_request(body, None, limits=Limits()).inputs["x"]
    except CODEC_ERRORS as e:
        return e


def _slow(body: bytes) -> np.ndarray | Exception:
    """What the ordinary parse gives: the same body with the span shortcut turned off."""
    import cloud_hub.http._json_numbers as numbers

    saved = numbers.MIN_SPAN_BYTES
    numbers.MIN_SPAN_BYTES = 1 << 62
    try:
        return _decode(body)
    finally:
        numbers.MIN_SPAN_BYTES = saved


def _same(fast: np.ndarray | Exception, slow: np.ndarray | Exception) -> None:
    if isinstance(slow, Exception):
        assert type(fast) is type(slow), (fast, slow)
        assert str(fast) == str(slow)
        return
    assert isinstance(fast, np.ndarray), fast
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    np.testing.assert_array_equal(fast, slow)


@st.composite
def tensors(draw: st.DrawFn) -> tuple[str, list[int], Any, bool]:
    datatype = draw(st.sampled_from(NUMERIC))
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(2100, 2600))  # big enough for the shortcut
    dtype = DATATYPES[datatype]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = draw(
            st.lists(
                st.integers(int(info.min), int(info.max)),
                min_size=rows * cols,
                max_size=rows * cols,
            )
        )
    else:
        values = draw(
            st.lists(
                st.floats(-1e6, 1e6, allow_nan=False, width=32),
                min_size=rows * cols,
                max_size=rows * cols,
            )
        )
    nested = draw(st.booleans())
    data = [values[r * cols : (r + 1) * cols] for r in range(rows)] if nested else values
    return datatype, [rows, cols], data, draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(tensors())
def test_the_shortcut_gives_what_the_ordinary_parse_gives(
    tensor: tuple[str, list[int], Any, bool],
) -> None:
    datatype, shape, data, spaces = tensor
    body = _body(datatype, shape, data, spaces=spaces)
    assert len(body) >= MIN_SPAN_BYTES
    assert isinstance(parse_request(body)["inputs"][0]["data"], NumberSpan)  # the shortcut
    fast = _decode(body)
    _same(fast, _slow(body))
    assert isinstance(fast, np.ndarray)


@pytest.mark.parametrize(
    ("datatype", "shape", "data"),
    [
        ("INT32", [2000], [1.5] + [1] * 1999),  # a fraction in an integer tensor
        ("UINT8", [2000], [256] + [1] * 1999),  # out of range
        ("INT64", [2000], [10**19] + [1] * 1999),  # beyond int64
        ("FP32", [2, 1000], [[1.0] * 1000, [1.0] * 999]),  # ragged
        ("FP32", [2, 1000], [[1.0] * 1000] * 3),  # one row too many
        ("FP32", [2000], [[1.0] * 1000] * 2),  # nested, shape says flat
        ("FP32", [1999], [1.0] * 2000),  # one element too many
        ("BOOL", [2000], [True] * 2000),  # not numbers: the ordinary way
        ("FP16", [2000], [1e6] * 2000),  # beyond FP16: inf, as the ordinary parse makes it
    ],
)
def test_what_the_shortcut_cannot_take_gets_the_ordinary_answer(
    datatype: str, shape: list[int], data: Any
) -> None:
    body = _body(datatype, shape, data)
    _same(_decode(body), _slow(body))


@pytest.mark.parametrize(
    "text",
    [b"[1,,2]", b"[1 2]", b"[1,2,]", b"[NaN]", b"[1e5e5]", b"[--1]", b"[1,[2]]", b"[1e999]"],
)
def test_malformed_numbers_never_pass(text: bytes) -> None:
    padded = text[:-1] + b"," + b",".join([b"1"] * 3000) + b"]"
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3002],"data":' + padded + b"}]}"
    result = _decode(body)
    assert isinstance(result, Exception), result


@pytest.mark.parametrize("datatype", ["FP32", "INT32"])
@pytest.mark.parametrize("blank", [b"[1, ,2,", b"[ ,1,2,", b"[[1,2], [ ,3]],", b"[1,\n,2,"])
def test_a_blank_slot_is_refused_where_the_count_would_fit(datatype: str, blank: bytes) -> None:
    # numpy reads a blank slot as -1 (0 for integers): the count fits, the text is not JSON.
    ones = b",".join([b"1"] * 3000)
    if blank.startswith(b"[["):  # nested: 1500 rows of [1, 1], then [1, 2] and [ , 3]
        data, shape = b"[" + b",".join([b"[1,1]"] * 1500) + b",[1,2],[ ,3]]", [1502, 2]
    else:
        data, shape = blank + ones + b"]", [3003]
    body = _doc(datatype, shape, data)
    with pytest.raises(BadRequestError, match="empty slot"):
        decode_infer_request(body, None, limits=Limits())


def test_a_planted_placeholder_is_just_a_string() -> None:
    data = [1.0] * 3000
    planted = "tandem-number-span:0000000000000000:0"
    inputs = [
        {"name": "x", "datatype": "FP32", "shape": [3000], "data": data},
        {"name": "y", "datatype": "BYTES", "shape": [1], "data": [planted]},
    ]
    body = json.dumps({"id": planted, "inputs": inputs}).encode()
    decoded = decode_infer_request(body, None, limits=Limits())
    assert decoded.inputs["y"].tolist() == [planted.encode()]
    assert decoded.inputs["x"].shape == (3000,)


def test_a_large_data_array_outside_the_inputs_is_refused() -> None:
    numbers = list(range(3000))
    body = json.dumps({"parameters": {"data": numbers}, "inputs": []}).encode()
    with pytest.raises(BadRequestError, match="taken only as an input's data"):
        parse_request(body)


def test_decoding_a_15_mib_json_tensor_takes_about_its_body_and_its_tensor() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((1, 1_400_000), dtype=np.float32)
    body = _body("FP32", list(x.shape), x.round(6).tolist())
    assert len(body) > 14 * 1024 * 1024
    tracemalloc.start()
    try:
        decoded = decode_infer_request(body, None, limits=Limits(max_tensor_bytes=64 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tensor = decoded.inputs["x"]
    np.testing.assert_allclose(tensor, x.round(6), rtol=1e-6)
    # The body is already in memory; decoding adds the tensor and a few chunks of text,
    # where Python objects would take ~40 bytes a number (over 50 MiB here).
    assert peak < tensor.nbytes + 8 * (1 << 20), peak


# -- hostile bodies: refused from their text, never parsed into Python objects ----------------

N = 400_000  # elements: bodies of 1-4 MiB, where Python objects would take 15-60 MiB


def _doc(datatype: str, shape: list[int], data_text: bytes, extra: bytes = b"") -> bytes:
    head = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{json.dumps(shape)},'
    return head.encode() + b'"data":' + data_text + b"}]" + extra + b"}"


def _flat(item: bytes, n: int = N) -> bytes:
    return b"[" + b",".join([item] * n) + b"]"


HOSTILE: dict[str, tuple[bytes, type[Exception], str]] = {
    "one element too few": (_doc("FP32", [N + 1], _flat(b"0.123456")), InvalidRequestError,
                            f"holds {N + 1} elements but 'data' has {N}"),
    "one element too many": (_doc("FP32", [N - 1], _flat(b"0.5")), InvalidRequestError,
                             f"but 'data' has {N}"),
    "nested lists, shape flat": (_doc("FP32", [N], _flat(b"[0.5]")), InvalidRequestError,
                                 "nested 'data' does not match"),
    "ragged rows": (_doc("INT32", [2, N // 2], b"[" + _flat(b"7", N // 2) + b","
                         + _flat(b"7", N // 2 - 1) + b"]"), InvalidRequestError, "nested"),
    "strings where numbers belong": (_doc("FP32", [N], _flat(b'"a"')), InvalidRequestError,
                                     "FP32 data must be numbers"),
    "mixed types": (_doc("INT64", [N], _flat(b'1,"a",null,true,{"k":[1]}', N // 5)),
                    InvalidRequestError, "INT64 data must be integers"),
    "huge integers": (_doc("INT64", [N // 100], _flat(b"1" * 400, N // 100)),
                      InvalidRequestError, "does not fit INT64"),
    "a 4301-digit integer": (_doc("INT64", [1], b"[" + b"9" * 4301 + b"]"), InvalidRequestError,
                             "does not fit INT64"),
    "deep nesting": (_doc("FP32", [1], b"[" * N + b"1" + b"]" * N), InvalidRequestError,
                     "nested 'data' does not match"),
    "deep nesting with a string": (_doc("BYTES", [1], b"[" * N + b'"a"' + b"]" * N),
                                   InvalidRequestError, "nested 'data' does not match"),
    "BYTES, wrong count": (_doc("BYTES", [N + 1], _flat(b'"ab"')), InvalidRequestError,
                           f"holds {N + 1} elements but 'data' has {N}"),
    "BOOL, numbers": (_doc("BOOL", [N], _flat(b"1")), InvalidRequestError,
                      "BOOL data must be true or false"),
    "an empty slot": (_doc("FP32", [N], _flat(b"1")[:-1] + b",]"), BadRequestError,
                      "empty slot"),
    "junk outside the data": (_doc("FP32", [1], b"[1]", b',"parameters":{"junk":'
                                   + _flat(b'"a"') + b"}"), BadRequestError,
                              "outside its inputs' 'data' arrays"),
    "a second data array": (_doc("FP32", [N], _flat(b"1"))[:-3] + b',"data":[1]}]}',
                            BadRequestError, "taken only as an input's data"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_body_is_refused_from_its_text_at_about_its_size(case: str) -> None:
    body, error, message = HOSTILE[case]
    tracemalloc.start()
    try:
        with pytest.raises(error, match=message) as raised:
            decode_infer_request(body, None, limits=Limits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(raised.value)  # one line
    # The body is already in memory; refusing it may take about as much again, where the
    # ordinary parse takes ten to fifty times the body in Python objects.
    assert peak <= len(body) + 3 * CHUNK_BYTES, (case, len(body), peak)


def test_a_4301_digit_integer_in_a_small_body_or_a_binary_header_is_a_bad_request() -> None:
    digits = b"9" * 4301
    body = _doc("INT64", [2], b"[1," + digits + b"]")
    for result in (_decode(body), _slow(body)):  # straight from the text, and the ordinary way
        assert isinstance(result, BadRequestError | InvalidRequestError), result
    for body, header in (
        (b'{"inputs":[{"name":"x","datatype":"INT64","shape":[' + digits + b"]}]}", None),
        (b'{"parameters":{"timeout":' + digits + b'},"inputs":[]}' + b"\0" * 8, 4301 + 38),
    ):
        with pytest.raises((BadRequestError, InvalidRequestError)):
            decode_infer_request(body, header, limits=Limits())


def test_big_bool_and_bytes_tensors_still_decode() -> None:
    flags = [i % 3 == 0 for i in range(N)]
    body = _body("BOOL", [2, N // 2], [flags[: N // 2], flags[N // 2 :]])
    tracemalloc.start()
    try:
        decoded = decode_infer_request(body, None, limits=Limits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(decoded.inputs["x"].reshape(-1), flags)
    assert peak <= 2 * len(body), peak  # not a Python list of N bools
    # Strings with brackets, quotes and backslashes: the array's end is found past them.
    words = [f"w{i}" for i in range(2995)] + ['a"]b', "[", "\\", '\\"', "]],"]
    body = _body("BYTES", [2, 1500], [words[:1500], words[1500:]])
    decoded = decode_infer_request(body, None, limits=Limits()).inputs["x"]
    assert decoded.reshape(-1).tolist() == [w.encode() for w in words]
