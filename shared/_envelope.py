"""The versioned binary frame that carries every request and reply.

Layout (all integers little-endian)::

    offset  size  field
    0       4     magic b"TNDM"
    4       1     format major version (this build: 1; another major is refused)
    5       1     format minor version (newer minors are read; unknown header fields kept)
    6       2     flags (reserved, 0)
    8       4     header length H
    12      H     header: UTF-8 JSON object
    12+H    …     tensor payload, in the order of header["tensors"]

Header fields: ``kind`` ("request" | "reply"), ``id`` (correlation id),
``model``, ``version``, ``reply_to``, ``timeout_ms`` (the budget left when the
message was sent: a relative figure, so clocks need not agree), ``device``,
``sent_at_ms``, ``error`` ({"code", "message"}), ``timing`` (hub-side
milliseconds), ``tensors`` (descriptors, see ``_tensors``), ``traceparent`` and
``tracestate`` (W3C trace context, written only when the sender traces the
request: ``_trace_context``). Fields this build does not know are kept in
``Message.extra`` and written back unchanged.

A ``traceparent`` or ``tracestate`` that is not valid W3C trace context is
dropped on decode (the request is still read and answered, without trace
context); the constructor refuses one, so this build never writes a bad one.

The header must be strict UTF-8 JSON: an object, nested at most
``_MAX_HEADER_DEPTH`` deep, without NaN/Infinity or numbers that overflow a
float, so that whatever decodes also encodes again.

``decode_message`` checks the frame against ``Limits`` before it allocates;
``decode_header`` reads only the header, so a hub can still answer a request
whose tensors are bad.
"""

from __future__ import annotations

import json
import math
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ._errors import ErrorCode, FrameError, LimitExceededError, UnsupportedVersionError
from ._limits import Limits
from ._tensors import TransferOptions, decode_tensors, encode_tensors
from ._trace_context import parse_traceparent, parse_tracestate

__all__ = [
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "MAGIC",
    "Message",
    "ReplyTiming",
    "decode_header",
    "decode_message",
    "encode_message",
    "new_request_id",
]

MAGIC = b"TNDM"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
_PREFIX = struct.Struct("<4sBBHI")
_KNOWN = frozenset(
    {
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
        "traceparent",
        "tracestate",
    }
)
_MAX_ID = 128
_MAX_TOPIC = 512
_MAX_HEADER_DEPTH = 32


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class ReplyTiming:
    """Where a reply's time went inside the hub, in milliseconds (the header's ``timing``).

    ``queue_ms``: from receipt until its batch started computing; ``compute_ms``:
    that batch's compute; ``hub_ms``: from receipt until the reply was encoded
    (the device subtracts it from its round trip to estimate the network).
    Other keys a newer hub sends are kept in ``extra``.
    """

    queue_ms: float = 0.0
    compute_ms: float = 0.0
    hub_ms: float | None = None  # None: queue_ms + compute_ms
    extra: dict[str, float] = field(default_factory=dict)

    _KEYS = ("queue_ms", "compute_ms", "hub_ms")

    @property
    def total_ms(self) -> float:
        """``hub_ms``, or what queue and compute add up to when the hub did not say."""
        return self.queue_ms + self.compute_ms if self.hub_ms is None else self.hub_ms

    def to_dict(self) -> dict[str, float]:
        timing = dict(self.extra)
        timing["queue_ms"] = round(self.queue_ms, 3)
        timing["compute_ms"] = round(self.compute_ms, 3)
        if self.hub_ms is not None:
            timing["hub_ms"] = round(self.hub_ms, 3)
        return timing

    @classmethod
    def from_dict(cls, timing: dict[str, float]) -> ReplyTiming:
        hub_ms = timing.get("hub_ms")
        return cls(
            queue_ms=float(timing.get("queue_ms", 0.0)),
            compute_ms=float(timing.get("compute_ms", 0.0)),
            hub_ms=None if hub_ms is None else float(hub_ms),
            extra={k: v for k, v in timing.items() if k not in cls._KEYS},
        )


@dataclass(kw_only=True)
class Message:
    """One request or reply. Validates its fields in the constructor."""

    kind: Literal["request", "reply"]
    request_id: str
    model: str
    model_version: str | None = None
    reply_to: str | None = None
    timeout_ms: float | None = None
    device_id: str | None = None
    sent_at_ms: float | None = None
    error: ErrorCode = ErrorCode.OK
    error_message: str = ""
    timing: dict[str, float] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    traceparent: str | None = None  # W3C trace context of the sender's span, if it traces
    tracestate: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("request", "reply"):
            raise FrameError(f"kind must be 'request' or 'reply', got {self.kind!r}")
        _check_str(self.request_id, "id", _MAX_ID, required=True)
        _check_str(self.model, "model", 128, required=True)
        _check_str(self.model_version, "version", 64)
        _check_str(self.reply_to, "reply_to", _MAX_TOPIC)
        if self.reply_to is not None and (
            "+" in self.reply_to or "#" in self.reply_to or "\0" in self.reply_to
        ):
            raise FrameError("reply_to may not contain MQTT wildcards")
        _check_str(self.device_id, "device", 128)
        for name in ("timeout_ms", "sent_at_ms"):
            value = getattr(self, name)
            if value is not None and (not _is_finite_number(value) or value < 0):
                raise FrameError(f"{name} must be a non-negative number, got {value!r:.80}")
        if not isinstance(self.error, ErrorCode):
            self.error = ErrorCode.parse(self.error)
        if not isinstance(self.error_message, str):
            raise FrameError("error_message must be a string")
        if not isinstance(self.timing, dict) or not all(
            isinstance(k, str) and _is_finite_number(v) for k, v in self.timing.items()
        ):
            raise FrameError("timing must be an object of finite numbers")
        if not isinstance(self.extra, dict) or not all(isinstance(k, str) for k in self.extra):
            raise FrameError("extra must be a dict with string keys")
        if self.traceparent is not None and parse_traceparent(self.traceparent) is None:
            raise FrameError(f"traceparent is not W3C trace context: {self.traceparent!r:.80}")
        if self.tracestate is not None and parse_tracestate(self.tracestate) is None:
            raise FrameError(f"tracestate is not a W3C tracestate: {self.tracestate!r:.80}")

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.OK

    @property
    def reply_timing(self) -> ReplyTiming:
        """``timing`` read as the hub's ``ReplyTiming``."""
        return ReplyTiming.from_dict(self.timing)

    def reply(
        self,
        *,
        tensors: dict[str, np.ndarray] | None = None,
        error: ErrorCode = ErrorCode.OK,
        error_message: str = "",
        model_version: str | None = None,
        timing: ReplyTiming | dict[str, float] | None = None,
    ) -> Message:
        """The reply to this request, correlated by id."""
        if isinstance(timing, ReplyTiming):
            timing = timing.to_dict()
        return Message(
            kind="reply",
            request_id=self.request_id,
            model=self.model,
            model_version=model_version or self.model_version,
            device_id=self.device_id,
            error=error,
            error_message=error_message[:1000],
            timing=dict(timing or {}),
            tensors=dict(tensors or {}),
        )


def encode_message(message: Message, options: TransferOptions | None = None) -> bytes:
    """Serialize ``message`` into one frame."""
    descriptors, chunks = encode_tensors(message.tensors, options)
    # Known fields come from the attributes only, never from a stale copy in ``extra``.
    header: dict[str, Any] = {k: v for k, v in message.extra.items() if k not in _KNOWN}
    header.update(
        kind=message.kind, id=message.request_id, model=message.model, tensors=descriptors
    )
    optional = {
        "version": message.model_version,
        "reply_to": message.reply_to,
        "timeout_ms": message.timeout_ms,
        "device": message.device_id,
        "sent_at_ms": message.sent_at_ms,
        "timing": message.timing or None,
        "traceparent": message.traceparent,
        "tracestate": message.tracestate,
    }
    header.update({k: v for k, v in optional.items() if v is not None})
    if not message.ok:
        header["error"] = {"code": message.error.value, "message": message.error_message}
    try:
        raw = _ENCODER.encode(header).encode()
    except (TypeError, ValueError, RecursionError) as e:  # ``extra`` that JSON cannot carry
        raise FrameError(f"header cannot be written as JSON: {e}") from e
    return b"".join([_PREFIX.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(raw)), raw, *chunks])


def pack_frame(header: dict[str, Any], payload: list[bytes]) -> bytes:
    """One frame of this layout from a header object and payload parts (the text wire's)."""
    try:
        raw = _ENCODER.encode(header).encode()
    except (TypeError, ValueError, RecursionError) as e:
        raise FrameError(f"header cannot be written as JSON: {e}") from e
    return b"".join([_PREFIX.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(raw)), raw, *payload])


def split_frame(
    data: bytes | bytearray | memoryview, limits: Limits
) -> tuple[dict[str, Any], memoryview]:
    """The checked header and the payload of one frame (every size checked against ``limits``)."""
    return _split(memoryview(data), limits)


def decode_header(
    data: bytes | bytearray | memoryview, limits: Limits | None = None
) -> dict[str, Any]:
    """Read and return the JSON header only (raises ``ProtocolError`` subclasses)."""
    return _split(memoryview(data), limits or Limits())[0]


def decode_message(data: bytes | bytearray | memoryview, limits: Limits | None = None) -> Message:
    """Parse one frame into a ``Message``, checking every size before allocating."""
    limits = limits or Limits()
    header, payload = _split(memoryview(data), limits)
    error = header.get("error")
    code, text = ErrorCode.OK, ""
    if error is not None:
        if not isinstance(error, dict):
            raise FrameError("error must be an object with 'code' and 'message'")
        code = ErrorCode.parse(error.get("code"))
        text = str(error.get("message", ""))[:1000]
    # The cheap fields are checked before any tensor is allocated.
    message = Message(
        kind=header.get("kind"),  # type: ignore[arg-type]  # validated in __post_init__
        request_id=header.get("id"),  # type: ignore[arg-type]
        model=header.get("model"),  # type: ignore[arg-type]
        model_version=header.get("version"),
        reply_to=header.get("reply_to"),
        timeout_ms=header.get("timeout_ms"),
        device_id=header.get("device"),
        sent_at_ms=header.get("sent_at_ms"),
        error=code,
        error_message=text,
        timing=header.get("timing") or {},
        extra={k: v for k, v in header.items() if k not in _KNOWN},
    )
    if "traceparent" in header:  # set after the constructor: a bad value is dropped, not raised
        message.traceparent = parse_traceparent(header["traceparent"])
        if message.traceparent is not None:
            message.tracestate = parse_tracestate(header.get("tracestate"))
    message.tensors = decode_tensors(header.get("tensors", []), payload, limits)
    return message


def _split(view: memoryview, limits: Limits) -> tuple[dict[str, Any], memoryview]:
    if len(view) > limits.max_frame_bytes:
        raise LimitExceededError(
            f"frame of {len(view)} bytes; the limit is {limits.max_frame_bytes}"
        )
    if len(view) < _PREFIX.size:
        raise FrameError(
            f"frame of {len(view)} bytes is shorter than the {_PREFIX.size}-byte prefix"
        )
    magic, major, _minor, _flags, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise FrameError(f"not a Tandem frame (magic {bytes(magic)!r})")
    if major != FORMAT_MAJOR:
        raise UnsupportedVersionError(f"frame format {major}.x; this build speaks {FORMAT_MAJOR}.x")
    if header_len > limits.max_header_bytes:
        raise LimitExceededError(
            f"header of {header_len} bytes; the limit is {limits.max_header_bytes}"
        )
    end = _PREFIX.size + header_len
    if end > len(view):
        raise FrameError(f"header claims {header_len} bytes but the frame is truncated")
    try:
        # Decoded here, strictly: json.loads(bytes) would also take UTF-16/32 and lone
        # surrogates. ValueError covers integers longer than Python's digit limit.
        text = str(view[_PREFIX.size : end], "utf-8")
        header = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise FrameError(f"header is not valid UTF-8 JSON: {e}") from e
    if not isinstance(header, dict):
        raise FrameError("header must be a JSON object")
    # Each container nested in the header opened with a bracket of its own, so with
    # fewer brackets in the text than the depth limit (strings' brackets only add to
    # the count) no value can sit too deep: the walk is needed only beyond that.
    if text.count("{") + text.count("[") >= _MAX_HEADER_DEPTH:
        _check_depth(header)
    return header, view[end:]


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed in a header")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text:.40} overflows a float")
    return value


# Built once: json.loads and json.dumps build a new decoder or encoder on every call
# that passes options, which costs more than reading a small header.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _check_depth(header: dict[str, Any]) -> None:
    stack: list[tuple[object, int]] = [(header, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > _MAX_HEADER_DEPTH:
            raise FrameError(f"header is nested more than {_MAX_HEADER_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def _is_finite_number(value: object) -> bool:
    if type(value) is float:  # the common case, first
        return math.isfinite(value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _check_str(value: object, what: str, max_len: int, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise FrameError(f"{what} must be a string of 1-{max_len} characters, got {value!r:.80}")
    if value.isascii():  # the common case; no surrogate is ASCII
        return
    try:
        value.encode("utf-8")  # lone surrogates from JSON escapes cannot go on the wire
    except UnicodeEncodeError as e:
        raise FrameError(f"{what} is not valid Unicode: {value!r:.80}") from e
