"""An in-process MQTT broker (amqtt) for the zero-setup demo and for tests.

Why embedded: ``tandem demo`` must run on a laptop with nothing installed
but the Python package; production uses a real broker (Mosquitto, EMQX,
HiveMQ) by URL instead.

Why its own thread and event loop: callers (the demo, paho-mqtt clients,
tests) are synchronous; amqtt is asyncio. The broker lives on a private loop
in a daemon thread, and :meth:`EmbeddedBroker.stop` shuts it down on that
loop, cancels what is left and joins the thread, so nothing outlives it.

Limits to know: amqtt speaks MQTT 3.1.1 only (no MQTT 5 properties) and has
no shared subscriptions (``$share/...``), so run a single hub against it.
amqtt has no packet size limit of its own: each connection's reader is
wrapped (``_CappedReader``) so that a packet declaring more than
``max_packet_bytes`` (Tandem's frame limit, ``shared.mqtt_max_packet_bytes``,
as Mosquitto's generated ``max_packet_size``) ends the connection before its
payload is read.

Configuration: listeners and plugins are given in the dictionary form amqtt
0.12 recommends (``plugins`` keyed by class path). Only anonymous auth is
loaded: no ``$SYS`` plugin (it drags in psutil and emits a DeprecationWarning
about that), no packet/event logger plugins. With that configuration amqtt
emits no warnings, so none are filtered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import threading
from types import TracebackType
from typing import Any

from shared import TandemError, mqtt_max_packet_bytes

__all__ = ["BrokerStartError", "EmbeddedBroker"]


class BrokerStartError(TandemError, RuntimeError):
    """The embedded broker did not come up (port taken, timeout, amqtt error)."""


_LOGGERS = ("amqtt", "transitions")  # amqtt's own and its state machine library's
_SHUTDOWN_GRACE_S = 3.0
_ANONYMOUS_AUTH = "amqtt.plugins.authentication.AnonymousAuthPlugin"


class EmbeddedBroker:
    """amqtt on ``host:port`` in a background thread; ``port=0`` picks a free port.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. It can be
    started again after a stop (it keeps its port when it can).
    ``log_level`` sets amqtt's loggers (WARNING by default, since amqtt logs
    every connection at INFO); pass None to leave logging configuration alone.
    ``max_packet_bytes`` (default: Tandem's frame limit) disconnects a client
    whose packet declares more, before its payload is read.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        start_timeout_s: float = 10.0,
        log_level: int | None = logging.WARNING,
        max_packet_bytes: int | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self.host = host
        self._requested_port = port
        self._port = port
        self._start_timeout_s = start_timeout_s
        self._log_level = log_level
        # Tandem's frame limit unless told otherwise; a larger packet ends its connection.
        self.max_packet_bytes = (
            mqtt_max_packet_bytes() if max_packet_bytes is None else max_packet_bytes
        )
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public

    @property
    def port(self) -> int:
        """The TCP port (the one picked, for ``port=0``, once started)."""
        return self._port

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set()

    def start(self) -> EmbeddedBroker:
        """Start serving; returns once the listener accepts connections.

        Raises :class:`BrokerStartError` if the port is taken (an explicit one),
        amqtt fails, or nothing is listening within ``start_timeout_s``.
        """
        with self._lock:
            if self.running:
                return self
            if self._log_level is not None:
                for name in _LOGGERS:
                    logging.getLogger(name).setLevel(self._log_level)
            attempts = 5 if self._requested_port == 0 else 1
            for attempt in range(attempts):
                if self._requested_port == 0 and (attempt > 0 or self._port == 0):
                    self._port = _free_port(self.host)
                error = self._start_once()
                if error is None:
                    return self
                if not (_address_in_use(error) and attempt + 1 < attempts):
                    break
            where = f"{self.host}:{self._port}"
            if _address_in_use(error):
                raise BrokerStartError(f"cannot start MQTT broker: {where} is already in use")
            raise BrokerStartError(f"cannot start MQTT broker on {where}: {error}") from error

    def stop(self, timeout_s: float = 10.0) -> None:
        """Disconnect clients, close the listener, stop the loop and join the thread."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            _signal(self._loop, self._stop_event)
            thread.join(timeout_s)
            if thread.is_alive():
                raise RuntimeError(f"MQTT broker thread did not stop within {timeout_s}s")
            self._thread = self._loop = self._stop_event = None
            self._ready.clear()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedBroker({self.url}, {state})"

    # ----------------------------------------------------------------- private

    def _start_once(self) -> BaseException | None:
        """One attempt on ``self._port``: None when serving, else the error (thread joined)."""
        self._ready.clear()
        self._error = None
        thread = threading.Thread(
            target=self._run, name=f"tandem-mqtt-broker-{self._port}", daemon=True
        )
        self._thread = thread
        thread.start()
        if not self._ready.wait(self._start_timeout_s):
            # Ask the loop to give up (if it got that far), then report.
            _signal(self._loop, self._stop_event)
            thread.join(5.0)
            self._thread = self._loop = self._stop_event = None
            return TimeoutError(f"not listening after {self._start_timeout_s}s")
        if self._error is not None:
            thread.join(5.0)
            self._thread = self._loop = self._stop_event = None
            return self._error
        return None

    def _config(self) -> dict[str, Any]:
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self._port}"}},
            "plugins": {_ANONYMOUS_AUTH: {"allow_anonymous": True}},
        }

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start(); never lost in the thread
            self._error = self._error or e
        finally:
            try:
                _cancel_pending(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._ready.set()  # unblock start() if the loop died before serving

    async def _serve(self) -> None:
        from amqtt.broker import Broker

        clients: set[asyncio.WriteTransport] = set()
        cap = self.max_packet_bytes

        class TrackingBroker(Broker):
            """Remembers each client's transport, so stop() can close them first."""

            async def stream_connected(
                self,
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                listener_name: str,
            ) -> None:
                transport = writer.transport
                clients.add(transport)
                capped: Any = _CappedReader(reader, cap)  # amqtt calls read / readexactly
                try:
                    await super().stream_connected(capped, writer, listener_name)
                finally:
                    clients.discard(transport)
                    # amqtt leaves the socket open when a peer never sends CONNECT
                    # (a port probe); close it rather than leak it to the GC.
                    if not transport.is_closing():
                        transport.close()

        self._stop_event = asyncio.Event()
        try:
            broker = TrackingBroker(self._config(), loop=asyncio.get_running_loop())
            await broker.start()
        except Exception as e:
            self._error = e
            return
        finally:
            self._ready.set()
        await self._stop_event.wait()
        # Close client connections before amqtt's shutdown: its per-client stop cancels the
        # reader task and waits for it, and on Python 3.11 asyncio.wait_for can swallow that
        # cancellation (seen here: stop() hung until the client's keepalive ran out). With
        # the socket closed the reader ends on EOF instead. Clients see the same thing as
        # from any MQTT 3.1.1 broker going away: the connection closes.
        for transport in list(clients):
            transport.close()
        shutdown = asyncio.ensure_future(broker.shutdown())
        done, _ = await asyncio.wait({shutdown}, timeout=_SHUTDOWN_GRACE_S)
        if not done:
            for transport in list(clients):
                transport.abort()
            done, _ = await asyncio.wait({shutdown}, timeout=_SHUTDOWN_GRACE_S)
        if done:
            shutdown.result()
        else:
            logging.getLogger(__name__).warning(
                "amqtt did not shut down within %.0fs; cancelling it", 2 * _SHUTDOWN_GRACE_S
            )
            shutdown.cancel()


class _CappedReader:
    """An MQTT connection's ``StreamReader`` that refuses a packet longer than ``cap``.

    It follows the MQTT framing through what amqtt reads (a header byte, the
    remaining length's bytes, then the rest in one ``readexactly``): once a
    packet's remaining length is known and exceeds ``cap``, it raises
    ``ConnectionResetError``, so amqtt drops the client before reading the
    payload. O(1) per read: body bytes are only counted.
    """

    def __init__(self, reader: asyncio.StreamReader, cap: int) -> None:
        self._reader = reader
        self._cap = cap
        self._body = 0  # bytes of the current packet's rest still to pass
        self._in_length = False  # reading the remaining length's bytes
        self._length = 0
        self._shift = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    async def read(self, n: int = -1) -> bytes:
        return self._seen(await self._reader.read(n))

    async def readexactly(self, n: int) -> bytes:
        return self._seen(await self._reader.readexactly(n))

    def _seen(self, data: bytes) -> bytes:
        i, end = 0, len(data)
        while i < end:
            if self._body:
                step = min(self._body, end - i)
                self._body -= step
                i += step
                continue
            byte = data[i]
            i += 1
            if not self._in_length:  # the fixed header's first byte: the length follows
                self._in_length, self._length, self._shift = True, 0, 0
                continue
            self._length |= (byte & 0x7F) << self._shift
            self._shift += 7
            if byte & 0x80 and self._shift < 28:
                continue
            self._in_length = False
            if self._length > self._cap:
                logging.getLogger(__name__).warning(
                    "a client sent an MQTT packet of %d bytes (limit %d); disconnecting it",
                    self._length,
                    self._cap,
                )
                raise ConnectionResetError("MQTT packet over the size limit")
            self._body = self._length
        return data


def _signal(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event | None) -> None:
    """Set ``event`` on its loop from another thread; a loop that already closed needs nothing."""
    if loop is not None and event is not None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and reap tasks amqtt leaves behind, so none is destroyed pending.

    Bounded (``asyncio.wait`` with a timeout, not ``gather``): a task that
    swallows its cancellation must not hang stop().
    """
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=_SHUTDOWN_GRACE_S))


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _address_in_use(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
            return True
        error = error.__cause__ or error.__context__
    return False
