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
from typing import TYPE_CHECKING

from shared import (
    Limits,
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
from ._inbox_link import InboxLink, LinkFault

if TYPE_CHECKING:
    from .._device_link import DeviceLink

__all__ = ["SpecInbox", "SpecLink"]

log = logging.getLogger("tandem.edge.spec")

SpecInbox = queue.SimpleQueue[VerifyResult | LinkFault]


class SpecLink(InboxLink[VerifyResult]):
    """The device's verify topics on its ``DeviceLink`` (see the module docstring)."""

    _log = log
    _what = "verdict"

    def __init__(
        self, link: DeviceLink, device_id: str, *, topics: Topics | None = None,
        limits: Limits | None = None,
    ) -> None:  # fmt: skip
        topics = topics or Topics()
        super().__init__(link, device_id, topics.verified(device_id), topics, limits)

    def _decode(self, payload: bytes) -> object:
        return decode_verify_message(payload, self.limits)

    def _key(self, decoded: object) -> tuple[str, VerifyResult] | None:
        if not isinstance(decoded, VerifyResult):
            return None
        return decoded.session, decoded

    def open(self, session: str) -> SpecInbox:
        """The inbox of a new session's verdicts."""
        inbox: SpecInbox = queue.SimpleQueue()
        self._hear(session, inbox)
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
        self._forget(session)
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
