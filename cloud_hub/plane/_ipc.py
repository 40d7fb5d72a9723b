"""The connection between an ingress process and an executor process of one hub.

One executor process serves one model instance and listens on a Unix socket
(abstract namespace: no file to clean up). Each ingress process connects,
creates two rings (``_ring``) and sends their file descriptors in its hello:
it writes requests into one, the executor writes replies into the other.
From then on the socket carries only positions, 24 bytes a message::

    u64 my ring's head (records exist up to here)   u64 your ring's ack
    u64 the head of yours I have read up to ("seen")

so a message announces records, frees the peer's space and says how far the
peer's announcements were taken. Positions only grow, so a message that
cannot be sent now (a full socket buffer) is not lost: the next one carries
a later position, and ``flush`` retries when the socket is writable again.

Announcements are coalesced: an ingress announces new requests only when
the executor has seen its previous announcement (``seen >= announced``);
requests written meanwhile wait for the executor's next message (it sends
one after every read: with its replies, or alone), whose ``seen`` lets the
ingress announce all of them at once. Under load that is one message per
batch instead of one per request; idle, the first request is announced at
once. Whoever moves ``head`` or ``seen`` checks, under the connection's lock,
whether an announcement is owed, so none is lost.

Either side closing the socket ends the connection: the executor forgets the
ingress's queued requests, the ingress fails the requests it sent
(``IpcClosedError``) and connects again later.

The hellos (JSON, one message each; nothing else is parsed from text)::

    ingress -> executor  {"ingress": id, "pid": n, "request_ring": bytes, "reply_ring": bytes}
                         + SCM_RIGHTS [request ring fd, reply ring fd]
    executor -> ingress  {"model": ..., "version": ..., "inputs": [...], ...}  (``ModelInfo``)

Thread safety: ``ExecutorConnection.submit`` may run on one thread (an MQTT
client's callback) while ``on_readable`` runs on another; the writer's
state and every send are under one lock. ``IngressPeer`` lives on the
executor's single thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import ErrorCode

from .._errors import IpcClosedError
from .._model_info import ModelInfo
from ._records import (
    REPLY,
    REQUEST,
    ReplyRecord,
    RequestRecord,
    read_reply,
    read_request,
    reply_size,
    request_size,
    write_reply,
    write_request,
)
from ._ring import RingReader, RingWriter, create_ring_fd

__all__ = [
    "DEFAULT_RING_BYTES",
    "ExecutorConnection",
    "IngressPeer",
    "IpcClosedError",
    "IpcListener",
    "executor_address",
]

DEFAULT_RING_BYTES = 128 * 1024 * 1024  # virtual; resident only while in use
_POSITIONS = struct.Struct("<QQQ")
_HELLO_BYTES = 64 * 1024
_ACK_EVERY = 8  # besides with replies, ack when this fraction of a ring is freed


def executor_address(hub_id: str, model: str, version: str, instance: int) -> str:
    """The abstract-namespace socket name of one executor of one hub."""
    return f"\0tandem-hub-{hub_id}-{model}-{version}-{instance}"


class _Channel:
    """A non-blocking SEQPACKET socket that sends cumulative positions."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.dirty = False  # a position message is owed to the peer
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, head: int, ack: int, seen: int) -> None:
        try:
            self.sock.send(_POSITIONS.pack(head, ack, seen))
            self.dirty = False
        except BlockingIOError:
            self.dirty = True  # ``flush`` sends the latest positions when writable
        except OSError:
            self.closed = True

    def receive(self) -> tuple[int, int, int] | None:
        """The highest (head, ack, seen) of the waiting messages; None if none; raises on EOF."""
        head = ack = seen = -1
        while True:
            try:
                data = self.sock.recv(64)
            except BlockingIOError:
                break
            except OSError as e:
                self.closed = True
                raise IpcClosedError(f"connection closed: {e}") from e
            if not data:
                self.closed = True
                raise IpcClosedError("the peer closed the connection")
            if len(data) != _POSITIONS.size:
                self.closed = True
                raise IpcClosedError(f"bad IPC message of {len(data)} bytes")
            h, a, n = _POSITIONS.unpack(data)
            head, ack, seen = max(head, h), max(ack, a), max(seen, n)
        return None if head < 0 else (head, ack, seen)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


# -- the ingress side -----------------------------------------------------------------------


ReplyHandler = Callable[[ReplyRecord], None]


class ExecutorConnection:
    """An ingress process's connection to one executor: submit requests, receive replies."""

    def __init__(
        self,
        address: str,
        *,
        ingress_id: str,
        on_reply: ReplyHandler,
        ring_bytes: int = DEFAULT_RING_BYTES,
        copy_replies: bool = False,
    ) -> None:
        self.address = address
        self.ingress_id = ingress_id
        self.on_reply = on_reply
        self.ring_bytes = ring_bytes
        # False: a reply's arrays are views into the ring, valid during ``on_reply`` only.
        self.copy_replies = copy_replies
        self.info: ModelInfo | None = None
        self._channel: _Channel | None = None
        self._writer: RingWriter | None = None
        self._reader: RingReader | None = None
        self._lock = threading.Lock()
        self._sent_ack = 0
        self._announced = 0  # the request head last sent to the executor
        self._seen = 0  # how far the executor says it took our announcements

    @property
    def connected(self) -> bool:
        return self._channel is not None and not self._channel.closed

    def connect(self, timeout_s: float = 5.0) -> ModelInfo:
        """Connect and exchange hellos; raises ``OSError`` when nobody listens yet."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds: list[int] = []
        try:
            sock.settimeout(timeout_s)
            sock.connect(self.address)
            fds = [create_ring_fd(self.ring_bytes), create_ring_fd(self.ring_bytes)]
            hello = {
                "ingress": self.ingress_id,
                "pid": os.getpid(),
                "request_ring": self.ring_bytes,
                "reply_ring": self.ring_bytes,
            }
            socket.send_fds(sock, [json.dumps(hello).encode()], fds)
            raw = sock.recv(_HELLO_BYTES)
            if not raw:
                raise ConnectionError(f"executor at {self.address[1:]!r} closed during hello")
            info = ModelInfo.from_json(raw)
            writer = RingWriter(fds[0], self.ring_bytes)
            reader = RingReader(fds[1], self.ring_bytes)
        except BaseException:
            sock.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)  # the mappings (and the executor's) keep the rings alive
        with self._lock:
            self._channel, self._writer, self._reader = _Channel(sock), writer, reader
            self._sent_ack = self._announced = self._seen = 0
            self.info = info
        return info

    def fileno(self) -> int:
        channel = self._channel
        return -1 if channel is None else channel.fileno()

    @property
    def wants_write(self) -> bool:
        channel = self._channel
        return channel is not None and channel.dirty

    def submit(
        self,
        key: int,
        deadline: float | None,
        arrival: float,
        rows: int,
        tensors: list[tuple[int, np.ndarray]],
    ) -> bool:
        """Write one request; False when the ring has no room now (answer "overloaded").

        Raises ``IpcClosedError`` when the connection is down, ``ValueError`` for a
        request larger than the ring can ever hold.
        """
        size, prepared = request_size(tensors)
        with self._lock:
            channel, writer, reader = self._channel, self._writer, self._reader
            if channel is None or channel.closed or writer is None or reader is None:
                raise IpcClosedError(f"no connection to the executor at {self.address[1:]!r}")
            view = writer.reserve(size)
            if view is None:
                return False
            try:
                write_request(view, key, deadline, arrival, rows, prepared)
            finally:
                view.release()
            writer.commit(REQUEST)
            self._announce_if_owed(channel, writer, reader)
        return True

    def _announce_if_owed(self, channel: _Channel, writer: RingWriter, reader: RingReader) -> None:
        """Send the head when there is news and the last announcement was taken (lock held)."""
        if writer.head > self._announced and self._seen >= self._announced:
            self._announced = writer.head
            self._sent_ack = reader.acked
            channel.send(writer.head, reader.acked, reader.head)

    def on_readable(self) -> None:
        """Take the executor's messages; hand every new reply to ``on_reply``.

        Raises ``IpcClosedError`` when the executor is gone (then ``close``).
        """
        channel, writer, reader = self._channel, self._writer, self._reader
        if channel is None or writer is None or reader is None:
            return
        positions = channel.receive()
        if positions is None:
            return
        head, ack, seen = positions
        with self._lock:
            writer.ack(max(writer.acked, min(ack, writer.head)))
            self._seen = max(self._seen, seen)
            self._announce_if_owed(channel, writer, reader)
        reader.announce(head)
        for tag, view in reader.records():
            if tag == REPLY:
                self.on_reply(read_reply(view, copy=self.copy_replies))
            view.release()
        self._ack_if_due()

    def on_writable(self) -> None:
        self.flush()

    def flush(self) -> None:
        with self._lock:
            channel, writer, reader = self._channel, self._writer, self._reader
            if channel is not None and writer is not None and reader is not None and channel.dirty:
                self._announced = writer.head
                channel.send(writer.head, reader.acked, reader.head)

    def _ack_if_due(self) -> None:
        reader = self._reader
        if reader is None or reader.acked - self._sent_ack < self.ring_bytes // _ACK_EVERY:
            return
        with self._lock:
            channel, writer = self._channel, self._writer
            if channel is not None and writer is not None:
                self._sent_ack = reader.acked
                self._announced = writer.head  # any message announces the head too
                channel.send(writer.head, reader.acked, reader.head)

    def close(self) -> None:
        with self._lock:
            channel, writer, reader = self._channel, self._writer, self._reader
            self._channel = self._writer = self._reader = None
        if channel is not None:
            channel.close()
        for ring in (writer, reader):
            if ring is not None:
                ring.close()


# -- the executor side ----------------------------------------------------------------------


class IpcListener:
    """An executor's listening socket; ``accept`` returns an ``IngressPeer`` after its hello."""

    def __init__(self, address: str, info: ModelInfo, *, backlog: int = 64) -> None:
        self.address = address
        self.info = info
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.bind(address)
            self.sock.listen(backlog)
        except BaseException:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self, timeout_s: float = 2.0) -> IngressPeer | None:
        """The next ingress, hello done; None if none is waiting or its hello is bad."""
        try:
            sock, _ = self.sock.accept()
        except BlockingIOError:
            return None
        try:
            sock.settimeout(timeout_s)
            raw, fds, _flags, _addr = socket.recv_fds(sock, _HELLO_BYTES, 2)
        except OSError:
            sock.close()
            return None
        try:
            hello = json.loads(raw)
            if len(fds) != 2:
                raise ValueError(f"expected 2 ring descriptors, got {len(fds)}")
            request_ring = RingReader(fds[0], int(hello["request_ring"]))
            reply_ring = RingWriter(fds[1], int(hello["reply_ring"]))
            sock.send(self.info.to_json())
        except (ValueError, KeyError, TypeError, OSError):
            sock.close()
            return None
        finally:
            for fd in fds:
                os.close(fd)
        return IngressPeer(_Channel(sock), request_ring, reply_ring, str(hello.get("ingress", "?")))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@dataclass
class _Pending:
    key: int
    error: ErrorCode
    text: bytes
    size: int
    prepared: list[Any]
    timing: tuple[float, float, int, int]


class IngressPeer:
    """The executor's view of one connected ingress process."""

    def __init__(
        self, channel: _Channel, requests: RingReader, replies: RingWriter, ingress_id: str
    ) -> None:
        self._channel = channel
        self._requests = requests
        self._replies = replies
        self.ingress_id = ingress_id
        self._backlog: deque[_Pending] = deque()  # replies waiting for room in the ring
        self._sent = (0, 0, 0)

    def fileno(self) -> int:
        return self._channel.fileno()

    @property
    def closed(self) -> bool:
        return self._channel.closed

    def requests(self) -> Iterator[RequestRecord]:
        """Every request announced so far (tensors copied out of the ring)."""
        positions = self._channel.receive()
        if positions is not None:
            head, ack, _seen = positions
            self._replies.ack(max(self._replies.acked, min(ack, self._replies.head)))
            self._requests.announce(head)
            self._drain_backlog()
        for tag, view in self._requests.records():
            if tag == REQUEST:
                yield read_request(view)
            view.release()

    def reply(
        self,
        key: int,
        error: ErrorCode = ErrorCode.OK,
        message: str = "",
        tensors: list[tuple[int, np.ndarray]] | None = None,
        *,
        queue_ms: float = 0.0,
        compute_ms: float = 0.0,
        batch_rows: int = 0,
        batch_requests: int = 0,
    ) -> None:
        """Queue one reply; ``flush`` tells the ingress."""
        size, text, prepared = reply_size(message, tensors or [])
        pending = _Pending(
            key, error, text, size, prepared, (queue_ms, compute_ms, batch_rows, batch_requests)
        )
        if self._backlog or not self._write(pending):
            self._backlog.append(pending)

    def _write(self, p: _Pending) -> bool:
        try:
            view = self._replies.reserve(p.size)
        except ValueError:  # larger than the ring: the ingress gets an error instead
            return self._write(
                _Pending(
                    p.key,
                    ErrorCode.TOO_LARGE,
                    b"the outputs are larger than the reply ring",
                    reply_size("the outputs are larger than the reply ring", [])[0],
                    [],
                    p.timing,
                )
            )
        if view is None:
            return False
        try:
            queue_ms, compute_ms, rows, requests = p.timing
            write_reply(
                view,
                p.key,
                p.error,
                p.text,
                queue_ms=queue_ms,
                compute_ms=compute_ms,
                batch_rows=rows,
                batch_requests=requests,
                prepared=p.prepared,
            )
        finally:
            view.release()
        self._replies.commit(REPLY)
        return True

    def _drain_backlog(self) -> None:
        while self._backlog and self._write(self._backlog[0]):
            self._backlog.popleft()

    def flush(self) -> None:
        """Send positions if anything changed since the last message (or one is owed).

        ``seen``, the request head read up to, changes after every read: the ingress
        waits for it to announce the requests it wrote meanwhile.
        """
        now = (self._replies.head, self._requests.acked, self._requests.head)
        if now != self._sent or self._channel.dirty:
            self._sent = now
            self._channel.send(*now)

    def close(self) -> None:
        self._channel.close()
        self._backlog.clear()
        self._requests.close()
        self._replies.close()
