"""uvicorn in a thread of its own, with ``start`` and ``stop``, beside the hub's other threads.

Why a thread and not ``uvicorn.run``: the hub process is already a set of
threads (batchers, MQTT, replies) with its own signal handling in
``Hub.run_forever``; the HTTP server is one more part that starts after the
hub and stops before it. The listening socket is bound here, in the caller's
thread, so ``start`` raises at once when the port is taken (and ``port=0``
gets a free port, read back from ``port``); uvicorn installs no signal
handlers outside the main thread. ``stop`` asks uvicorn to exit: it stops
accepting, lets requests in flight finish for up to ``graceful_timeout_s``,
then closes the connections.

With ``tls`` it serves HTTPS: ``certfile``/``keyfile`` are its certificate,
and ``ca_certs``, when set, the CA that must have signed every client's
certificate (mutual TLS; a client without one fails the handshake). The
files are read in ``start``, so a bad one raises there, in the caller.

``timeouts`` (``shared.HttpTimeouts``) bound how long a client may take to
send a request's headers and body: a slow client is answered 408 and
dropped instead of holding a connection for ever (``shared.server._http_guards``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from shared.server import HttpTimeouts, uvicorn_options

from .._errors import HubError

if TYPE_CHECKING:
    from shared import TlsSettings

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)


class HttpServer:
    """Serves an ASGI app (``create_app(hub)``) on ``host:port`` from a background thread."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        graceful_timeout_s: float = 5.0,
        tls: TlsSettings | None = None,
        reuse_port: bool = False,
        timeouts: HttpTimeouts | None = None,
    ) -> None:
        if tls is not None and tls.certfile is None:
            raise HubError("HTTPS needs the server's certificate and key (tls.certfile)")
        self.app = app
        self.tls = tls
        self.host = host
        self.port = port
        self.graceful_timeout_s = graceful_timeout_s
        self.reuse_port = reuse_port  # several processes on one port; the kernel spreads them
        self.timeouts = timeouts or HttpTimeouts()
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def started(self) -> bool:
        """Whether uvicorn accepts connections."""
        return self._server is not None and self._server.started

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> HttpServer:
        """Bind, start serving, and wait until uvicorn accepts. Raises ``HubError`` if not."""
        if self._thread is not None:
            return self
        self._prepare()
        assert self._server is not None
        self._thread = threading.Thread(target=self._run, name="hub-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                error = self._error
                self.stop()
                raise HubError(
                    f"HTTP: the server on {self.url} did not start"
                    + (f": {error}" if error is not None else f" within {timeout_s}s")
                ) from error
            time.sleep(0.01)
        log.info("HTTP API (Open Inference Protocol v2) on %s", self.url)
        return self

    async def serve(self) -> None:
        """Bind and serve in the running event loop until ``exit`` (a process's main loop)."""
        self._prepare()
        assert self._server is not None and self._socket is not None
        log.info("HTTP API (Open Inference Protocol v2) on %s", self.url)
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            self._socket.close()

    def exit(self) -> None:
        """Make ``serve`` stop accepting, finish what is in flight, and return."""
        if self._server is not None:
            self._server.should_exit = True

    def _prepare(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so,
        # and without it every response waits ~40 ms for the client's delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise HubError(f"HTTP: cannot listen on {self.host}:{self.port}: {e}") from e
        self.port = int(sock.getsockname()[1])
        self._socket = sock
        config = uvicorn.Config(
            self.app,
            log_config=None,  # leave the process's logging as its owner set it up
            log_level="warning",
            access_log=False,
            lifespan="off",
            **uvicorn_options(H11Protocol, self.timeouts),  # header and body deadlines; ws="none"
            timeout_graceful_shutdown=max(1, round(self.graceful_timeout_s)),
            **self._ssl_options(),
        )
        try:
            config.load()  # reads the TLS files: a bad one is this caller's error
        except (OSError, ssl.SSLError) as e:
            sock.close()
            self._socket = None
            raise HubError(f"HTTP: cannot use the TLS files: {e}") from e
        self._server = uvicorn.Server(config)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, finish what is in flight, close. Safe to call twice."""
        server, thread, sock = self._server, self._thread, self._socket
        self._server = self._thread = self._socket = None
        if server is not None:
            server.should_exit = True
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("HTTP server on %s did not stop within %ss", self.url, timeout_s)
        if sock is not None:
            sock.close()

    def _ssl_options(self) -> dict[str, Any]:
        tls = self.tls
        if tls is None:
            return {}
        return {
            "ssl_certfile": tls.certfile,
            "ssl_keyfile": tls.keyfile,
            "ssl_ca_certs": tls.ca_certs,
            "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.ca_certs else ssl.CERT_NONE,
        }

    def _run(self) -> None:
        assert self._server is not None and self._socket is not None
        try:
            asyncio.run(self._server.serve(sockets=[self._socket]))
        except BaseException as e:  # reported by start(), or logged when serving ends badly
            self._error = e
            log.exception("HTTP server on %s stopped with an error", self.url)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()
