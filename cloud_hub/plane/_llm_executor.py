"""A language executor process: one language model's engine, served to every ingress.

``run_language_executor`` loads the model's engine (``config.json``'s
``engine``: ONNX Runtime GenAI's, ``LanguageEngine``, or vLLM's,
``VllmEngine``; one that cannot run here fails the process with one line,
and the supervisor serves the other models) and listens on its Unix socket
(``_llm_wire``). Every ingress process connects to it, so all the turns
this hub takes for the model reach this one engine: continuous batching
across ingress processes, and a conversation's kept KV cache found
whichever ingress its next turn came through.

Each connection has a reader thread (submits, cancels, encodes: handled at
once, so a cancel frees its slot before the next engine step) and a writer
thread (the engine thread only queues updates, never waits on a socket).
A connection that closes (its ingress stopped or died) cancels every turn it
held. The main thread writes the engine's ``stats()`` into the process's
metrics book about twice a second (``llm_samples``: the families an
in-process hub serves), and stops the engine on SIGTERM.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared import ErrorCode

from .._errors import HubError, InvalidRequestError, IpcClosedError, ModelConfigError, error_code
from ..language import (
    LanguageEngine,
    Turn,
    TurnUpdate,
    VllmEngine,
    engine_missing,
    open_engine,
    read_language_config,
)
from ..language._metrics import llm_samples
from ..metrics._book import BookDumper, MetricsBook
from ._llm_wire import RecordReader, pack, sampling_from, update_to
from ._spec import PlaneSpec

__all__ = ["run_language_executor"]

log = logging.getLogger(__name__)

_STATS_S = 0.5


def run_language_executor(spec: PlaneSpec, index: int, ready: Callable[[], None]) -> None:
    target = spec.language[index]
    config = read_language_config(Path(spec.repo) / target.model)
    missing = engine_missing(config.engine)
    if missing is not None:
        raise ModelConfigError(f"language model {target.model}: {missing}")
    engine = open_engine(config.engine, config.directory, config.limits)
    book = MetricsBook(f"executor-llm-{target.model}-{target.instance}")
    dumper = BookDumper(book, Path(spec.metrics_dir))
    hello = {
        "op": "hello", "model": target.model, "version": target.version,
        "created": target.created, "max_prompt_tokens": engine.max_prompt_tokens,
        "max_output_tokens": engine.limits.max_output_tokens, "context": engine.context,
        "vocab_size": engine.vocab_size,
    }  # fmt: skip
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(target.address)
    listener.listen(64)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    accepting = threading.Thread(
        target=_accept, args=(listener, engine, hello, stopping), name="llm-accept", daemon=True
    )
    accepting.start()
    ready()
    totals: dict[tuple[str, tuple[str, ...]], float] = {}
    try:
        while not stopping.wait(_STATS_S):
            _record_stats(book, target.model, engine, totals)
            dumper.tick()
    finally:
        listener.close()  # no new ingress; the turns in the engine end "cancelled"
        engine.close()
        _record_stats(book, target.model, engine, totals)
        dumper.close()


def _record_stats(
    book: MetricsBook,
    model: str,
    engine: LanguageEngine | VllmEngine,
    totals: dict[tuple[str, tuple[str, ...]], float],
) -> None:
    """The engine's counters as increments of the book's (which only adds), gauges as set."""
    for name, kind, labels, value in llm_samples(model, engine.stats()):
        if kind == "gauge":
            book.set(name, labels, value)
            continue
        delta = value - totals.get((name, labels), 0.0)
        if delta or (name, labels) not in totals:  # a zero is served too
            book.inc(name, labels, delta)
            totals[(name, labels)] = value


def _accept(
    listener: socket.socket,
    engine: LanguageEngine | VllmEngine,
    hello: dict[str, Any],
    stopping: threading.Event,
) -> None:
    while not stopping.is_set():
        try:
            sock, _ = listener.accept()
        except OSError:  # closed: the process is stopping
            return
        peer = _Peer(sock, engine)
        threading.Thread(target=peer.serve, args=(hello,), name="llm-peer", daemon=True).start()


class _Peer:
    """One ingress process's connection: its turns by its own numbers."""

    def __init__(self, sock: socket.socket, engine: LanguageEngine | VllmEngine) -> None:
        self.sock = sock
        self.engine = engine
        self.ingress = "?"
        self.turns: dict[int, Turn] = {}
        self.sent_tokens: dict[int, int] = {}  # tokens already sent, per turn
        self._lock = threading.Lock()
        self._out: collections.deque[bytes] = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._closed = False

    def serve(self, hello: dict[str, Any]) -> None:
        writer = threading.Thread(target=self._write, name="llm-peer-writer", daemon=True)
        writer.start()
        self._send(hello)
        reader = RecordReader(self.sock)
        try:
            while True:
                self._handle(reader.read())
        except IpcClosedError as e:
            log.debug("ingress %s left: %s", self.ingress, e)
        except Exception:
            log.exception("ingress %s: a record failed; closing its connection", self.ingress)
        finally:
            self._close()

    def _handle(self, record: dict[str, Any]) -> None:
        op = record["op"]
        if op == "submit":
            self._submit(record)
        elif op == "cancel":
            with self._lock:
                turn = self.turns.get(int(record.get("turn", -1)))
            if turn is not None:
                turn.cancel()
        elif op == "encode":
            call = record.get("call")
            try:
                ids = self.engine.encode(str(record.get("text", "")))
                self._send({"op": "encoded", "call": call, "ids": ids.tolist()})
            except Exception as e:  # the tokenizer's failure: the caller's error, not ours
                self._send({"op": "encoded", "call": call, "error": str(e) or type(e).__name__})
        elif op == "hello":
            self.ingress = str(record.get("ingress", "?"))
        else:
            raise IpcClosedError(f"unknown IPC op {op!r}")

    def _submit(self, record: dict[str, Any]) -> None:
        number = int(record["turn"])
        with self._lock:
            self.sent_tokens[number] = 0  # the first update may come before submit returns
        try:
            prompt = record.get("prompt")
            if not isinstance(prompt, list) or not all(type(t) is int for t in prompt):
                raise InvalidRequestError("the prompt must be a list of token ids")
            conversation = record.get("conversation")
            turn = self.engine.submit(  # not under the lock: a cancel's update takes it
                prompt,
                max_tokens=int(record["max_tokens"]),
                sink=lambda update: self._on_update(number, update),
                sampling=sampling_from(record.get("sampling", {})),
                conversation=conversation if isinstance(conversation, str) else None,
            )
        except (HubError, ValueError, KeyError, TypeError) as e:
            with self._lock:
                self.sent_tokens.pop(number, None)
            code = error_code(e) if isinstance(e, HubError) else ErrorCode.BAD_REQUEST
            failed = TurnUpdate("", (), "error", error=str(e) or type(e).__name__, code=code)
            self._send(update_to(number, failed, ()))
            return
        with self._lock:
            if number in self.sent_tokens:  # not finished already
                self.turns[number] = turn

    def _on_update(self, number: int, update: TurnUpdate) -> None:  # the engine's thread
        with self._lock:
            sent = self.sent_tokens.get(number, 0)
            self.sent_tokens[number] = len(update.tokens)
            if update.finish is not None:
                self.turns.pop(number, None)
                self.sent_tokens.pop(number, None)
            if not self._closed:
                self._out.append(pack(update_to(number, update, update.tokens[sent:])))
                self._wake.notify()

    def _send(self, record: dict[str, Any]) -> None:
        with self._lock:
            if not self._closed:
                self._out.append(pack(record))
                self._wake.notify()

    def _write(self) -> None:
        while True:
            with self._lock:
                while not self._out and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                frames = b"".join(self._out)
                self._out.clear()
            try:
                self.sock.sendall(frames)
            except OSError:
                self._close()
                return

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            turns = list(self.turns.values())
            self.turns.clear()
            self._wake.notify()
        for turn in turns:  # nobody waits for them any more: free their slots
            turn.cancel()
        with contextlib.suppress(OSError):
            self.sock.close()
