"""Tandem's wire protocol: topics, the binary envelope, the tensor codec, limits, errors.

Pure and small: numpy and the standard library (zstandard on demand,
paho-mqtt only inside the MQTT helpers).
"""

from ._envelope import (
    FORMAT_MAJOR,
    FORMAT_MINOR,
    MAGIC,
    Message,
    decode_header,
    decode_message,
    encode_message,
    new_request_id,
)
from ._errors import (
    ConfigError,
    ErrorCode,
    FrameError,
    LimitExceededError,
    ProtocolError,
    TandemError,
    TensorError,
    UnsupportedVersionError,
)
from ._limits import Limits
from ._mqtt import MqttSettings, TlsSettings, create_client, resolve_protocol
from ._tensors import (
    DATATYPES,
    TransferOptions,
    datatype_of,
    decode_tensors,
    encode_tensors,
    numpy_dtype,
    shape_compatible,
)
from ._topics import NAME_PATTERN, Topics, validate_name

__all__ = [
    "DATATYPES",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "MAGIC",
    "NAME_PATTERN",
    "ConfigError",
    "ErrorCode",
    "FrameError",
    "LimitExceededError",
    "Limits",
    "Message",
    "MqttSettings",
    "ProtocolError",
    "TandemError",
    "TensorError",
    "TlsSettings",
    "Topics",
    "TransferOptions",
    "UnsupportedVersionError",
    "create_client",
    "datatype_of",
    "decode_header",
    "decode_message",
    "decode_tensors",
    "encode_message",
    "encode_tensors",
    "new_request_id",
    "numpy_dtype",
    "resolve_protocol",
    "shape_compatible",
    "validate_name",
]
