"""Big JSON tensors parsed straight into numpy: same answers as the ordinary parse, less memory."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_hub.http import decode_infer_request
from cloud_hub.http._json_numbers import MIN_SPAN_BYTES, NumberSpan, parse_request
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
    [b"[1,,2]", b"[1 2]", b"[1,2,]", b"[NaN]", b"[1e5e5]", b"[--1]", b"[1,[2]]"],
)
def test_malformed_numbers_never_pass(text: bytes) -> None:
    padded = text[:-1] + b"," + b",".join([b"1"] * 3000) + b"]"
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3002],"data":' + padded + b"}]}"
    result = _decode(body)
    assert isinstance(result, Exception), result


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


def test_a_span_outside_the_inputs_parses_the_ordinary_way() -> None:
    numbers = list(range(3000))
    body = json.dumps({"parameters": {"data": numbers}, "inputs": []}).encode()
    document = parse_request(body)
    assert document["parameters"]["data"] == numbers
    assert not any(isinstance(v, NumberSpan) for v in document.values())


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
