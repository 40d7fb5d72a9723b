"""An ingress process's client of a language executor: a ``TurnEngine`` over IPC.

``LanguageClient`` offers what ``LanguageEngine`` offers the fronts
(``encode``, ``default_max_tokens``, ``submit`` returning a ``Turn`` whose
``cancel()`` frees the slot, updates to the turn's ``sink``), so
``TextFront`` and the OpenAI routes run on it unchanged. ``submit`` checks
the model's limits here (the executor's hello says them), so a bad turn is
refused at once with the same typed error as in process; a full queue over
there comes back as the turn's error update.

A reader thread connects (and reconnects: the supervisor restarts a dead
executor), reads updates and hands each to its turn's sink, with the turn's
tokens so far (the wire carries only the new ones). When the connection is
lost every turn it held gets an error update at once (``IpcClosedError``'s
message): the device finishes the turn elsewhere, an SSE stream ends with an
error event. While no executor answers, ``submit`` and ``encode`` raise
``IpcClosedError`` (``overloaded``: the device goes elsewhere, HTTP answers
503).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared import ErrorCode

from .._errors import InvalidRequestError, IpcClosedError
from ..language import Sampling, Sink, Turn, TurnUpdate, check_turn
from ._llm_wire import RecordReader, pack, sampling_to, update_from

__all__ = ["LanguageClient"]

log = logging.getLogger(__name__)

_RETRY_S = 0.2
_ENCODE_S = 10.0


@dataclass
class _Remote:
    turn: Turn
    tokens: list[int] = field(default_factory=list)


class _Call:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] = {}


class LanguageClient:
    """One language executor as a ``TurnEngine``. Thread-safe."""

    def __init__(self, address: str, model: str, *, ingress_id: str) -> None:
        self.address, self.model, self.ingress_id = address, model, ingress_id
        self.info: dict[str, Any] | None = None  # the executor's hello, once connected
        self.connected = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._turns: dict[int, _Remote] = {}
        self._calls: dict[int, _Call] = {}
        self._numbers = itertools.count(1)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"llm-{model}", daemon=True)
        self._thread.start()

    # -- the TurnEngine contract ----------------------------------------------------------

    def encode(self, text: str) -> np.ndarray:
        call, number = _Call(), next(self._numbers)
        with self._lock:
            self._calls[number] = call
        try:
            self._send({"op": "encode", "call": number, "text": text})
            if not call.done.wait(_ENCODE_S) or "ids" not in call.result:
                why = call.result.get("error", "no answer")
                raise IpcClosedError(f"language model {self.model}: cannot encode ({why})")
        finally:
            with self._lock:
                self._calls.pop(number, None)
        return np.asarray(call.result["ids"], dtype=np.int32)

    def default_max_tokens(self, prompt_tokens: int) -> int:
        info = self._info()
        return max(1, min(int(info["max_output_tokens"]), int(info["context"]) - prompt_tokens))

    def submit(
        self,
        prompt: Sequence[int] | np.ndarray,
        *,
        max_tokens: int,
        sink: Sink,
        sampling: Sampling | None = None,
        conversation: str | None = None,
    ) -> Turn:
        """Check the turn here, send it to the executor, return it (see the module docstring)."""
        info = self._info()
        if conversation is not None and (not isinstance(conversation, str) or not conversation):
            raise InvalidRequestError("a conversation id must be a non-empty string")
        ids = [int(t) for t in prompt]
        vocab = int(info["vocab_size"])
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]} is out of the model's vocabulary (0..{vocab - 1})"
            )
        check_turn(len(ids), max_tokens, max_prompt_tokens=int(info["max_prompt_tokens"]),
                   max_output_tokens=int(info["max_output_tokens"]),
                   context=int(info["context"]))  # fmt: skip
        number = next(self._numbers)
        turn = Turn(id=number, prompt=np.asarray(ids, dtype=np.int32), max_tokens=max_tokens,
                    sampling=sampling or Sampling(), sink=sink, deadline=math.inf, engine=self,
                    conversation=conversation)  # fmt: skip
        with self._lock:
            self._turns[number] = _Remote(turn)
        record = {
            "op": "submit", "turn": number, "prompt": ids, "max_tokens": max_tokens,
            "sampling": sampling_to(sampling), "conversation": conversation,
        }  # fmt: skip
        try:
            self._send(record)
        except IpcClosedError:
            with self._lock:
                self._turns.pop(number, None)
            raise
        return turn

    def stats(self) -> dict[str, int]:
        """This ingress's turns in flight there (the engine's own stats are the executor's)."""
        with self._lock:
            return {"active": len(self._turns), "waiting": 0}

    def close(self, timeout_s: float = 10.0) -> None:
        self._closing.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout_s)

    def _cancel(self, turn: Turn) -> None:
        with self._lock:
            if turn.finished or turn.id not in self._turns:
                return
        # A connection that is gone cancelled its turns over there; this one ends with it.
        with contextlib.suppress(IpcClosedError):
            self._send({"op": "cancel", "turn": turn.id})

    # -- the connection -------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        info = self.info
        if info is None or not self.connected.is_set():
            raise IpcClosedError(f"language model {self.model}: its executor is not reachable now")
        return info

    def _send(self, record: dict[str, Any]) -> None:
        frame = pack(record)
        with self._send_lock:
            sock = self._sock
            if sock is None or not self.connected.is_set():
                raise IpcClosedError(f"language model {self.model}: its executor is not reachable")
            try:
                sock.sendall(frame)
            except OSError as e:
                raise IpcClosedError(f"language model {self.model}: {e}") from e

    def _run(self) -> None:
        while not self._closing.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.address)
            except OSError:
                sock.close()
                self._closing.wait(_RETRY_S)
                continue
            try:
                self._serve(sock)
            except (IpcClosedError, OSError) as e:  # OSError: it died while we said hello
                if not self._closing.is_set():
                    log.warning("language executor of %s lost: %s", self.model, e)
            except Exception:  # never end the thread: this ingress would not reconnect
                log.exception("language executor of %s: a record failed", self.model)
                self._closing.wait(_RETRY_S)
            finally:
                self._lost(sock)

    def _serve(self, sock: socket.socket) -> None:
        reader = RecordReader(sock)
        sock.sendall(pack({"op": "hello", "ingress": self.ingress_id, "pid": os.getpid()}))
        hello = reader.read()
        if hello["op"] != "hello":
            raise IpcClosedError(f"expected the executor's hello, got {hello['op']!r}")
        with self._send_lock:
            self.info, self._sock = hello, sock
            self.connected.set()
        log.info("connected to the language executor of %s", self.model)
        while True:
            record = reader.read()
            if record["op"] == "update":
                self._on_update(record)
            elif record["op"] == "encoded":
                with self._lock:
                    call = self._calls.get(int(record.get("call", -1)))
                if call is not None:
                    call.result = record
                    call.done.set()

    def _on_update(self, record: dict[str, Any]) -> None:
        number = int(record.get("turn", -1))
        with self._lock:
            remote = self._turns.get(number)
            if remote is None:
                return
            remote.tokens.extend(int(t) for t in record.get("tokens", ()))
            update = update_from(record, tuple(remote.tokens))
            if update.finish is not None:
                remote.turn.finished = True
                del self._turns[number]
        _deliver(remote.turn, update)

    def _lost(self, sock: socket.socket) -> None:
        """The connection ended: every turn on it gets its error, every call its answer."""
        with self._send_lock:
            self.connected.clear()
            self._sock = None
        with contextlib.suppress(OSError):
            sock.close()
        with self._lock:
            remotes = list(self._turns.values())
            self._turns.clear()
            calls = list(self._calls.values())
        for call in calls:
            call.result = {"error": "the executor went away"}
            call.done.set()
        message = (
            f"the language executor of {self.model} stopped mid-turn; finish the turn elsewhere"
        )
        for remote in remotes:
            remote.turn.finished = True
            turn = remote.turn
            failed = TurnUpdate("", tuple(remote.tokens), "error", turn.prompt_tokens,
                                len(remote.tokens), message,
                                code=ErrorCode.OVERLOADED)  # fmt: skip
            _deliver(turn, failed)


def _deliver(turn: Turn, update: TurnUpdate) -> None:
    try:
        turn.sink(update)
    except Exception:  # a consumer's failure must not stop the reader
        log.exception("a language turn's sink failed")
