"""The HTTP API's codec alone: pure functions, no hub and no server.

``decode_infer_request`` and ``parse_header_length`` must turn every body into
tensors or into one of the codec's own errors, and ``encode_infer_response``
must write JSON and binary outputs exactly.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud_hub import BadRequestError, InvalidRequestError
from cloud_hub.http import decode_infer_request, encode_infer_response, parse_header_length
from shared import LimitExceededError, Limits, TensorError

from ._hub_http_kit import HEADER, binary_body, rows

CODEC_ERRORS = (BadRequestError, InvalidRequestError, LimitExceededError, TensorError)


@pytest.mark.parametrize(
    ("tensor", "error"),
    [
        ({"datatype": "INT32", "data": [1.5]}, InvalidRequestError),  # no silent truncation
        ({"datatype": "UINT8", "data": [256]}, InvalidRequestError),
        ({"datatype": "FP32", "data": [True]}, InvalidRequestError),
        ({"datatype": "BOOL", "data": [1]}, InvalidRequestError),
        ({"datatype": "BYTES", "data": [1]}, InvalidRequestError),
        ({"datatype": "BYTES", "data": ["\ud800"]}, BadRequestError),  # orjson: not Unicode
        ({"datatype": ["FP32"], "data": [1.0]}, InvalidRequestError),
        ({"datatype": "FP32", "data": [[1.0]]}, InvalidRequestError),
        ({"datatype": "FP32", "data": 1.0}, InvalidRequestError),
        (
            {"datatype": "FP32", "data": [1.0], "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1]},
            LimitExceededError,
        ),
        ({"datatype": "FP32", "data": [1.0], "shape": [True]}, BadRequestError),
        ({"datatype": "FP32"}, BadRequestError),
    ],
)
def test_the_codec_refuses_data_that_does_not_fit(tensor: dict[str, Any], error: type) -> None:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], **tensor}]}).encode()
    with pytest.raises(error):
        decode_infer_request(body, None, limits=Limits())


def test_the_codec_reads_flat_nested_and_binary_tensors_alike() -> None:
    x = rows(2)
    flat = {"name": "x", "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()}
    nested = {**flat, "name": "y", "data": x.tolist()}
    binary = {"name": "z", "shape": [2, 16], "datatype": "FP32",
              "parameters": {"binary_data_size": x.nbytes}}  # fmt: skip
    content, headers = binary_body({"inputs": [flat, binary, nested], "id": "r"}, x.tobytes())
    length = parse_header_length(headers[HEADER], len(content), max_json_bytes=1 << 20)
    request = decode_infer_request(content, length, limits=Limits())
    assert list(request.inputs) == ["x", "z", "y"] and request.id == "r"
    for value in request.inputs.values():
        np.testing.assert_array_equal(value, x)
        assert value.dtype == np.float32 and value.flags.writeable


def test_the_codec_writes_nan_in_json_and_exact_bytes_in_binary() -> None:
    out = {"y": np.array([[np.nan, np.inf, 1.5]], np.float32)}
    text, length = encode_infer_response(out, model="m", version="1")
    assert length is None and json.loads(text)["outputs"][0]["data"][2] == 1.5
    assert np.isnan(json.loads(text)["outputs"][0]["data"][0])
    body, length = encode_infer_response(out, model="m", version="1", binary_output=True)
    assert length is not None and body[length:] == out["y"].tobytes()
    with pytest.raises(InvalidRequestError, match="binary_data"):
        encode_infer_response({"t": np.array([b"\xff"], dtype=object)}, model="m", version="1")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(["name", "shape", "datatype", "data", "parameters", "inputs", "outputs",
                           "id", "binary_data_size", "binary_data_output", "timeout"]),
    value=JSON_VALUES,
    tail=st.binary(max_size=80),
)  # fmt: skip
def test_hostile_bodies_raise_only_the_codecs_errors(field: str, value: Any, tail: bytes) -> None:
    tensor: dict[str, Any] = {"name": "x", "shape": [1, 16], "datatype": "FP32",
                              "parameters": {"binary_data_size": 64}}  # fmt: skip
    request: dict[str, Any] = {"inputs": [tensor], "parameters": {}}
    if field in ("name", "shape", "datatype", "data", "parameters"):
        tensor[field] = value
    elif field == "binary_data_size":
        tensor["parameters"][field] = value
    elif field in ("binary_data_output", "timeout"):
        request["parameters"][field] = value
    else:
        request[field] = value
    header = json.dumps(request).encode()
    content = header + tail
    try:
        length = parse_header_length(str(len(header)), len(content), max_json_bytes=1 << 20)
        decoded = decode_infer_request(content, length, limits=Limits(max_tensor_bytes=1 << 16))
    except CODEC_ERRORS:
        return
    assert all(isinstance(v, np.ndarray) for v in decoded.inputs.values())
