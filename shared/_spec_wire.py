"""The speculative-decoding wire: a device's drafts to verify, the hub's verdict.

Topics (``Topics``)::

    {prefix}/dev/{device}/verify/{model}        VerifyRequest / VerifyClose  device -> hubs
                                                (shared group: a session's first round)
    {prefix}/dev/{device}/verify/{model}/{hub}  the same, for the replica holding the
                                                session's KV cache (its later rounds)
    {prefix}/dev/{device}/verified              VerifyResult  hub -> that device

The hub answers on the verified topic of the device whose verify topic the
request came on, never on an address a request names.

A **session** (``session``, the device's id for one turn) lives on one hub
replica: the committed token ids (prompt, then every token both sides
agreed on) and the KV cache of all of them but the last. A round sends
``base``, the number of committed ids the device believes the hub holds,
the ``committed`` ids the hub lacks (first round: the whole prompt,
``base`` 0; then none: the hub's own next token of the last round is
already in its list), and the ``drafts`` (at most ``MAX_DRAFTS``). ``base``
0 (re)starts the session from ``committed``; any other ``base`` the hub's
session does not match (it was evicted, or the replica restarted) is
answered ``resend``: the device sends its whole committed context again,
``base`` 0. Sampling rounds may carry the draft's distributions
(``draft_dists``: the bytes of ``shared.encode_draft_dists``, at most
``MAX_DIST_BYTES``).

The result says how many drafts were ``accepted`` and the hub's own next
``tokens`` (one, the "bonus"; none when the turn ended on an accepted
draft), and ``finish``: ``more`` (the turn goes on), ``stop`` (an
end-of-sequence token was committed), ``length`` (``max_tokens`` or the
hub's context reached), ``resend``, or ``error`` (with an ``ErrorCode``
other than ``ok``; every other finish carries ``ok``). ``committed`` is the
session's committed length after the round, so the device can check that
both sides agree. ``VerifyClose`` ends a session (the turn is over).

Frames are the envelope's, ``kind`` one of ``verify``, ``verify_close``,
``verified``; ids travel as little-endian int32 in the payload (committed
first, then drafts, then the distribution bytes), every size checked
against ``Limits`` and the payload's length before anything is sliced.
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
from ._text_wire import TextSampling

__all__ = [
    "MAX_DIST_BYTES",
    "MAX_DRAFTS",
    "VerifyClose",
    "VerifyFinish",
    "VerifyMessage",
    "VerifyRequest",
    "VerifyResult",
    "decode_verify_message",
    "encode_verify_message",
]

MAX_DRAFTS = 16  # draft tokens in one round
MAX_DIST_BYTES = 256 * 1024  # the compressed draft distributions of one round
_MAX_ROUND = 2**31 - 1


class VerifyFinish(enum.StrEnum):
    MORE = "more"  # the turn goes on: draft the next round
    STOP = "stop"  # an end-of-sequence token was committed
    LENGTH = "length"  # max_tokens, or the hub's context, reached
    RESEND = "resend"  # the hub holds no such session (evicted, restarted): send all again
    ERROR = "error"  # see the error code


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    """One round of a session: ``base`` ids the hub should hold, ``committed`` ids it
    lacks, the ``drafts`` to verify (see the module docstring)."""

    request_id: str
    model: str
    session: str
    round: int
    base: int
    committed: tuple[int, ...]
    drafts: tuple[int, ...]
    max_tokens: int
    sampling: TextSampling = field(default_factory=TextSampling)
    draft_dists: bytes | None = None
    device_id: str | None = None
    timeout_ms: float | None = None
    sent_at_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id, "id")
        check_id(self.session, "session")
        check_name(self.model, "model")
        if self.device_id is not None:
            check_name(self.device_id, "device")
        _check_count(self.round, "round")
        _check_count(self.base, "base")
        if not (is_int(self.max_tokens) and self.max_tokens >= 1):
            raise FrameError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r:.40}")
        object.__setattr__(self, "committed", check_ids(self.committed, "committed"))
        object.__setattr__(self, "drafts", check_ids(self.drafts, "drafts"))
        if len(self.drafts) > MAX_DRAFTS:
            raise LimitExceededError(f"{len(self.drafts)} drafts; the limit is {MAX_DRAFTS}")
        if self.base == 0 and not self.committed:
            raise FrameError("a session's first round (base 0) needs its committed ids")
        if not isinstance(self.sampling, TextSampling):
            raise FrameError("sampling must be a TextSampling")
        dists = self.draft_dists
        if dists is not None:
            if not isinstance(dists, bytes):
                raise FrameError("draft_dists must be bytes")
            if len(dists) > MAX_DIST_BYTES:
                raise LimitExceededError(
                    f"draft distributions of {len(dists)} bytes; the limit is {MAX_DIST_BYTES}"
                )
        for name in ("timeout_ms", "sent_at_ms"):
            value = getattr(self, name)
            if value is not None and not (is_number(value) and 0 <= value < math.inf):
                raise FrameError(f"{name} must be a non-negative number, got {value!r:.40}")
        check_extra(self.extra)


@dataclass(frozen=True, kw_only=True)
class VerifyClose:
    """The device's turn is over: the hub frees the session's KV cache."""

    request_id: str
    session: str
    device_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id, "id")
        check_id(self.session, "session")
        if self.device_id is not None:
            check_name(self.device_id, "device")
        check_extra(self.extra)


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """The hub's verdict on one round (see the module docstring)."""

    request_id: str
    session: str
    round: int
    finish: VerifyFinish
    accepted: int = 0
    tokens: tuple[int, ...] = ()
    committed: int = 0
    error: ErrorCode = ErrorCode.OK
    error_message: str = ""
    hub: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.request_id, "id")
        check_id(self.session, "session")
        _check_count(self.round, "round")
        try:
            object.__setattr__(self, "finish", VerifyFinish(self.finish))
        except ValueError:
            raise FrameError(f"unknown verify finish {self.finish!r:.40}") from None
        if not (is_int(self.accepted) and 0 <= self.accepted <= MAX_DRAFTS):
            raise FrameError(f"accepted must be an integer in 0..{MAX_DRAFTS}")
        object.__setattr__(self, "tokens", check_ids(self.tokens, "tokens"))
        if len(self.tokens) > 1:
            raise FrameError(f"a round commits at most one hub token, got {len(self.tokens)}")
        if self.finish is VerifyFinish.MORE and not self.tokens:
            raise FrameError("a round that goes on ('more') carries the hub's token")
        _check_count(self.committed, "committed")
        if not isinstance(self.error, ErrorCode):
            object.__setattr__(self, "error", ErrorCode.parse(self.error))
        if (self.finish is VerifyFinish.ERROR) != (self.error is not ErrorCode.OK):
            raise FrameError("a result has an error code exactly when its finish is 'error'")
        if not isinstance(self.error_message, str):
            raise FrameError("error message must be text")
        object.__setattr__(self, "error_message", self.error_message[:MAX_ERROR_MESSAGE])
        if self.hub is not None:
            check_name(self.hub, "hub")
        check_extra(self.extra)

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.OK


VerifyMessage = VerifyRequest | VerifyClose | VerifyResult

_VERIFY_FIELDS = ("kind", "id", "model", "session", "round", "base", "committed_count",
                  "draft_count", "dist_bytes", "max_tokens", "sampling", "device", "timeout_ms",
                  "sent_at_ms")  # fmt: skip
_RESULT_FIELDS = ("kind", "id", "session", "round", "finish", "accepted", "token_count",
                  "committed", "error", "hub")  # fmt: skip
_KNOWN = {
    "verify": frozenset(_VERIFY_FIELDS),
    "verify_close": frozenset({"kind", "id", "session", "device"}),
    "verified": frozenset(_RESULT_FIELDS),
}


def encode_verify_message(message: VerifyMessage) -> bytes:
    """One frame for ``message`` (``FrameError`` for ``extra`` that JSON cannot carry)."""
    header: dict[str, Any]
    payload: list[bytes] = []
    if isinstance(message, VerifyRequest):
        header = {
            "kind": "verify", "id": message.request_id, "model": message.model,
            "session": message.session, "round": message.round, "base": message.base,
            "committed_count": len(message.committed), "draft_count": len(message.drafts),
            "max_tokens": message.max_tokens,
        }  # fmt: skip
        optional = {
            "sampling": message.sampling.to_dict() or None,
            "device": message.device_id,
            "timeout_ms": message.timeout_ms,
            "sent_at_ms": message.sent_at_ms,
            "dist_bytes": None if message.draft_dists is None else len(message.draft_dists),
        }
        header.update({k: v for k, v in optional.items() if v is not None})
        payload = [np.asarray(message.committed + message.drafts, dtype=IDS).tobytes()]
        if message.draft_dists is not None:
            payload.append(message.draft_dists)
    elif isinstance(message, VerifyClose):
        header = {"kind": "verify_close", "id": message.request_id, "session": message.session}
        if message.device_id is not None:
            header["device"] = message.device_id
    elif isinstance(message, VerifyResult):
        header = {
            "kind": "verified", "id": message.request_id, "session": message.session,
            "round": message.round, "finish": message.finish.value,
            "accepted": message.accepted, "token_count": len(message.tokens),
            "committed": message.committed,
        }  # fmt: skip
        if not message.ok:
            header["error"] = {"code": message.error.value, "message": message.error_message}
        if message.hub is not None:
            header["hub"] = message.hub
        payload = [np.asarray(message.tokens, dtype=IDS).tobytes()]
    else:
        raise FrameError(f"not a verify message: {type(message).__name__}")
    return pack_message(header, message.extra, _KNOWN, payload)


def decode_verify_message(
    data: bytes | bytearray | memoryview, limits: Limits | None = None
) -> VerifyMessage:
    """Parse one frame (``ProtocolError`` subclasses; ``LimitExceededError`` over a limit)."""
    limits = limits or Limits()
    header, payload = split_frame(data, limits)
    kind, extra = kind_and_extra(header, _KNOWN)
    try:
        if kind == "verify_close":
            if len(payload):
                raise FrameError("a verify_close carries no payload")
            return VerifyClose(
                request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
                session=header.get("session"),  # type: ignore[arg-type]
                device_id=header.get("device"),
                extra=extra,
            )
        if kind == "verified":
            (tokens,) = _unpack(payload, [header.get("token_count")], 0, limits)
            return _result(header, tokens, extra)
        return _request(header, payload, extra, limits)
    except TypeError as e:  # a field of the wrong JSON type where a constructor takes **
        raise FrameError(f"malformed {kind} header: {e}") from e


def _request(
    header: dict[str, Any], payload: memoryview, extra: dict[str, Any], limits: Limits
) -> VerifyRequest:
    n_dist = header.get("dist_bytes")
    if n_dist is not None and not (is_int(n_dist) and 0 <= n_dist <= MAX_DIST_BYTES):
        raise LimitExceededError(f"dist_bytes must be 0..{MAX_DIST_BYTES}, got {n_dist!r:.40}")
    draft_count: Any = header.get("draft_count")
    if is_int(draft_count) and draft_count > MAX_DRAFTS:
        raise LimitExceededError(f"{draft_count} drafts; the limit is {MAX_DRAFTS}")
    committed, drafts = _unpack(
        payload, [header.get("committed_count"), draft_count], n_dist or 0, limits
    )
    max_tokens: Any = header.get("max_tokens")
    check_max_tokens(max_tokens, limits)
    dists = None if n_dist is None else bytes(payload[len(payload) - n_dist :])
    return VerifyRequest(
        request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
        model=header.get("model"),  # type: ignore[arg-type]
        session=header.get("session"),  # type: ignore[arg-type]
        round=header.get("round"),  # type: ignore[arg-type]
        base=header.get("base"),  # type: ignore[arg-type]
        committed=committed,
        drafts=drafts,
        max_tokens=max_tokens,
        sampling=TextSampling.from_dict(header.get("sampling")),
        draft_dists=dists,
        device_id=header.get("device"),
        timeout_ms=header.get("timeout_ms"),
        sent_at_ms=header.get("sent_at_ms"),
        extra=extra,
    )


def _result(header: dict[str, Any], tokens: tuple[int, ...], extra: dict[str, Any]) -> VerifyResult:
    code, message = error_of(header)
    return VerifyResult(
        request_id=header.get("id"),  # type: ignore[arg-type]  # validated there
        session=header.get("session"),  # type: ignore[arg-type]
        round=header.get("round"),  # type: ignore[arg-type]
        finish=header.get("finish"),  # type: ignore[arg-type]
        accepted=header.get("accepted", 0),
        tokens=tokens,
        committed=header.get("committed", 0),
        error=code,
        error_message=message,
        hub=header.get("hub"),
        extra=extra,
    )


def _unpack(
    payload: memoryview, counts: list[Any], tail: int, limits: Limits
) -> list[tuple[int, ...]]:
    """Groups of ids, sizes checked against the limits and the payload before slicing."""
    for n in counts:
        if not (is_int(n) and n >= 0):
            raise FrameError(f"an id count must be an integer >= 0, got {n!r:.40}")
    total = sum(counts)
    if total > limits.max_token_ids:
        raise LimitExceededError(f"{total} token ids; the limit is {limits.max_token_ids}")
    if IDS.itemsize * total + tail != len(payload):
        raise FrameError(
            f"header describes {total} ids and {tail} distribution bytes, "
            f"but the payload has {len(payload)} bytes"
        )
    ids = ids_of(payload[: IDS.itemsize * total])
    out, at = [], 0
    for n in counts:
        out.append(ids[at : at + n])
        at += n
    return out


def _check_count(value: object, what: str) -> None:
    if not (is_int(value) and 0 <= value <= _MAX_ROUND):  # type: ignore[operator]
        raise FrameError(f"{what} must be an integer in 0..{_MAX_ROUND}, got {value!r:.40}")
