"""A user-space TCP relay that adds a fixed one-way delay in each direction (bench part i).

This kernel has no ``sch_netem`` (``tc qdisc add dev X root netem delay 10ms``
answers "Specified qdisc kind is unknown"), so the round trips of the text
collaboration bench are made here instead: ``DelayRelay(host, port,
one_way_s)`` listens on a free loopback port and, for every client that
connects, opens a connection to ``host:port`` and copies bytes both ways.
Each chunk read from one side is held until ``received + one_way_s`` and then
written to the other, in the order it was read; a chunk's release time is
never earlier than the one before it on the same direction, so the delay is
added to every byte without limiting the bandwidth (a reader keeps reading
while earlier chunks wait). A round trip through the relay therefore takes
``2 * one_way_s`` longer than without it, plus the relay's own scheduling.

Every chunk is recorded (``Chunk``: connection number, direction, size, when
read, when due, when written) so that tests can check order, integrity and
that no chunk left before its due time, without timing assertions. Threads,
not asyncio: two per direction per connection (a reader and a writer), few
connections (one MQTT client each).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType

__all__ = ["Chunk", "DelayRelay"]

_READ = 65536
_CLOSED = None  # the reader's end-of-stream mark on a direction's queue


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk that crossed the relay; times are ``time.monotonic()`` seconds."""

    connection: int
    direction: str  # "up": client -> target; "down": target -> client
    size: int
    received: float
    due: float
    released: float


class DelayRelay:
    """Listen on ``127.0.0.1:<port>``; relay each connection to ``target`` with ``one_way_s``.

    Use as a context manager (or ``start()``/``close()``); ``port`` is the
    listening port once started. ``chunks()`` returns the record so far.
    ``close()`` stops accepting, closes every relayed connection and joins the
    relay's threads.
    """

    def __init__(self, host: str, port: int, one_way_s: float) -> None:
        if one_way_s < 0:
            raise ValueError(f"one_way_s must be >= 0, not {one_way_s}")
        self.target = (host, port)
        self.one_way_s = float(one_way_s)
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._record: list[Chunk] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._connections = 0

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the relay is not started")
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:<port>``: the broker as a client behind the relay sees it."""
        return f"mqtt://127.0.0.1:{self.port}"

    def chunks(self) -> list[Chunk]:
        with self._lock:
            return list(self._record)

    def start(self) -> DelayRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)  # the accept loop looks at _closing this often
        self._listener = listener
        self._spawn(self._accept_loop, "relay-accept")
        return self

    def __enter__(self) -> DelayRelay:
        return self.start()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(10)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()

    # ------------------------------------------------------------------ threads

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()  # the target is down: the client sees its connection refused
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
                number = self._connections
                self._connections += 1
            for direction, source, sink in (("up", client, upstream), ("down", upstream, client)):
                held: queue.SimpleQueue[tuple[float, float, bytes] | None] = queue.SimpleQueue()
                self._spawn(self._read, f"relay-{number}-{direction}-read", source, held)
                self._spawn(
                    self._write, f"relay-{number}-{direction}-write", sink, held, number, direction
                )

    def _read(
        self, source: socket.socket, held: queue.SimpleQueue[tuple[float, float, bytes] | None]
    ) -> None:
        """Read chunks as they come; each is due ``one_way_s`` after it was read."""
        last_due = 0.0
        try:
            while True:
                data = source.recv(_READ)
                if not data:
                    break
                received = time.monotonic()
                last_due = max(received + self.one_way_s, last_due)
                held.put((received, last_due, data))
        except OSError:
            pass
        finally:
            held.put(_CLOSED)

    def _write(
        self,
        sink: socket.socket,
        held: queue.SimpleQueue[tuple[float, float, bytes] | None],
        number: int,
        direction: str,
    ) -> None:
        """Write each chunk at its due time, in order; pass the end of stream on after them."""
        try:
            while (item := held.get()) is not _CLOSED:
                received, due, data = item
                wait = due - time.monotonic()
                if wait > 0 and self._closing.wait(wait):
                    return
                sink.sendall(data)
                released = time.monotonic()
                with self._lock:
                    self._record.append(
                        Chunk(number, direction, len(data), received, due, released)
                    )
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
        except OSError:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_RDWR)  # the other side is gone: end both ways
