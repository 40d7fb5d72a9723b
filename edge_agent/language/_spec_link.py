"""Speculative rounds over the device's MQTT connection: ``SpecLink``.

``SpecLink`` runs on the device's one connection (``DeviceLink``): it listens
on the device's own verified topic (``…/dev/{device}/verified``; the broker
lets only hubs write there), publishes rounds on
``…/dev/{device}/verify/{model}`` (a session's first round: any replica) or
``…/dev/{device}/verify/{model}/{hub}`` (the replica holding the session),
QoS 1, and hands each decoded verdict to the session it names. Losing the
connection wakes every session waiting (``LinkFault``). A verdict for a
session that is not open, or of another round than the one awaited, is
dropped by the stream (``_speculative``), so a late or repeated verdict
never commits tokens twice.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from typing import TYPE_CHECKING

from shared import (
    InboundMessage,
    Limits,
    ProtocolError,
    PublishHandle,
    Topics,
    VerifyClose,
    VerifyRequest,
    VerifyResult,
    decode_verify_message,
    encode_verify_message,
    new_request_id,
)

from .._errors import UplinkError
from ._cloud import LinkFault

if TYPE_CHECKING:
    from .._device_link import DeviceLink

__all__ = ["SpecInbox", "SpecLink"]

log = logging.getLogger("tandem.edge.spec")

SpecInbox = queue.SimpleQueue[VerifyResult | LinkFault]


class SpecLink:
    """The device's verify topics on its ``DeviceLink`` (see the module docstring)."""

    def __init__(
        self, link: DeviceLink, device_id: str, *, topics: Topics | None = None,
        limits: Limits | None = None,
    ) -> None:  # fmt: skip
        self.link = link
        self.device_id = device_id
        self.topics = topics or Topics()
        self.limits = limits or Limits()
        self.topic = self.topics.verified(device_id)
        self.stats: Counter[str] = Counter()
        self._inboxes: dict[str, SpecInbox] = {}
        self._lock = threading.Lock()
        self._attached = False

    def attach(self) -> None:
        """Listen on the verified topic (subscribed on every connection); watch the link."""
        if not self._attached:
            self._attached = True
            self.link.watch(self._on_connection)
            self.link.listen(self.topic, self._on_message)

    def detach(self) -> None:
        if self._attached:
            self._attached = False
            self.link.unlisten(self.topic)
            self.link.unwatch(self._on_connection)
            self._fail_all("the agent closed")

    @property
    def connected(self) -> bool:
        return self._attached and self.link.connected

    def open(self, session: str) -> SpecInbox:
        """The inbox of a new session's verdicts."""
        inbox: SpecInbox = queue.SimpleQueue()
        with self._lock:
            self._inboxes[session] = inbox
        return inbox

    def send(self, request: VerifyRequest, hub: str | None) -> PublishHandle:
        """Publish one round (to replica ``hub`` alone when given); ``UplinkError`` when it
        cannot be sent."""
        if not self.connected:
            raise UplinkError("not connected to the broker")
        topic = self.topics.device_verify(self.device_id, request.model, hub)
        try:
            handle = self.link.publish(topic, encode_verify_message(request), qos=1)
        except (OSError, ValueError, RuntimeError) as e:
            raise UplinkError(f"publish failed: {e}") from e
        if handle.failed or handle.offline:
            raise UplinkError("publish failed: not connected to the broker")
        self.stats["rounds"] += 1
        return handle

    def close(self, session: str, model: str, hub: str | None) -> None:
        """Stop hearing a session; ask its hub to free it (best effort, not awaited)."""
        with self._lock:
            self._inboxes.pop(session, None)
        if hub is None or not self.connected:
            return
        frame = encode_verify_message(
            VerifyClose(request_id=new_request_id(), session=session, device_id=self.device_id)
        )
        try:
            self.link.publish(self.topics.device_verify(self.device_id, model, hub), frame, qos=1)
            self.stats["closes"] += 1
        except (OSError, ValueError, RuntimeError) as e:
            log.debug("close of session %s not sent: %s", session, e)

    # -- the session's network thread -----------------------------------------------------

    def _on_message(self, message: InboundMessage) -> None:
        if message.retain:
            self.stats["dropped"] += 1
            return
        try:
            decoded = decode_verify_message(message.payload, self.limits)
        except ProtocolError as e:
            self.stats["bad"] += 1
            log.warning("dropped a malformed verdict on %s: %s", message.topic, e)
            return
        if not isinstance(decoded, VerifyResult):
            self.stats["dropped"] += 1
            return
        with self._lock:
            inbox = self._inboxes.get(decoded.session)
        if inbox is None:
            self.stats["late"] += 1
            return
        self.stats["received"] += 1
        inbox.put(decoded)

    def _on_connection(self, up: bool) -> None:
        if not up:
            self._fail_all("the broker connection was lost")

    def _fail_all(self, why: str) -> None:
        with self._lock:
            inboxes = list(self._inboxes.values())
        for inbox in inboxes:
            inbox.put(LinkFault(why))
