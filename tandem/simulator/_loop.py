"""One thread that drives many paho-mqtt clients: ``selectors`` and paho's external-loop API.

A thread per MQTT connection (``loop_start``) does not scale to a thousand
simulated devices on a small machine; here one thread waits on every
client's socket at once and calls ``loop_read`` / ``loop_write`` on the
clients whose sockets are ready, and ``loop_misc`` (keep-alive pings) on
all of them once a second. paho tells us when a socket opens or closes and
when it has something to send (``on_socket_open`` / ``on_socket_close`` /
``on_socket_register_write`` / ``on_socket_unregister_write``), so the
selector always watches exactly the live sockets. What clients queue to
send is written at the end of each round, straight away (a socket almost
always takes it); only what the kernel refuses makes the selector watch
that socket for writing, which saves two system calls per message.

Invariants: every paho call on an attached client happens in the loop
thread (other threads hand work over with ``call_soon``, which wakes the
loop through a socket pair); callbacks run in the loop thread, in order; a
callback that raises is logged and does not stop the loop; ``stop()``
returns once the thread has ended.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["MqttEventLoop", "Timer"]

log = logging.getLogger("tandem.simulator")

_MISC_INTERVAL_S = 1.0
_MAX_WAIT_S = 0.5


class Timer:
    """A callback scheduled with ``call_later``; ``cancel()`` drops it."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class MqttEventLoop:
    """The loop thread, its selector, its timers and the paho clients attached to it."""

    def __init__(self, name: str = "tandem-sim-mqtt") -> None:
        self.name = name
        # Made by start(), so a loop that never starts holds no sockets.
        self._selector: selectors.BaseSelector
        self._wake_r: socket.socket
        self._wake_w: socket.socket
        self._open = False
        self._calls: deque[Callable[[], None]] = deque()
        self._timers: list[tuple[float, int, Timer]] = []
        self._sequence = itertools.count()
        self._clients: set[Any] = set()
        self._to_write: dict[Any, None] = {}  # clients with packets queued, in order
        self._watching_write: set[Any] = set()  # … whose socket the selector watches for it
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._open = True
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the loop thread (what is still queued is dropped) and free the selector."""
        self._stopping.set()
        self._wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("simulator: the MQTT loop thread did not end in %.0f s", timeout_s)
                return
        if self._open:
            self._open = False
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    # -- scheduling ------------------------------------------------------------------------

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in the loop thread, soon. Safe from any thread."""
        self._calls.append(callback)
        if not self.in_loop_thread:
            self._wake()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` in the loop thread after ``delay_s``. Loop thread only."""
        timer = Timer(time.monotonic() + max(0.0, delay_s), callback)
        heapq.heappush(self._timers, (timer.when, next(self._sequence), timer))
        return timer

    # -- clients ---------------------------------------------------------------------------

    def attach(self, client: Any) -> None:
        """Let this loop drive ``client`` (before its first ``connect``). Loop thread only."""
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        self._clients.add(client)

    def detach(self, client: Any) -> None:
        self._clients.discard(client)
        self._to_write.pop(client, None)
        self._watching_write.discard(client)

    def flush(self, client: Any) -> None:
        """Write what ``client`` has queued now (a DISCONNECT before its socket closes)."""
        if client.socket() is not None and client.want_write():
            self._guard(client.loop_write)

    # paho's socket callbacks: (client, userdata, socket)

    def _on_socket_open(self, client: Any, _userdata: Any, sock: Any) -> None:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _on_socket_close(self, client: Any, _userdata: Any, sock: Any) -> None:
        self._watching_write.discard(client)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _on_register_write(self, client: Any, _userdata: Any, _sock: Any) -> None:
        self._to_write[client] = None  # written at the end of this round

    def _on_unregister_write(self, client: Any, _userdata: Any, sock: Any) -> None:
        self._to_write.pop(client, None)
        if client in self._watching_write:
            self._watching_write.discard(client)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.modify(sock, selectors.EVENT_READ, client)

    def _write_queued(self) -> None:
        """Write what clients queued this round; watch the sockets that could not take it all."""
        while self._to_write:
            client = next(iter(self._to_write))
            del self._to_write[client]
            sock = client.socket()
            if sock is None:
                continue
            self._guard(client.loop_write)
            sock = client.socket()
            if sock is not None and client.want_write() and client not in self._watching_write:
                self._watching_write.add(client)
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.modify(
                        sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client
                    )

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        next_misc = time.monotonic() + _MISC_INTERVAL_S
        while not self._stopping.is_set():
            now = time.monotonic()
            wait = min(_MAX_WAIT_S, max(0.0, next_misc - now))
            if self._calls:
                wait = 0.0
            elif self._timers:
                wait = min(wait, max(0.0, self._timers[0][0] - now))
            try:
                events = self._selector.select(wait)
            except OSError:  # a socket closed under select: try again
                log.debug("simulator: select failed; retrying", exc_info=True)
                continue
            for key, mask in events:
                client = key.data
                if client is None:
                    self._drain_wake()
                    continue
                if client.socket() is not key.fileobj:  # closed by an earlier event
                    continue
                if mask & selectors.EVENT_READ:
                    self._read(client)
                if mask & selectors.EVENT_WRITE and client.socket() is key.fileobj:
                    self._guard(client.loop_write)
            self._run_calls()
            self._run_timers()
            if time.monotonic() >= next_misc:
                next_misc = time.monotonic() + _MISC_INTERVAL_S
                for client in list(self._clients):
                    if client.socket() is not None:
                        self._guard(client.loop_misc)
            self._write_queued()

    def _read(self, client: Any) -> None:
        self._guard(client.loop_read)
        sock = client.socket()
        # TLS may hold decrypted bytes that the kernel no longer reports as readable.
        while isinstance(sock, ssl.SSLSocket) and sock.pending() and client.socket() is sock:
            self._guard(client.loop_read)

    def _run_calls(self) -> None:
        for _ in range(len(self._calls)):  # what these calls queue waits for the next round
            self._guard(self._calls.popleft())

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _when, _seq, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._guard(timer.callback)

    def _guard(self, callback: Callable[[], Any]) -> None:
        try:
            callback()
        except Exception:  # one device's bug must not stop a thousand
            log.exception("simulator: error in the MQTT loop")

    def _wake(self) -> None:
        if not self._open:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
