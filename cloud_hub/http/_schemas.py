"""Pydantic models of the protocol's JSON objects, for the OpenAPI document only.

The routes read and write bodies themselves (``_codec``): an infer body may
be JSON followed by raw bytes, which no JSON validator can take, and tensor
data is checked against sizes before it is turned into arrays. These models
exist so that ``/openapi.json`` describes the JSON protocol with the
KServe v2 names ($inference_request, $inference_response, …).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ErrorResponse",
    "InferenceRequest",
    "InferenceResponse",
    "LiveResponse",
    "MetadataTensor",
    "ModelMetadata",
    "ModelReadyResponse",
    "ReadyResponse",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "ServerMetadata",
]


def _parameters() -> Any:
    return Field(
        default=None,
        description="Extension parameters. Inputs: binary_data_size (int, bytes of this tensor "
        "after the JSON). Outputs: binary_data (bool). Request: binary_data_output (bool), "
        "timeout (int, microseconds).",
    )


def _data() -> Any:
    return Field(
        default=None,
        description="Elements in row-major order, flat or nested as 'shape': numbers, "
        "true/false for BOOL, strings for BYTES. Absent when sent as binary data.",
    )


class _Model(BaseModel):
    model_config = ConfigDict(protected_namespaces=(), extra="allow")


class ErrorResponse(_Model):
    """Every error: the protocol's $inference_error_response."""

    error: str = Field(description="What went wrong, in one line.")


class ServerMetadata(_Model):
    name: str
    version: str
    extensions: list[str] = Field(
        description="Protocol extensions served, e.g. binary_tensor_data."
    )


class LiveResponse(_Model):
    live: bool


class ReadyResponse(_Model):
    ready: bool


class ModelReadyResponse(_Model):
    name: str
    ready: bool


class MetadataTensor(_Model):
    name: str
    datatype: str = Field(description="FP32, INT64, BYTES, …")
    shape: list[int] = Field(description="-1 for a dimension of any size, the batch one included.")


class ModelMetadata(_Model):
    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class RequestInput(_Model):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = _parameters()
    data: list[Any] | None = _data()


class RequestOutput(_Model):
    name: str
    parameters: dict[str, Any] | None = _parameters()


class InferenceRequest(_Model):
    """$inference_request: the JSON part of an infer body."""

    id: str | None = None
    parameters: dict[str, Any] | None = _parameters()
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = Field(
        default=None, description="The outputs wanted, in this order; absent: all of them."
    )


class ResponseOutput(_Model):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = _parameters()
    data: list[Any] | None = _data()


class InferenceResponse(_Model):
    """$inference_response: the JSON part of an infer response."""

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[ResponseOutput]
