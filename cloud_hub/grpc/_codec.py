"""The KServe v2 gRPC messages (``ModelInferRequest`` / ``ModelInferResponse``) <-> numpy.

Pure: protobuf messages in, numpy out (and back), no I/O, no clock. A request's
tensors come either all in ``raw_input_contents`` (one bytes entry per input,
in input order, little-endian row-major without padding; a BYTES element is a
4-byte little-endian length and its bytes: ``shared``'s tensor layout, decoded
by ``shared.decode_tensors``, the same as HTTP's binary tensors), or each in
its ``contents``, in the field of its datatype (``CONTENTS_FIELD``: INT8 to
INT32 in ``int_contents``, UINT8 to UINT32 in ``uint_contents``; FP16 has no
typed field and travels raw only). Mixing the two in one request is refused,
as Triton does.

Checks, before anything is allocated from what a client declares: at most
``limits.max_tensors`` inputs, each with a name of 1-256 characters, a known
datatype, a shape of at most ``max_rank`` non-negative dims whose size stays
within ``max_tensor_bytes`` (all inputs together within
``max_total_tensor_bytes``); the element count equals the shape's product; a
typed value fits its datatype (300 in an INT8 is refused, not wrapped); only
the datatype's own contents field is set. Request parameters: ``timeout``
(Triton's, microseconds, int64 or uint64, 0: none) is read; shared-memory and
classification parameters are refused (we would silently get them wrong);
others are kept and ignored, as HTTP does. Errors are ``BadRequestError``
(malformed request, unsupported feature), ``InvalidRequestError`` (data that
does not fit its datatype or shape), ``LimitExceededError`` and ``TensorError``
(from ``shared``): the servicer maps each to a gRPC status.

A response carries every output in ``raw_output_contents`` (what Triton
answers and its clients read first), in the requested order, or the model's
order when none was named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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

from .._errors import BadRequestError, InvalidRequestError
from ..http import InferRequest, RequestedOutput
from . import inference_pb2 as pb

__all__ = [
    "CONTENTS_FIELD",
    "decode_model_infer",
    "encode_model_infer",
    "parameter_value",
]

CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_MAX_NAME = 256
_MAX_ID = 256
_OBJECT_POINTER = np.dtype(object).itemsize
_MAX_TIMEOUT_US = 2**64 - 1
_UNSUPPORTED = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def parameter_value(parameter: pb.InferParameter) -> bool | int | float | str | None:
    """The value an ``InferParameter`` holds (None when it holds none)."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def decode_model_infer(request: pb.ModelInferRequest, *, limits: Limits) -> InferRequest:
    """Decode a ``ModelInferRequest`` (see the module docstring for every check made)."""
    if len(request.id) > _MAX_ID:
        raise BadRequestError(f"'id' must be at most {_MAX_ID} characters")
    parameters = _parameters(request.parameters, "the request")
    timeout = parameters.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int)
        or not 0 <= timeout <= _MAX_TIMEOUT_US
    ):  # fmt: skip
        raise BadRequestError(
            "request parameter 'timeout' must be an integer of microseconds, 0 to 2**64 - 1"
        )
    outputs = []
    seen: set[str] = set()
    for i, wanted in enumerate(request.outputs):
        name = _name(wanted.name, f"outputs[{i}].name")
        if name in seen:
            raise BadRequestError(f"output {name!r} is requested twice")
        seen.add(name)
        _parameters(wanted.parameters, f"output {name!r}")
        outputs.append(RequestedOutput(name))
    return InferRequest(
        inputs=_decode_inputs(request, limits),
        id=request.id or None,
        outputs=tuple(outputs) or None,
        timeout_us=timeout or None,
        parameters=parameters,
    )


def encode_model_infer(
    outputs: Mapping[str, np.ndarray],
    *,
    model: str,
    version: str,
    request_id: str | None = None,
    requested: Sequence[RequestedOutput] | None = None,
) -> pb.ModelInferResponse:
    """The response: every output's bytes in ``raw_output_contents``."""
    names = list(outputs) if requested is None else [r.name for r in requested]
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id or "")
    for name in names:
        array = outputs.get(name)
        if array is None:
            raise InvalidRequestError(
                f"model {model!r} has no output {name!r}; it has {sorted(outputs)}"
            )
        response.outputs.add(name=name, datatype=datatype_of(array), shape=array.shape)
        _, parts = encode_tensors({name: array})
        response.raw_output_contents.append(parts[0] if len(parts) == 1 else b"".join(parts))
    return response


# -- request parts -------------------------------------------------------------------------


def _decode_inputs(request: pb.ModelInferRequest, limits: Limits) -> dict[str, np.ndarray]:
    inputs = request.inputs
    if not inputs:
        raise BadRequestError("'inputs' must be a non-empty list of tensors")
    if len(inputs) > limits.max_tensors:
        raise LimitExceededError(
            f"{len(inputs)} inputs in one request; the limit is {limits.max_tensors}"
        )
    raw = request.raw_input_contents
    if raw and len(raw) != len(inputs):
        raise BadRequestError(
            f"raw_input_contents has {len(raw)} entries for {len(inputs)} inputs; "
            "send one per input, in input order"
        )
    out: dict[str, np.ndarray] = {}
    total = 0
    for i, tensor in enumerate(inputs):
        name = _name(tensor.name, f"inputs[{i}].name")
        if name in out:
            raise BadRequestError(f"input {name!r} appears twice")
        datatype, shape = _tensor_header(tensor, name, limits)
        count = math.prod(shape)
        itemsize = _OBJECT_POINTER if datatype == "BYTES" else DATATYPES[datatype].itemsize
        total += count * itemsize
        if total > limits.max_total_tensor_bytes:
            raise LimitExceededError(
                f"inputs would take more than {limits.max_total_tensor_bytes} bytes in all"
            )
        _parameters(tensor.parameters, f"input {name!r}")
        has_contents = tensor.HasField("contents") and bool(tensor.contents.ListFields())
        if raw:
            if has_contents:
                raise BadRequestError(
                    f"input {name!r} has contents but the request has raw_input_contents; "
                    "send every input one way"
                )
            size = len(raw[i])
            descriptor = {"name": name, "datatype": datatype, "shape": list(shape),
                          "nbytes": size, "raw_nbytes": size}  # fmt: skip
            out[name] = decode_tensors([descriptor], raw[i], limits)[name]
        elif has_contents:
            out[name] = _from_contents(name, datatype, shape, tensor.contents, limits)
        elif count == 0:  # an empty tensor has no values to carry
            out[name] = np.empty(shape, dtype=DATATYPES[datatype])
        else:
            raise BadRequestError(f"input {name!r} has neither contents nor raw_input_contents")
    return out


def _name(value: str, where: str) -> str:
    if not 0 < len(value) <= _MAX_NAME:
        raise BadRequestError(f"{where} must be a string of 1-{_MAX_NAME} characters")
    return value


def _tensor_header(
    tensor: pb.ModelInferRequest.InferInputTensor, name: str, limits: Limits
) -> tuple[str, tuple[int, ...]]:
    datatype = tensor.datatype
    if datatype not in DATATYPES:
        raise InvalidRequestError(
            f"input {name!r}: unknown datatype {datatype!r:.40}; "
            f"expected one of {', '.join(DATATYPES)}"
        )
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise BadRequestError(f"input {name!r}: shape must be non-negative integers")
    if len(shape) > limits.max_rank:
        raise LimitExceededError(
            f"input {name!r} has rank {len(shape)}; the limit is {limits.max_rank}"
        )
    # Zero dims count as one so that [0, 10**18] is refused here, not by numpy.
    itemsize = max(1, DATATYPES[datatype].itemsize if datatype != "BYTES" else 4)
    if math.prod(max(d, 1) for d in shape) * itemsize > limits.max_tensor_bytes:
        raise LimitExceededError(
            f"input {name!r} of shape {list(shape)!s:.80} is above the limit of "
            f"{limits.max_tensor_bytes} bytes"
        )
    return datatype, shape


def _from_contents(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    contents: pb.InferTensorContents,
    limits: Limits,
) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequestError(f"input {name!r}: {datatype} travels in raw_input_contents only")
    others = [f.name for f, _ in contents.ListFields() if f.name != field]
    if others:
        raise InvalidRequestError(
            f"input {name!r}: {datatype} data goes in contents.{field}, not {others[0]}"
        )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidRequestError(
            f"input {name!r}: shape {list(shape)} holds {count} elements but "
            f"contents.{field} has {len(values)}"
        )
    if datatype == "BYTES":
        if sum(map(len, values)) + count * _OBJECT_POINTER > limits.max_tensor_bytes:
            raise LimitExceededError(f"input {name!r} is above {limits.max_tensor_bytes} bytes")
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = DATATYPES[datatype]
    if dtype.kind in "iu" and dtype.itemsize < 4:  # carried in 32 bits: must fit the type
        wide = np.fromiter(values, dtype=np.int64 if dtype.kind == "i" else np.uint64, count=count)
        limits_of = np.iinfo(dtype)
        if count and (wide.min() < limits_of.min or wide.max() > limits_of.max):
            raise InvalidRequestError(f"input {name!r}: a value does not fit {datatype}")
        return wide.astype(dtype).reshape(shape)
    return np.fromiter(values, dtype=dtype, count=count).reshape(shape)


def _parameters(parameters: Mapping[str, pb.InferParameter], where: str) -> dict[str, Any]:
    unsupported = [k for k in _UNSUPPORTED if k in parameters]
    if unsupported:
        raise BadRequestError(f"{where}: shared memory ({unsupported[0]}) is not supported")
    if "classification" in parameters:
        raise BadRequestError("the classification extension is not supported")
    return {key: parameter_value(value) for key, value in parameters.items()}
