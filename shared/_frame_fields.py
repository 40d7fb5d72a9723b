"""Field checks and frame helpers the text and speculative wires share (private to shared).

``_text_wire`` and ``_spec_wire`` frame their messages the same way: the
envelope's frame (``pack_frame``/``split_frame``) with a ``kind`` in the
header, header fields this build does not know kept in ``extra`` and
written back, token ids as little-endian int32 (``IDS``) in the payload,
checked non-negative once sliced, an error as ``{"code", "message"}``, and
``max_tokens`` checked against ``Limits`` before a message is built. Every
check raises a ``ProtocolError`` subclass (``FrameError``,
``LimitExceededError``) with a one-line reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._envelope import pack_frame
from ._errors import ErrorCode, FrameError, LimitExceededError
from ._limits import Limits
from ._topics import NAME_PATTERN

__all__ = [
    "IDS",
    "MAX_ERROR_MESSAGE",
    "MAX_ID",
    "MAX_TOKEN_ID",
    "check_extra",
    "check_id",
    "check_ids",
    "check_max_tokens",
    "check_name",
    "error_of",
    "ids_of",
    "is_int",
    "is_number",
    "kind_and_extra",
    "pack_message",
]

MAX_ID = 128  # characters of a request (or session) id
MAX_ERROR_MESSAGE = 1000  # characters of an error message kept
MAX_TOKEN_ID = 2**31 - 1
IDS = np.dtype("<i4")


def is_int(value: object) -> bool:
    """An ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite ``int`` or ``float``, not a ``bool``; an int too large for a float is not."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_id(value: object, what: str = "id") -> None:
    """``value`` is 1-``MAX_ID`` printable characters (``FrameError``)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID or not value.isprintable():
        raise FrameError(f"{what} must be 1-{MAX_ID} printable characters, got {value!r:.60}")


def check_name(value: object, what: str) -> None:
    """``value`` is a name (``NAME_PATTERN``; ``FrameError``)."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise FrameError(f"{what} must be a name (A-Z a-z 0-9 . _ -), got {value!r:.60}")


def check_ids(ids: object, what: str) -> tuple[int, ...]:
    """``ids`` (a sequence or an array) as a tuple of token ids in 0..``MAX_TOKEN_ID``."""
    if isinstance(ids, np.ndarray):
        ids = ids.tolist()
    if not isinstance(ids, tuple | list):
        raise FrameError(f"{what} must be a sequence of token ids")
    for t in ids:
        if not (is_int(t) and 0 <= t <= MAX_TOKEN_ID):
            raise FrameError(f"{what}: token id {t!r:.40} is not in 0..{MAX_TOKEN_ID}")
    return tuple(ids)


def check_extra(extra: object) -> None:
    """``extra`` is a dict with string keys (``FrameError``)."""
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise FrameError("extra must be a dict with string keys")


def check_max_tokens(value: object, limits: Limits) -> None:
    """An integer ``max_tokens`` over ``limits.max_output_tokens`` is ``LimitExceededError``
    (any other value is left to the message's constructor)."""
    if is_int(value) and value > limits.max_output_tokens:  # type: ignore[operator]
        raise LimitExceededError(f"max_tokens {value}; the limit is {limits.max_output_tokens}")


def pack_message(header: dict[str, Any], extra: Mapping[str, Any],
                 known: Mapping[str, frozenset[str]], payload: list[bytes]) -> bytes:  # fmt: skip
    """The frame: ``header`` over the ``extra`` fields its kind does not know."""
    kept = {k: v for k, v in extra.items() if k not in known[header["kind"]]}
    return pack_frame({**kept, **header}, payload)


def kind_and_extra(
    header: dict[str, Any], known: Mapping[str, frozenset[str]]
) -> tuple[str, dict[str, Any]]:
    """The frame's kind (one of ``known``: else ``FrameError``) and its unknown fields."""
    kind: Any = header.get("kind")
    if kind not in known:
        raise FrameError(f"kind must be one of {sorted(known)}, got {kind!r:.40}")
    return kind, {k: v for k, v in header.items() if k not in known[kind]}


def ids_of(buffer: memoryview) -> tuple[int, ...]:
    """The int32 ids in ``buffer`` (its size already checked); a negative one is
    ``FrameError``."""
    ids = np.frombuffer(buffer, dtype=IDS)
    if ids.size and int(ids.min()) < 0:
        raise FrameError("a token id is negative")
    return tuple(ids.tolist())


def error_of(header: dict[str, Any]) -> tuple[ErrorCode, str]:
    """The header's error code and message (``ok`` and ``""`` when it has none)."""
    error = header.get("error")
    code, message = ErrorCode.OK, ""
    if error is not None:
        if not isinstance(error, dict):
            raise FrameError("error must be an object with 'code' and 'message'")
        code, message = ErrorCode.parse(error.get("code")), error.get("message", "")
    return code, message if isinstance(message, str) else str(message)
