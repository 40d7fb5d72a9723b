"""What the hub's and the CDN's HTTP servers refuse before their routes run: slow clients and
bodies of the wrong media type.

**Slow clients.** uvicorn closes a connection idle between requests
(``timeout_keep_alive``) but sets no deadline on reading a request: a client
sending its headers one byte a second (slowloris) or its body a trickle at a
time holds a connection, and its memory, for ever. ``HttpTimeouts`` adds the
two deadlines Apache's ``mod_reqtimeout`` has (its ``header=`` and
``body=...,MinRate=`` settings, the model followed here):

- ``header_s``: from the connection's start, or the end of the previous
  response, to the last byte of a request's headers;
- ``body_s`` plus one second per ``body_min_rate_bps`` bytes received: from
  the headers to the last byte of the body, so a large upload on a good link
  is never cut, and a trickle is.

A client past a deadline gets ``408`` (when no response has started) and the
connection is closed; a route waiting for that body sees the client gone.
The close lingers, as nginx's ``lingering_close`` does: the server ends its
side (FIN) and reads and drops what the client still sends for up to
``LINGER_S``, then closes. Closed at once, the next byte a slow client sends
meets a reset, which wipes the ``408`` from the client's receive buffer before
it reads it.
``uvicorn_options(timeouts)`` are the keyword arguments that turn this on in
``uvicorn.Config`` / ``uvicorn.run``; the protocol class subclasses
uvicorn's h11 one, which the server passes in (``shared`` never imports
uvicorn: a device installs ``shared`` without it; h11 is imported on first
use). WebSocket upgrades are off
(``ws="none"``): neither server has a WebSocket route.

**Media types.** ``body_media_type`` reads a request's ``Content-Type`` and
refuses (``UnsupportedMediaTypeError``, answered 415) anything but the types
a route names. Browsers send ``text/plain``, form and multipart bodies
across sites without a CORS preflight, so a route that parsed those as JSON
would let any web page a user opens post to it; JSON
(``application/json``, or ``application/<x>+json``) and the binary tensor
extension (``application/octet-stream``) need a preflight the servers never
grant. A body without ``Content-Type`` is taken: Triton's own HTTP client
sends none.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import UnsupportedMediaTypeError

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "BINARY_MEDIA_TYPE",
    "JSON_MEDIA_TYPE",
    "HttpTimeouts",
    "body_media_type",
    "uvicorn_options",
]

JSON_MEDIA_TYPE = "application/json"
BINARY_MEDIA_TYPE = "application/octet-stream"
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: 50\r\n\r\n"
    b'{"error": "the request was not sent in good time"}'
)
_FORM = "application/x-www-form-urlencoded"
_FORM_HINT = " (curl -d sends a form: add -H 'Content-Type: application/json')"
LINGER_S = 2.0  # how long a dropped client may still send before the connection closes


def body_media_type(content_type: str | None, accepted: frozenset[str]) -> str | None:
    """The media type of a body (lower case, no parameters), if ``accepted`` has it.

    ``None`` when the request names none. ``application/<x>+json`` counts as
    ``application/json``. Anything else raises ``UnsupportedMediaTypeError``.
    """
    if content_type is None or not content_type.strip():
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    kind = (
        JSON_MEDIA_TYPE if media.startswith("application/") and media.endswith("+json") else media
    )
    if kind not in accepted:
        hint = _FORM_HINT if media == _FORM and JSON_MEDIA_TYPE in accepted else ""
        raise UnsupportedMediaTypeError(
            f"Content-Type {media[:60]!r} is not taken here: send "
            + " or ".join(sorted(accepted))
            + hint
        )
    return kind


@dataclass(frozen=True, kw_only=True)
class HttpTimeouts:
    """Deadlines on reading a request (see the module docstring)."""

    header_s: float = 10.0  # connection start (or last response) to the end of the headers
    body_s: float = 30.0  # headers to the end of the body, before the allowance below
    body_min_rate_bps: int = 16 * 1024  # each this many bytes received add one second
    keep_alive_s: int = 5  # idle between requests (uvicorn's own timeout_keep_alive)

    def __post_init__(self) -> None:
        if not (self.header_s > 0 and self.body_s > 0):
            raise ValueError("header_s and body_s must be > 0")
        if self.body_min_rate_bps < 1 or self.keep_alive_s < 1:
            raise ValueError("body_min_rate_bps and keep_alive_s must be >= 1")

    def body_deadline_s(self, received: int) -> float:
        """Seconds from the headers that a body of ``received`` bytes so far may take."""
        return self.body_s + received / self.body_min_rate_bps


def uvicorn_options(h11_protocol: type, timeouts: HttpTimeouts | None = None) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments enforcing ``timeouts`` (the defaults if None).

    ``h11_protocol`` is uvicorn's ``H11Protocol`` class, passed in by the
    server that imports uvicorn: ``shared`` never imports it (a device
    installs ``shared`` without the servers' stack).
    """
    timeouts = timeouts or HttpTimeouts()
    protocol = type("DeadlineH11Protocol", (_deadline_protocol(h11_protocol),), {})
    protocol.timeouts = timeouts  # type: ignore[attr-defined]
    return {"http": protocol, "ws": "none", "timeout_keep_alive": timeouts.keep_alive_s}


# uvicorn's H11Protocol at run time (``_deadline_protocol``): ``shared`` never imports it.
_H11Protocol: Any = object


class _Deadlines(_H11Protocol):
    """The deadlines and the lingering drop, over uvicorn's h11 protocol (its ``cycle``,
    ``conn``, ``transport`` and ``loop``); ``_deadline_protocol`` puts it first in the
    MRO, so each ``super()`` call is uvicorn's."""

    timeouts: HttpTimeouts

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._timed_cycle: Any = None
        self._body_started = 0.0
        self._body_bytes = 0
        self._lingering = False
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:
        if self._lingering:  # the client has finished too
            self.transport.close()
            return None
        return super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # dropped: what a dropped client still sends is read and ignored
        if self._timed_cycle is not None:
            self._body_bytes += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is None or self.transport.is_closing():
            return
        if cycle is not self._timed_cycle and not cycle.response_complete:
            # A new request's headers are in: the body's deadline starts now.
            self._timed_cycle = cycle
            self._body_started, self._body_bytes = self.loop.time(), 0
            self._arm(self.timeouts.body_s, self._body_expired)
        if cycle is self._timed_cycle and not cycle.more_body:
            self._disarm()

    def on_response_complete(self) -> None:
        # Armed first: a pipelined request handled inside super() disarms it again.
        self._timed_cycle = None
        self._await_headers()
        super().on_response_complete()

    def _await_headers(self) -> None:
        self._arm(self.timeouts.header_s, self._headers_expired)

    def _arm(self, delay_s: float, callback: Any) -> None:
        if self._lingering:
            return  # the linger's own timer closes the connection
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_expired(self) -> None:
        self._deadline = None
        self._drop()

    def _body_expired(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is not self._timed_cycle or not cycle.more_body:
            return
        allowed = self.timeouts.body_deadline_s(self._body_bytes)
        left = self._body_started + allowed - self.loop.time()
        if left > 0:  # the body kept its minimum rate: it may go on
            self._arm(left, self._body_expired)
            return
        self._drop()

    def _drop(self) -> None:
        if self.transport.is_closing() or self._lingering:
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            self.transport.write(_REQUEST_TIMEOUT)
        elif cycle.response_complete and self.conn.their_state is not _h11().SEND_BODY:
            self.transport.write(_REQUEST_TIMEOUT)  # a new request, answered in time
        # else: an answered request whose body never ended: nothing more to say
        self._linger()

    def _linger(self) -> None:
        """End our side, tell a route still waiting that the client is gone, drop
        what comes in, close after ``LINGER_S`` (module docstring)."""
        self._lingering = True
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.transport.close()
            return
        self.transport.write_eof()
        self._deadline = self.loop.call_later(LINGER_S, self.transport.close)


def _h11() -> Any:
    import h11  # on first use: devices install shared without the servers' stack

    return h11


@functools.cache
def _deadline_protocol(h11_protocol: type) -> type:
    """``h11_protocol`` with the header and body deadlines (built once per base)."""
    return type("_DeadlineProtocol", (_Deadlines, h11_protocol), {})
