"""The Open Inference Protocol's (KServe v2 / Triton) HTTP bodies <-> numpy: pure, no I/O.

A request body is a JSON object, optionally followed by raw tensor bytes
(Triton's binary tensor data extension)::

    body = JSON header (Inference-Header-Content-Length bytes, or all of it)
           + the binary inputs' bytes, in input order, each
             inputs[i].parameters.binary_data_size long

Binary bytes are little-endian, row-major, without padding; a BOOL is one
byte; a BYTES element is a 4-byte little-endian length and its bytes: the
same layout as ``shared``'s tensor codec, which decodes them. In JSON,
``data`` is a flat list in row-major order or lists nested exactly as
``shape``; numbers for numeric datatypes (no floats for integers, no bools
for numbers), ``true``/``false`` for BOOL, strings for BYTES.

Checks, before anything is allocated from what a client declares: the
header length is decimal, within the body and within ``max_json_bytes``
(``LimitExceededError`` past it); the binary sizes are non-negative ints
that add up exactly to the bytes after the header; every shape has at most
``max_rank`` dims and every tensor (and all together) stays within
``Limits``; the element count equals the shape's product; the JSON outside
the large ``data`` arrays is at most ``structure_limit(limits)`` bytes, and
those arrays are checked from their text (``_json_numbers``). Errors are
``BadRequestError`` (malformed body, unsupported feature),
``InvalidRequestError`` (data that does not fit its datatype or shape),
``LimitExceededError`` and ``TensorError`` (from ``shared``); the app maps
each to an HTTP status. Encoding raises ``InvalidRequestError`` for an
output the request named but the model lacks, or BYTES that are not UTF-8 in
JSON, and ``TensorError`` for an output no datatype describes (the model's
fault). Nothing is evaluated or unpickled.

A response's outputs are JSON (``data``) unless binary was asked for, per
output (``outputs[i].parameters.binary_data``) or for all the others
(request parameter ``binary_data_output``); binary outputs carry
``parameters.binary_data_size`` and follow the JSON, whose length the
caller sends as ``Inference-Header-Content-Length``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared import (
    DATATYPES,
    LimitExceededError,
    Limits,
    datatype_of,
    decode_tensors,
    encode_tensors,
)

from .._errors import BadRequestError, HubError, InvalidRequestError
from .._model_info import ModelInfo
from ._json_numbers import NumberSpan, parse_request

__all__ = [
    "HEADER_LENGTH",
    "InferRequest",
    "RequestedOutput",
    "check_requested_outputs",
    "decode_infer_request",
    "encode_infer_response",
    "parse_header_length",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
_MAX_NAME = 256
_MAX_ID = 256
_OBJECT_POINTER = np.dtype(object).itemsize
_NUMBER = (int, float)
_MAX_TIMEOUT_US = 2**64 - 1  # Triton's uint64
# Extension parameters whose meaning we would silently get wrong by ignoring them.
_UNSUPPORTED = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass(frozen=True)
class RequestedOutput:
    """An entry of the request's ``outputs``: a name and whether to send it as binary."""

    name: str
    binary: bool | None = None  # None: the request's binary_data_output decides


@dataclass(frozen=True)
class InferRequest:
    """A decoded inference request; ``outputs`` None means all outputs."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    outputs: tuple[RequestedOutput, ...] | None = None
    binary_output: bool = False  # request parameter binary_data_output
    timeout_us: int | None = None  # Triton's request parameter "timeout"; None or 0: none
    parameters: dict[str, Any] = field(default_factory=dict)


def parse_header_length(value: str | None, body_length: int, *, max_json_bytes: int) -> int | None:
    """The JSON part's length from ``Inference-Header-Content-Length`` (None: all the body)."""
    if value is None:
        if body_length > max_json_bytes:
            raise LimitExceededError(
                f"a JSON body of {body_length} bytes is above the limit of {max_json_bytes}; "
                "send large tensors with the binary tensor data extension"
            )
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise BadRequestError(f"{HEADER_LENGTH} must be a non-negative integer, got {value!r:.40}")
    length = int(text)
    if length > body_length:
        raise BadRequestError(
            f"{HEADER_LENGTH} is {length} but the body has only {body_length} bytes"
        )
    if length > max_json_bytes:
        raise LimitExceededError(
            f"{HEADER_LENGTH} {length} is above the JSON limit of {max_json_bytes} bytes"
        )
    return length


def decode_infer_request(
    body: bytes | bytearray, header_length: int | None, *, limits: Limits
) -> InferRequest:
    """Decode a request body (see the module docstring for every check made)."""
    view = memoryview(body)
    binary = view[len(body) if header_length is None else header_length :]
    try:
        # Big data arrays go straight to numpy, in the JSON part of a binary request too.
        document = parse_request(body, header_length, limits=limits)
    except HubError:
        raise
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, absurd nesting
        raise BadRequestError(f"the request is not valid JSON: {e}") from None
    if not isinstance(document, dict):
        raise BadRequestError("the request must be a JSON object with an 'inputs' list")
    request_id = document.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > _MAX_ID):
        raise BadRequestError(f"'id' must be a string of at most {_MAX_ID} characters")
    parameters = _parameters(document, "the request")
    if "classification" in parameters:
        raise BadRequestError("the classification extension is not supported")
    binary_output = _optional_bool(parameters, "binary_data_output", "request parameter")
    timeout = parameters.get("timeout")
    if timeout is not None and (not _is_int(timeout) or not 0 <= timeout <= _MAX_TIMEOUT_US):
        raise BadRequestError(
            "request parameter 'timeout' must be an integer of microseconds, 0 to 2**64 - 1"
        )
    inputs = _decode_inputs(document.get("inputs"), binary, limits)
    return InferRequest(
        inputs=inputs,
        id=request_id,
        outputs=_requested_outputs(document.get("outputs")),
        binary_output=bool(binary_output),
        timeout_us=timeout or None,
        parameters=parameters,
    )


def encode_infer_response(
    outputs: Mapping[str, np.ndarray],
    *,
    model: str,
    version: str,
    request_id: str | None = None,
    requested: Sequence[RequestedOutput] | None = None,
    binary_output: bool = False,
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary outputs, the JSON part's length."""
    if requested is None:
        requested = [RequestedOutput(name) for name in outputs]
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for wanted in requested:
        array = outputs.get(wanted.name)
        if array is None:
            raise InvalidRequestError(
                f"model {model!r} has no output {wanted.name!r}; it has {sorted(outputs)}"
            )
        datatype = datatype_of(array)
        entry: dict[str, Any] = {
            "name": wanted.name,
            "datatype": datatype,
            "shape": list(array.shape),
        }
        if binary_output if wanted.binary is None else wanted.binary:
            descriptors, parts = encode_tensors({wanted.name: array})
            entry["parameters"] = {"binary_data_size": descriptors[0]["nbytes"]}
            chunks.extend(parts)
        else:
            entry["data"] = _json_data(array, wanted.name)
        entries.append(entry)
    header: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        header["id"] = request_id
    header["outputs"] = entries
    # NaN and inf are written as JSON's de facto NaN/Infinity tokens (as Python and
    # rapidjson read them); binary outputs carry them exactly.
    text = json.dumps(header, separators=(",", ":")).encode()
    if not chunks:
        return text, None
    return b"".join([text, *chunks]), len(text)


# -- request parts -------------------------------------------------------------------------


def _decode_inputs(raw_inputs: object, binary: memoryview, limits: Limits) -> dict[str, np.ndarray]:
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequestError("'inputs' must be a non-empty list of tensors")
    if len(raw_inputs) > limits.max_tensors:
        raise LimitExceededError(
            f"{len(raw_inputs)} inputs in one request; the limit is {limits.max_tensors}"
        )
    order: list[str] = []
    from_json: dict[str, np.ndarray] = {}
    descriptors: list[dict[str, Any]] = []
    total = 0
    for i, raw in enumerate(raw_inputs):
        name, datatype, shape = _tensor_header(raw, f"inputs[{i}]", limits)
        if name in order:
            raise BadRequestError(f"input {name!r} appears twice")
        order.append(name)
        count = math.prod(shape)
        itemsize = _OBJECT_POINTER if datatype == "BYTES" else DATATYPES[datatype].itemsize
        total += count * itemsize
        if total > limits.max_total_tensor_bytes:
            raise LimitExceededError(
                f"inputs would take more than {limits.max_total_tensor_bytes} bytes in all"
            )
        parameters = _parameters(raw, f"input {name!r}")
        size = parameters.get("binary_data_size")
        has_data = "data" in raw
        if size is not None:
            if has_data:
                raise BadRequestError(f"input {name!r} has both 'data' and binary_data_size")
            if not _is_int(size) or size < 0:
                raise BadRequestError(
                    f"input {name!r}: binary_data_size must be a non-negative integer"
                )
            descriptors.append(
                {"name": name, "datatype": datatype, "shape": list(shape), "nbytes": size,
                 "raw_nbytes": size}
            )  # fmt: skip
        elif has_data:
            from_json[name] = _tensor_from_json(name, datatype, shape, raw["data"], limits)
        else:
            raise BadRequestError(f"input {name!r} has neither 'data' nor binary_data_size")
    declared = sum(d["nbytes"] for d in descriptors)
    if declared != len(binary):
        raise BadRequestError(
            f"the inputs' binary_data_size add up to {declared} bytes but {len(binary)} "
            "bytes follow the JSON header"
            + ("" if len(binary) or not descriptors else f" (is {HEADER_LENGTH} missing?)")
        )
    from_binary = decode_tensors(descriptors, binary, limits) if descriptors else {}
    return {name: from_json[name] if name in from_json else from_binary[name] for name in order}


def _tensor_header(raw: object, where: str, limits: Limits) -> tuple[str, str, tuple[int, ...]]:
    if not isinstance(raw, dict):
        raise BadRequestError(f"{where} must be an object with name, shape, datatype and data")
    name = raw.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
        raise BadRequestError(f"{where}.name must be a string of 1-{_MAX_NAME} characters")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidRequestError(
            f"input {name!r}: unknown datatype {datatype!r:.40}; "
            f"expected one of {', '.join(DATATYPES)}"
        )
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise BadRequestError(f"input {name!r}: shape must be a list of non-negative integers")
    if len(shape) > limits.max_rank:
        raise LimitExceededError(
            f"input {name!r} has rank {len(shape)}; the limit is {limits.max_rank}"
        )
    # Zero dims count as one so that [0, 10**30] is refused here, not by numpy.
    itemsize = max(1, DATATYPES[datatype].itemsize if datatype != "BYTES" else 4)
    if math.prod(max(d, 1) for d in shape) * itemsize > limits.max_tensor_bytes:
        raise LimitExceededError(
            f"input {name!r} of shape {shape!s:.80} is above the limit of "
            f"{limits.max_tensor_bytes} bytes"
        )
    return name, str(datatype), tuple(shape)


def _tensor_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: object, limits: Limits
) -> np.ndarray:
    if isinstance(data, NumberSpan):  # straight from the body's text, or refused from it
        array = data.to_array(name, datatype, DATATYPES[datatype], shape)
        if array is not None:
            return array
        try:
            data = data.slow()  # BYTES of the right shape: the strings are the elements
        except (ValueError, RecursionError) as e:
            raise BadRequestError(f"the request is not valid JSON: {e}") from None
    flat = _flatten(data, shape, name)
    count = math.prod(shape)
    if len(flat) != count:
        raise InvalidRequestError(
            f"input {name!r}: shape {list(shape)} holds {count} elements but 'data' has {len(flat)}"
        )
    if datatype == "BYTES":
        if not all(type(v) is str for v in flat):
            raise InvalidRequestError(f"input {name!r}: BYTES data must be strings in JSON")
        try:
            encoded = [v.encode() for v in flat]
        except UnicodeEncodeError:  # a lone surrogate ("\ud800") is valid JSON, not UTF-8
            raise InvalidRequestError(f"input {name!r}: a string is not valid Unicode") from None
        if sum(map(len, encoded)) + count * _OBJECT_POINTER > limits.max_tensor_bytes:
            raise LimitExceededError(f"input {name!r} is above {limits.max_tensor_bytes} bytes")
        array = np.empty(count, dtype=object)
        array[:] = encoded
        return array.reshape(shape)
    dtype = DATATYPES[datatype]
    if datatype == "BOOL":
        ok = all(type(v) is bool for v in flat)
        kind = "true or false"
    elif dtype.kind in "iu":
        ok = all(type(v) is int for v in flat)
        kind = "integers"
    else:
        ok = all(type(v) in _NUMBER for v in flat)
        kind = "numbers"
    if not ok:
        raise InvalidRequestError(f"input {name!r}: {datatype} data must be {kind}")
    try:
        with np.errstate(over="ignore"):  # floats beyond FP16/FP32's range become inf
            return np.asarray(flat, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError):  # an integer outside the datatype's range
        raise InvalidRequestError(f"input {name!r}: a value does not fit {datatype}") from None


def _flatten(data: object, shape: tuple[int, ...], name: str) -> list[Any]:
    """Row-major elements of a flat list, or of lists nested exactly as ``shape``."""
    if not isinstance(data, list):
        raise InvalidRequestError(f"input {name!r}: 'data' must be a list")
    if not any(isinstance(v, list) for v in data):
        return data
    level: list[Any] = [data]
    for dim in shape:
        if any(not isinstance(v, list) or len(v) != dim for v in level):
            raise InvalidRequestError(
                f"input {name!r}: nested 'data' does not match shape {list(shape)}"
            )
        level = [item for v in level for item in v]
    return level


def _requested_outputs(raw: object) -> tuple[RequestedOutput, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequestError("'outputs' must be a list of {name, parameters} objects")
    seen: set[str] = set()
    outputs = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequestError(f"outputs[{i}] must be an object with a name")
        name = item.get("name")
        if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
            raise BadRequestError(f"outputs[{i}].name must be a string of 1-{_MAX_NAME} characters")
        if name in seen:
            raise BadRequestError(f"output {name!r} is requested twice")
        seen.add(name)
        parameters = _parameters(item, f"output {name!r}")
        if "classification" in parameters:
            raise BadRequestError("the classification extension is not supported")
        binary = _optional_bool(parameters, "binary_data", f"output {name!r}")
        outputs.append(RequestedOutput(name, binary))
    return tuple(outputs)


def _parameters(owner: dict[str, Any], where: str) -> dict[str, Any]:
    parameters = owner.get("parameters", {})
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise BadRequestError(f"{where}: 'parameters' must be an object")
    unsupported = [k for k in _UNSUPPORTED if k in parameters]
    if unsupported:
        raise BadRequestError(f"{where}: shared memory ({unsupported[0]}) is not supported")
    return parameters


def _optional_bool(parameters: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = parameters.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadRequestError(f"{where} {key!r} must be true or false")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_data(array: np.ndarray, name: str) -> list[Any]:
    flat = array.reshape(-1)
    if flat.dtype.kind not in "OSU":
        return list(flat.tolist())
    try:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in flat.tolist()]
    except UnicodeDecodeError:
        raise InvalidRequestError(
            f"output {name!r} holds bytes that are not UTF-8; ask for it with binary_data: true"
        ) from None


def check_requested_outputs(info: ModelInfo, request: InferRequest) -> None:
    """Refuse unknown requested outputs before compute, not after."""
    if request.outputs is None or not info.outputs:
        return
    known = {s.name for s in info.outputs}
    unknown = [o.name for o in request.outputs if o.name not in known]
    if unknown:
        raise InvalidRequestError(
            f"model {info.model}@{info.version} has no output {unknown[0]!r}; "
            f"it has {sorted(known)}"
        )
