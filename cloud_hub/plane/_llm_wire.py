"""The framed records between an ingress process and a language executor process.

Token streams are small, so they need no shared memory: each record is a
4-byte little-endian length and a JSON object, on a Unix stream socket
(abstract namespace, like the tensor executors'). Nothing but JSON is parsed
from it; a record over ``MAX_RECORD_BYTES`` or one that is not an object ends
the connection (``IpcClosedError``), as a peer speaking something else would.

::

    ingress -> executor  {"op": "hello", "ingress": id}
                         {"op": "submit", "turn": n, "prompt": [ids], "max_tokens": k,
                          "sampling": {...}, "conversation": id | null}
                         {"op": "cancel", "turn": n}
                         {"op": "encode", "call": n, "text": "..."}
    executor -> ingress  {"op": "hello", "model", "version", "created", "max_prompt_tokens",
                          "max_output_tokens", "context", "vocab_size"}
                         {"op": "update", "turn": n, "text", "tokens": [new ids],
                          "finish", "prompt_tokens", "completion_tokens", "cached", "error"}
                         {"op": "encoded", "call": n, "ids": [...]} | {..., "error": "..."}

``turn`` numbers are the ingress's own (one connection, one numbering); an
update's ``tokens`` are those new since its turn's previous update, so a
stream costs what its tokens do.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from shared import ErrorCode

from .._errors import IpcClosedError
from ..language import Sampling, TurnUpdate

__all__ = [
    "MAX_RECORD_BYTES",
    "RecordReader",
    "language_address",
    "pack",
    "sampling_from",
    "sampling_to",
    "update_from",
    "update_to",
]

MAX_RECORD_BYTES = 16 * 1024 * 1024
_LENGTH = struct.Struct("<I")


def language_address(hub_id: str, model: str, instance: int) -> str:
    """The abstract-namespace socket name of one language executor of one hub."""
    return f"\0tandem-hub-{hub_id}-llm-{model}-{instance}"


def pack(record: dict[str, Any]) -> bytes:
    raw = json.dumps(record, separators=(",", ":")).encode()
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError(f"an IPC record of {len(raw)} bytes exceeds {MAX_RECORD_BYTES}")
    return _LENGTH.pack(len(raw)) + raw


class RecordReader:
    """Reads whole records from a blocking stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()

    def read(self) -> dict[str, Any]:
        """The next record; ``IpcClosedError`` at EOF or for a malformed one."""
        head = self._exactly(_LENGTH.size)
        (length,) = _LENGTH.unpack(head)
        if length > MAX_RECORD_BYTES:
            raise IpcClosedError(f"an IPC record of {length} bytes exceeds {MAX_RECORD_BYTES}")
        try:
            record = json.loads(self._exactly(length))
        except ValueError as e:
            raise IpcClosedError(f"an IPC record that is not JSON: {e}") from e
        if not isinstance(record, dict) or not isinstance(record.get("op"), str):
            raise IpcClosedError("an IPC record that is not an object with an op")
        return record

    def _exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                data = self.sock.recv(max(65536, n - len(self._buffer)))
            except OSError as e:
                raise IpcClosedError(f"connection closed: {e}") from e
            if not data:
                raise IpcClosedError("the peer closed the connection")
            self._buffer += data
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out


def sampling_to(sampling: Sampling | None) -> dict[str, Any]:
    s = sampling or Sampling()
    return {"temperature": s.temperature, "top_p": s.top_p, "seed": s.seed, "stop": list(s.stop)}


def sampling_from(data: Any) -> Sampling:
    """The ``Sampling`` of a submit record; ``ValueError`` for a field of the wrong type."""
    if not isinstance(data, dict):
        raise ValueError("sampling must be an object")
    stop = data.get("stop", [])
    seed = data.get("seed")
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ValueError("sampling.stop must be a list of strings")
    if seed is not None and not isinstance(seed, int):
        raise ValueError("sampling.seed must be a whole number")
    return Sampling(temperature=float(data.get("temperature", 0.0)),
                    top_p=float(data.get("top_p", 1.0)), seed=seed, stop=tuple(stop))  # fmt: skip


def update_to(turn: int, update: TurnUpdate, new_tokens: tuple[int, ...]) -> dict[str, Any]:
    return {
        "op": "update", "turn": turn, "text": update.text, "tokens": list(new_tokens),
        "finish": update.finish, "prompt_tokens": update.prompt_tokens,
        "completion_tokens": update.completion_tokens,
        "cached": update.cached_prompt_tokens, "error": update.error,
        "code": None if update.code is None else update.code.value,
    }  # fmt: skip


def update_from(record: dict[str, Any], tokens: tuple[int, ...]) -> TurnUpdate:
    """The ``TurnUpdate`` of an update record; ``tokens``: the turn's tokens so far."""
    return TurnUpdate(
        str(record.get("text", "")),
        tokens,
        record.get("finish"),
        prompt_tokens=int(record.get("prompt_tokens", 0)),
        completion_tokens=int(record.get("completion_tokens", 0)),
        error=record.get("error"),
        cached_prompt_tokens=int(record.get("cached", 0)),
        code=_code(record.get("code")),
    )


def _code(value: Any) -> ErrorCode | None:
    """An update's error code; one this ingress does not know is internal."""
    if value is None:
        return None
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.INTERNAL
