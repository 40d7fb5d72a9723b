"""The text-generation wire: a device's turns and cancels, the hub's chunks and final.

Topics (``Topics``)::

    {prefix}/dev/{device}/generate/{model}  GenerateRequest   device -> hubs (shared group)
    {prefix}/dev/{device}/generate/{model}/{hub}  GenerateRequest  device -> that hub replica
    {prefix}/dev/{device}/cancel            GenerateCancel    device -> every hub (not shared)
    {prefix}/dev/{device}/text              GenerateChunk...  hub -> that device, then one
                                            GenerateFinal

The hub answers on the text topic of the device whose generate topic the
request came on, never on an address a request names. Cancels have a topic
of their own that every hub subscribes to plainly: with a shared
subscription a cancel could reach a replica other than the one running the
turn.

Frames are the envelope's (``_envelope``: magic, format version, a strict
JSON header), with ``kind`` one of ``generate``, ``cancel``, ``chunk``,
``final``. Text and token ids travel in the payload, described by the
header: ``text_bytes`` of UTF-8, then ``token_count`` little-endian int32
ids; both sizes are checked against ``Limits`` (``max_text_bytes``,
``max_token_ids``) and against the payload's length before anything is
sliced. Text must be strict UTF-8 (no lone surrogates), ids in 0..2**31-1.

Order: the chunks of one turn carry ``seq`` 0, 1, 2, ...; the final carries
``seq`` = the number of chunks before it (the last chunk's seq + 1), so a
receiver knows when it has every chunk even if QoS 1 reorders or repeats
them. Finish reasons: ``stop``, ``length``, ``deadline``, ``cancelled``,
``error``; an ``error`` final carries an ``ErrorCode`` other than ``ok``
and every other final carries ``ok``.

Chunks and finals name the hub replica that sent them (``hub``, a hub id;
absent from hubs of earlier builds): a device sends a conversation's next
turn to that replica's own generate topic, where its KV cache is.

Every message validates in its constructor, so decoding builds one or
raises a ``ProtocolError`` subclass; header fields this build does not know
are kept in ``extra`` and written back. Never pickle.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._envelope import split_frame
from ._errors import ErrorCode, FrameError, LimitExceededError
from ._frame_fields import (
    IDS,
    MAX_ERROR_MESSAGE,
    MAX_TOKEN_ID,
    check_extra,
    check_id,
    check_ids,
    check_max_tokens,
    check_name,
    error_of,
    ids_of,
    is_int,
    is_number,
    kind_and_extra,
    pack_message,
)
from ._limits import Limits

__all__ = [
    "GenerateCancel",
    "GenerateChunk",
    "GenerateFinal",
    "GenerateFinish",
    "GenerateRequest",
    "TextMessage",
    "TextSampling",
    "decode_text_message",
    "encode_text_message",
]

_MAX_CONVERSATION = 128


class GenerateFinish(enum.StrEnum):
    STOP = "stop"  # the model ended its text
    LENGTH = "length"  # max_tokens, the context, or the hub's time limit per turn
    DEADLINE = "deadline"  # the request's time budget ran out at the hub
    CANCELLED = "cancelled"  # the device cancelled, or the hub is stopping
    ERROR = "error"  # see the final's error code


@dataclass(frozen=True, kw_only=True)
class TextSampling:
    """How the hub picks tokens: greedy unless ``temperature`` is given (> 0)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        t, p, k, s = self.temperature, self.top_p, self.top_k, self.seed
        if t is not None and not (is_number(t) and 0 < t < math.inf):
            raise FrameError(f"sampling.temperature must be a finite number > 0, got {t!r:.40}")
        if p is not None and not (is_number(p) and 0 < p <= 1):
            raise FrameError(f"sampling.top_p must be in (0, 1], got {p!r:.40}")
        if k is not None and not (is_int(k) and 1 <= k <= MAX_TOKEN_ID):
            raise FrameError(f"sampling.top_k must be an integer >= 1, got {k!r:.40}")
        if s is not None and not (is_int(s) and 0 <= s < 2**63):
            raise FrameError(f"sampling.seed must be an integer in 0..2**63-1, got {s!r:.40}")

    @property
    def greedy(self) -> bool:
        return self.temperature is None

    def to_dict(self) -> dict[str, Any]:
        values = (
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("top_k", self.top_k),
            ("seed", self.seed),
        )
        return {k: v for k, v in values if v is not None}

    @classmethod
    def from_dict(cls, data: object) -> TextSampling:
        if data is None:
            return cls()
        if not isinstance(data, dict) or set(data) - {"temperature", "top_p", "top_k", "seed"}:
            raise FrameError("sampling must be an object of temperature, top_p, top_k, seed")
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    """One turn a device asks a hub to generate.

    ``prompt`` (text) and/or ``prompt_ids`` (token ids of the hub model's
    vocabulary): at least one, not empty; with both, the hub uses the ids.
    ``timeout_ms`` is the budget left when it was sent (relative: clocks need
    not agree), ``sent_at_ms`` the device's wall clock then. A conversation's
    turn names the ``conversation`` and its ``turn`` number, so a hub that
    keeps KV caches can find the one it holds. ``share``: the device lets the
    hub keep this turn (prompt and answer) for learning; off by default.
    """

    request_id: str
    model: str
    max_tokens: int
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    sampling: TextSampling = field(default_factory=TextSampling)
    device_id: str | None = None
    timeout_ms: float | None = None
    sent_at_ms: float | None = None
    conversation: str | None = None
    turn: int | None = None
    share: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id)
        check_name(self.model, "model")
        if self.device_id is not None:
            check_name(self.device_id, "device")
        if not (is_int(self.max_tokens) and self.max_tokens >= 1):
            raise FrameError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r:.40}")
        if self.prompt is None and self.prompt_ids is None:
            raise FrameError("a generate request needs a prompt (text or token ids)")
        if self.prompt is not None:
            _check_text(self.prompt, "prompt")
            if not self.prompt:
                raise FrameError("the prompt is empty")
        if self.prompt_ids is not None:
            object.__setattr__(self, "prompt_ids", check_ids(self.prompt_ids, "prompt_ids"))
            if not self.prompt_ids:
                raise FrameError("prompt_ids is empty")
        if not isinstance(self.sampling, TextSampling):
            raise FrameError("sampling must be a TextSampling")
        for name in ("timeout_ms", "sent_at_ms"):
            value = getattr(self, name)
            if value is not None and not (is_number(value) and 0 <= value < math.inf):
                raise FrameError(f"{name} must be a non-negative number, got {value!r:.40}")
        c = self.conversation
        if c is not None and not (
            isinstance(c, str) and 0 < len(c) <= _MAX_CONVERSATION and c.isprintable()
        ):
            raise FrameError("conversation must be 1-128 printable characters")
        if self.turn is not None and not (is_int(self.turn) and self.turn >= 0):
            raise FrameError(f"turn must be an integer >= 0, got {self.turn!r:.40}")
        if not isinstance(self.share, bool):
            raise FrameError("share must be true or false")
        check_extra(self.extra)


@dataclass(frozen=True, kw_only=True)
class GenerateCancel:
    """The device gave up on a turn: the hub frees its slot."""

    request_id: str
    device_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id)
        if self.device_id is not None:
            check_name(self.device_id, "device")
        check_extra(self.extra)


@dataclass(frozen=True, kw_only=True)
class GenerateChunk:
    """Text of a turn, in order by ``seq``; ``tokens`` counts the tokens it decodes."""

    request_id: str
    seq: int
    text: str
    token_ids: tuple[int, ...] = ()
    tokens: int | None = None  # None: len(token_ids)
    hub: str | None = None  # the hub replica that sent it
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id)
        if not (is_int(self.seq) and self.seq >= 0):
            raise FrameError(f"seq must be an integer >= 0, got {self.seq!r:.40}")
        if self.hub is not None:
            check_name(self.hub, "hub")
        _check_text(self.text, "text")
        object.__setattr__(self, "token_ids", check_ids(self.token_ids, "token_ids"))
        if self.tokens is None:
            object.__setattr__(self, "tokens", len(self.token_ids))
        elif not (is_int(self.tokens) and self.tokens >= 0):
            raise FrameError(f"tokens must be an integer >= 0, got {self.tokens!r:.40}")
        elif self.token_ids and self.tokens != len(self.token_ids):
            raise FrameError(f"tokens is {self.tokens} but {len(self.token_ids)} ids came")
        check_extra(self.extra)


@dataclass(frozen=True, kw_only=True)
class GenerateFinal:
    """The end of a turn: after ``seq`` chunks (0..seq-1), why it ended, and its usage."""

    request_id: str
    seq: int
    finish: GenerateFinish
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: ErrorCode = ErrorCode.OK
    error_message: str = ""
    model_version: str | None = None
    hub: str | None = None  # the hub replica that sent it
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id)
        if not (is_int(self.seq) and self.seq >= 0):
            raise FrameError(f"seq must be an integer >= 0, got {self.seq!r:.40}")
        if self.hub is not None:
            check_name(self.hub, "hub")
        try:
            object.__setattr__(self, "finish", GenerateFinish(self.finish))
        except ValueError:
            raise FrameError(f"unknown finish reason {self.finish!r:.40}") from None
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 0):
                raise FrameError(f"usage.{name} must be an integer >= 0, got {value!r:.40}")
        if not isinstance(self.error, ErrorCode):
            object.__setattr__(self, "error", ErrorCode.parse(self.error))
        if (self.finish is GenerateFinish.ERROR) != (self.error is not ErrorCode.OK):
            raise FrameError("a final has an error code exactly when its finish is 'error'")
        _check_text(self.error_message, "error message")
        object.__setattr__(self, "error_message", self.error_message[:MAX_ERROR_MESSAGE])
        if self.model_version is not None:
            check_name(self.model_version, "version")
        check_extra(self.extra)

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.OK


TextMessage = GenerateRequest | GenerateCancel | GenerateChunk | GenerateFinal

_KNOWN = {
    "generate": frozenset(
        [
            "kind",
            "id",
            "model",
            "max_tokens",
            "sampling",
            "device",
            "timeout_ms",
            "sent_at_ms",
            "conversation",
            "turn",
            "share",
            "text_bytes",
            "token_count",
        ]
    ),
    "cancel": frozenset({"kind", "id", "device"}),
    "chunk": frozenset({"kind", "id", "seq", "tokens", "hub", "text_bytes", "token_count"}),
    "final": frozenset({"kind", "id", "seq", "finish", "usage", "error", "version", "hub"}),
}


def encode_text_message(message: TextMessage) -> bytes:
    """One frame for ``message`` (``FrameError`` for ``extra`` that JSON cannot carry)."""
    header: dict[str, Any]
    payload: list[bytes] = []
    if isinstance(message, GenerateRequest):
        header = {
            "kind": "generate",
            "id": message.request_id,
            "model": message.model,
            "max_tokens": message.max_tokens,
        }
        optional = {
            "sampling": message.sampling.to_dict() or None,
            "device": message.device_id,
            "timeout_ms": message.timeout_ms,
            "sent_at_ms": message.sent_at_ms,
            "conversation": message.conversation,
            "turn": message.turn,
            "share": message.share or None,
        }
        header.update({k: v for k, v in optional.items() if v is not None})
        payload = _pack_text(header, message.prompt, message.prompt_ids)
        if message.prompt is None:
            header["text_bytes"] = None  # no text at all, as opposed to an empty one
    elif isinstance(message, GenerateCancel):
        header = {"kind": "cancel", "id": message.request_id}
        if message.device_id is not None:
            header["device"] = message.device_id
    elif isinstance(message, GenerateChunk):
        header = {"kind": "chunk", "id": message.request_id, "seq": message.seq}
        if message.tokens != len(message.token_ids):
            header["tokens"] = message.tokens
        if message.hub is not None:
            header["hub"] = message.hub
        payload = _pack_text(header, message.text, message.token_ids)
    elif isinstance(message, GenerateFinal):
        header = {
            "kind": "final",
            "id": message.request_id,
            "seq": message.seq,
            "finish": message.finish.value,
            "usage": {
                "prompt_tokens": message.prompt_tokens,
                "completion_tokens": message.completion_tokens,
                "cached_tokens": message.cached_tokens,
            },
        }
        if not message.ok:
            header["error"] = {"code": message.error.value, "message": message.error_message}
        if message.model_version is not None:
            header["version"] = message.model_version
        if message.hub is not None:
            header["hub"] = message.hub
    else:
        raise FrameError(f"not a text message: {type(message).__name__}")
    return pack_message(header, message.extra, _KNOWN, payload)


def decode_text_message(
    data: bytes | bytearray | memoryview, limits: Limits | None = None
) -> TextMessage:
    """Parse one frame (``ProtocolError`` subclasses; ``LimitExceededError`` over a limit)."""
    limits = limits or Limits()
    header, payload = split_frame(data, limits)
    kind, extra = kind_and_extra(header, _KNOWN)
    try:
        if kind == "cancel":
            if len(payload):
                raise FrameError("a cancel carries no payload")
            return GenerateCancel(
                request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
                device_id=header.get("device"),
                extra=extra,
            )
        if kind == "final":
            if len(payload):
                raise FrameError("a final carries no payload")
            return _final(header, extra)
        text, ids = _unpack_text(header, payload, limits)
        if kind == "chunk":
            return GenerateChunk(
                request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
                seq=header.get("seq"),  # type: ignore[arg-type]
                text="" if text is None else text,
                token_ids=ids,
                tokens=header.get("tokens"),
                hub=header.get("hub"),
                extra=extra,
            )
        max_tokens: Any = header.get("max_tokens")
        check_max_tokens(max_tokens, limits)
        return GenerateRequest(
            request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
            model=header.get("model"),  # type: ignore[arg-type]
            max_tokens=max_tokens,
            prompt=text,
            prompt_ids=ids if header.get("token_count") else None,
            sampling=TextSampling.from_dict(header.get("sampling")),
            device_id=header.get("device"),
            timeout_ms=header.get("timeout_ms"),
            sent_at_ms=header.get("sent_at_ms"),
            conversation=header.get("conversation"),
            turn=header.get("turn"),
            share=header.get("share", False),
            extra=extra,
        )
    except TypeError as e:  # a field of the wrong JSON type where a constructor takes **
        raise FrameError(f"malformed {kind} header: {e}") from e


def _final(header: dict[str, Any], extra: dict[str, Any]) -> GenerateFinal:
    usage = header.get("usage") or {}
    if not isinstance(usage, dict):
        raise FrameError("usage must be an object")
    code, message = error_of(header)
    return GenerateFinal(
        request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
        seq=header.get("seq"),  # type: ignore[arg-type]
        finish=header.get("finish"),  # type: ignore[arg-type]
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        cached_tokens=usage.get("cached_tokens", 0),
        error=code,
        error_message=message,
        model_version=header.get("version"),
        hub=header.get("hub"),
        extra=extra,
    )


def _pack_text(
    header: dict[str, Any], text: str | None, ids: tuple[int, ...] | None
) -> list[bytes]:
    raw = b"" if text is None else text.encode("utf-8")
    ids = ids or ()
    header["text_bytes"] = len(raw)
    header["token_count"] = len(ids)
    return [raw, np.asarray(ids, dtype=IDS).tobytes()] if ids else [raw]


def _unpack_text(
    header: dict[str, Any], payload: memoryview, limits: Limits
) -> tuple[str | None, tuple[int, ...]]:
    """Sizes checked against the limits and the payload first; then strict UTF-8, ids."""
    n_bytes, n_ids = header.get("text_bytes"), header.get("token_count", 0)
    if n_bytes is not None and not (is_int(n_bytes) and n_bytes >= 0):
        raise FrameError(f"text_bytes must be an integer >= 0, got {n_bytes!r:.40}")
    if not (is_int(n_ids) and n_ids >= 0):
        raise FrameError(f"token_count must be an integer >= 0, got {n_ids!r:.40}")
    if n_bytes is not None and n_bytes > limits.max_text_bytes:
        raise LimitExceededError(f"text of {n_bytes} bytes; the limit is {limits.max_text_bytes}")
    if n_ids > limits.max_token_ids:
        raise LimitExceededError(f"{n_ids} token ids; the limit is {limits.max_token_ids}")
    text_len = n_bytes or 0
    if text_len + IDS.itemsize * n_ids != len(payload):
        raise FrameError(
            f"header describes {text_len} text bytes and {n_ids} ids, "
            f"but the payload has {len(payload)} bytes"
        )
    text = None
    if n_bytes is not None:
        try:
            text = str(payload[:text_len], "utf-8")  # strict: no encoded surrogates either
        except UnicodeDecodeError as e:
            raise FrameError(f"text is not valid UTF-8: {e}") from e
    return text, ids_of(payload[text_len:])


def _check_text(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise FrameError(f"{what} must be text, got {type(value).__name__}")
    if value.isascii():
        return
    try:
        value.encode("utf-8")  # a lone surrogate cannot go on the wire
    except UnicodeEncodeError as e:
        raise FrameError(f"{what} is not valid Unicode (a lone surrogate?): {e}") from e
