"""A device link that hears one reply topic and routes to per-request inboxes: ``InboxLink``.

``InboxLink`` runs on the device's one MQTT connection (``DeviceLink``): it
listens on one topic of the device's own (subscribed on every connection),
decodes each message (``_decode``: ``ProtocolError`` on a malformed one) and
puts it in the inbox of the request it names (``_key``). A retained message,
one of another kind (``_key`` is ``None``) or one for no open inbox is
counted and dropped (``stats``: ``dropped``, ``late``; ``bad`` for a
malformed one, logged), never raised. Losing the connection, or
``detach``, wakes every inbox waiting with a ``LinkFault``. ``TextLink``
(``_cloud``) and ``SpecLink`` (``_spec_link``) are the two kinds.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from shared import InboundMessage, Limits, ProtocolError, Topics

if TYPE_CHECKING:
    from .._device_link import DeviceLink

__all__ = ["InboxLink", "LinkFault"]

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class LinkFault:
    """Why no more text will come from the hub for this turn."""

    reason: str


class InboxLink(Generic[M]):
    """One reply topic on a ``DeviceLink``, routed to inboxes by key (see the module docstring).

    A subclass names its logger (``_log``), what a malformed message is called in
    the log (``_what``), the decoder (``_decode``) and the inbox key of a decoded
    message (``_key``)."""

    _log: ClassVar[logging.Logger]
    _what: ClassVar[str]

    def __init__(self, link: DeviceLink, device_id: str, topic: str, topics: Topics,
                 limits: Limits | None) -> None:  # fmt: skip
        self.link = link
        self.device_id = device_id
        self.topics = topics
        self.limits = limits or Limits()
        self.topic = topic
        self.stats: Counter[str] = Counter()
        self._inboxes: dict[str, queue.SimpleQueue[M | LinkFault]] = {}
        self._lock = threading.Lock()
        self._attached = False

    def _decode(self, payload: bytes) -> object:
        """The decoded message (``ProtocolError`` when malformed)."""
        raise NotImplementedError

    def _key(self, decoded: object) -> tuple[str, M] | None:
        """The inbox key and the message, or ``None`` for a message of another kind."""
        raise NotImplementedError

    def attach(self) -> None:
        """Listen on the topic (subscribed on every connection) and watch the link."""
        if not self._attached:
            self._attached = True
            self.link.watch(self._on_connection)
            self.link.listen(self.topic, self._on_message)

    def detach(self) -> None:
        """Stop listening and watching; every inbox waiting gets a ``LinkFault``."""
        if self._attached:
            self._attached = False
            self.link.unlisten(self.topic)
            self.link.unwatch(self._on_connection)
            self._fail_all("the agent closed")

    @property
    def connected(self) -> bool:
        return self._attached and self.link.connected

    def _hear(self, key: str, inbox: queue.SimpleQueue[M | LinkFault]) -> None:
        with self._lock:
            self._inboxes[key] = inbox

    def _forget(self, key: str) -> None:
        with self._lock:
            self._inboxes.pop(key, None)

    # -- the session's network thread -----------------------------------------------------

    def _on_message(self, message: InboundMessage) -> None:
        if message.retain:  # an old message left on the topic: no request of ours
            self.stats["dropped"] += 1
            return
        try:
            decoded = self._decode(message.payload)
        except ProtocolError as e:
            self.stats["bad"] += 1
            self._log.warning("dropped a malformed %s on %s: %s", self._what, message.topic, e)
            return
        routed = self._key(decoded)
        if routed is None:
            self.stats["dropped"] += 1
            return
        key, item = routed
        with self._lock:
            inbox = self._inboxes.get(key)
        if inbox is None:  # a request that ended or gave up (or a redelivery after its end)
            self.stats["late"] += 1
            return
        self.stats["received"] += 1
        inbox.put(item)

    def _on_connection(self, up: bool) -> None:
        if not up:
            self._fail_all("the broker connection was lost")

    def _fail_all(self, why: str) -> None:
        with self._lock:
            inboxes = list(self._inboxes.values())
        for inbox in inboxes:
            inbox.put(LinkFault(why))
