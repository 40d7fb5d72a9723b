"""A text turn at the hub, as the device sees it: ``TextLink`` and ``CloudLeg``.

``TextLink`` runs on the device's one MQTT connection (``DeviceLink``): it
listens on the device's own text topic (``…/dev/{device}/text``, where hubs
stream chunks and finals; the broker lets only hubs write there), publishes
turns on ``…/dev/{device}/generate/{model}`` and cancels on
``…/dev/{device}/cancel`` (QoS 1), and hands each decoded chunk or final to
the turn whose request id it carries. Losing the connection wakes every
turn waiting (``LinkFault``), so none waits out its stall timeout for text
that cannot come.

Sticky turns: a conversation's next turn goes to the hub replica that
answered its last one (``hub``: its KV cache is there), on
``…/dev/{device}/generate/{model}/{hub}``, which only that replica
subscribes to. Two fallbacks, so no turn is lost: the PUBACK says no
subscription matched (MQTT 5 reason 0x10: the replica is gone), or no
message comes within ``CloudTextSettings.sticky_s`` of the send (the
replica is stuck or the PUBACK never came); either way the turn is
cancelled and sent again on the shared topic under a new request id
(``rerouted`` says why), where any replica re-prefills it. Messages of the
abandoned id are dropped (``stale``), so a late answer of the first replica
never reaches the stream.

``CloudLeg`` is one turn's side of it: ``next(deadline)`` returns the next
chunk in ``seq`` order (``ReorderBuffer``: QoS 1 duplicates and reordering
never reach the stream), the final once every chunk before it came, a
``LinkFault`` when the hub fell silent (no message within
``CloudTextSettings.first_chunk_s`` of the request, or ``stall_s`` between
two messages), the connection went, or the turn was interrupted, and
``None`` when ``deadline`` passed. ``cancel`` tells the hub to free the
turn's slot. The turn stream (``_stream``) decides what a fault means: the
device finishes the turn itself, or the turn ends with an error.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared import (
    GenerateCancel,
    GenerateChunk,
    GenerateFinal,
    GenerateRequest,
    Limits,
    PublishHandle,
    Topics,
    decode_text_message,
    encode_text_message,
    new_request_id,
)

from .._errors import UplinkError
from ._inbox_link import InboxLink, LinkFault
from ._reorder import ReorderBuffer

if TYPE_CHECKING:
    from .._device_link import DeviceLink

__all__ = ["CloudLeg", "CloudPlan", "CloudTextSettings", "LinkFault", "TextLink"]

log = logging.getLogger("tandem.edge.text")


@dataclass(frozen=True, kw_only=True)
class CloudTextSettings:
    """How long a turn at the hub may be silent before the device gives up on it (seconds)."""

    first_chunk_s: float = 10.0  # from the request to the hub's first message (queue, prefill)
    stall_s: float = 2.0  # between two messages of the hub
    sticky_s: float = 1.5  # a sticky turn's first message (at most first_chunk_s), before
    # the turn goes to any replica

    def __post_init__(self) -> None:
        if not (self.first_chunk_s > 0 and self.stall_s > 0 and self.sticky_s > 0):
            raise ValueError("first_chunk_s, stall_s and sticky_s must be > 0")


_Inbox = queue.SimpleQueue[GenerateChunk | GenerateFinal | LinkFault]


class TextLink(InboxLink[GenerateChunk | GenerateFinal]):
    """The device's text topics on its ``DeviceLink`` (see the module docstring)."""

    _log = log
    _what = "text message"

    def __init__(
        self, link: DeviceLink, device_id: str, *, topics: Topics | None = None,
        limits: Limits | None = None,
    ) -> None:  # fmt: skip
        topics = topics or Topics()
        super().__init__(link, device_id, topics.text(device_id), topics, limits)

    def _decode(self, payload: bytes) -> object:
        return decode_text_message(payload, self.limits)

    def _key(self, decoded: object) -> tuple[str, GenerateChunk | GenerateFinal] | None:
        if not isinstance(decoded, GenerateChunk | GenerateFinal):
            return None
        return decoded.request_id, decoded

    def open(
        self, request: GenerateRequest, settings: CloudTextSettings, *, hub: str | None = None
    ) -> CloudLeg:
        """Publish ``request`` (to replica ``hub`` alone when given: sticky) and return its
        leg; ``UplinkError`` when it cannot be sent."""
        if not self.connected:
            raise UplinkError("not connected to the broker")
        leg = CloudLeg(self, request, queue.SimpleQueue(), settings)
        leg._start(hub)
        self.stats["turns"] += 1
        return leg

    def _send(self, request: GenerateRequest, inbox: _Inbox, hub: str | None) -> PublishHandle:
        """Hear ``request``'s messages in ``inbox`` and publish it (``UplinkError``)."""
        self._hear(request.request_id, inbox)
        try:
            handle = self.link.publish(
                self.topics.device_generate(self.device_id, request.model, hub),
                encode_text_message(request),
                qos=1,
            )
        except (OSError, ValueError, RuntimeError) as e:
            self._forget(request.request_id)
            raise UplinkError(f"publish failed: {e}") from e
        if handle.failed or handle.offline:
            self._forget(request.request_id)
            raise UplinkError("publish failed: not connected to the broker")
        return handle

    def cancel(self, request_id: str) -> None:
        """Stop hearing a turn; ask the hub to free its slot (best effort: QoS 1, not awaited)."""
        self._forget(request_id)
        if not self.connected:
            return
        frame = encode_text_message(GenerateCancel(request_id=request_id, device_id=self.device_id))
        try:
            self.link.publish(self.topics.cancel(self.device_id), frame, qos=1)
            self.stats["cancels"] += 1
        except (OSError, ValueError, RuntimeError) as e:
            log.debug("cancel of %s not sent: %s", request_id, e)


class CloudLeg:
    """One turn's messages from the hub, in order (see the module docstring)."""

    def __init__(
        self, link: TextLink, request: GenerateRequest, inbox: _Inbox, settings: CloudTextSettings
    ) -> None:
        self.link = link
        self.request = request  # as last sent: a re-routed turn has a new request id
        self.request_id = request.request_id
        self.settings = settings
        self.sticky_to: str | None = None  # the replica the turn was first sent to alone
        self.rerouted: str | None = None  # why it then went to the shared topic
        self.hub: str | None = None  # the replica whose messages came (None: an older hub)
        self.stale = 0  # messages of an abandoned request id, dropped
        self._inbox = inbox
        self._opened = time.perf_counter()
        self._sticky_until: float | None = None
        self._order: ReorderBuffer[GenerateChunk | GenerateFinal] = ReorderBuffer()
        self._ready: list[GenerateChunk | GenerateFinal] = []
        self._heard = False
        self.finished = False  # the final came (or the leg was given up)

    def _start(self, hub: str | None) -> None:
        handle = self.link._send(self.request, self._inbox, hub)
        if hub is None:
            return
        self.sticky_to = hub
        patience = min(self.settings.sticky_s, self.settings.first_chunk_s)
        self._sticky_until = time.perf_counter() + patience
        # The PUBACK says at once (MQTT 5) whether the replica still subscribes: on a
        # loopback or LAN link it comes well before the first chunk could.
        handle.wait(patience)
        if handle.no_subscribers:
            self._reroute(f"hub {hub} is gone (no subscriber on its topic)")

    def _reroute(self, why: str) -> None:
        """Give the sticky send up and send the turn to any replica, under a new id."""
        old = self.request
        self.link.cancel(old.request_id)  # the replica, if it has it, frees the slot
        spent_ms = (time.perf_counter() - self._opened) * 1000.0
        budget = None if old.timeout_ms is None else max(0.0, old.timeout_ms - spent_ms)
        self.request = dataclasses.replace(
            old, request_id=new_request_id(), timeout_ms=budget, sent_at_ms=time.time() * 1000.0
        )
        self.request_id = self.request.request_id
        self.rerouted = why
        self._sticky_until = None
        self.link.stats["rerouted"] += 1
        self.link._send(self.request, self._inbox, None)

    @property
    def duplicates(self) -> int:
        return self._order.duplicates

    def next(self, deadline: float | None) -> GenerateChunk | GenerateFinal | LinkFault | None:
        """The next message in order, a fault, or ``None`` once ``deadline`` passed."""
        while not self._ready:
            silence = self.settings.stall_s if self._heard else self.settings.first_chunk_s
            wait = silence
            sticky = self._sticky_until if not self._heard else None
            if sticky is not None:  # until then a silent replica is given up, not failed
                wait = sticky - time.perf_counter()
            if deadline is not None:
                wait = min(wait, deadline - time.perf_counter())
                if wait <= 0:
                    return None
            try:
                message = self._inbox.get(timeout=max(0.0, wait))
            except queue.Empty:
                if deadline is not None and time.perf_counter() >= deadline:
                    return None
                if sticky is not None and time.perf_counter() >= sticky:
                    try:
                        self._reroute(f"no word from hub {self.sticky_to} within its sticky time")
                    except UplinkError as e:
                        return LinkFault(f"the turn could not be sent again: {e}")
                    continue
                return LinkFault(f"no word from the hub for {silence:g} s")
            if isinstance(message, LinkFault):
                return message
            if message.request_id != self.request_id:  # the abandoned id's late answer
                self.stale += 1
                continue
            self._heard = True
            if message.hub is not None:
                self.hub = message.hub
            self._ready.extend(self._order.push(message.seq, message))
        message = self._ready.pop(0)
        if isinstance(message, GenerateFinal):
            self.finished = True
            self.link._forget(self.request_id)
        return message

    def interrupt(self, why: str) -> None:
        """Wake a ``next`` waiting on another thread (the stream is being closed)."""
        self._inbox.put(LinkFault(why))

    def cancel(self) -> None:
        """Give the turn up: the hub frees its slot (a no-op once the final came)."""
        if not self.finished:
            self.finished = True
            self.link.cancel(self.request_id)


@dataclass(frozen=True)
class CloudPlan:
    """A turn that goes to the hub: what to send, and whether the device may finish it."""

    link: TextLink
    request: GenerateRequest
    settings: CloudTextSettings
    fallback: bool  # finish on the device when the hub fails (prefer_cloud, a heavy turn)
    hub: str | None = None  # the replica holding the conversation's KV cache (sticky)
