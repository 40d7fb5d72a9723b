"""Pure helpers between MQTT frames and the dispatcher: whom to answer, and where.

The MQTT front answers every request it can correlate, including those whose
frame it cannot decode. ``salvage_target`` reads just enough of a bad
frame's header (the id, the reply topic) to send a typed error back;
without both, there is nobody to answer and the frame is dropped. A
``ReplyTarget`` keeps the request's header (``request``, a ``Message``
without tensors), from which the reply is built with ``Message.reply``.

``reply_topic_allowed`` keeps the hub from being used as a reflector: a
reply goes to an ordinary topic, never to a ``$`` system topic or back onto
a request topic (which would loop through every hub).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared import NAME_PATTERN, Limits, Message, ProtocolError, Topics, decode_header

__all__ = ["ReplyTarget", "reply_topic_allowed", "salvage_target"]

_MAX_TOPIC = 512


@dataclass(frozen=True)
class ReplyTarget:
    """Where and how to answer one request. ``deadline`` is in ``time.monotonic()`` seconds."""

    request: Message  # the header; replies are built with ``request.reply``
    reply_to: str
    received: float  # monotonic time the hub got the frame
    correlation_data: bytes | None = None  # MQTT 5, echoed back when the request had it
    deadline: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def model_version(self) -> str | None:
        return self.request.model_version

    @property
    def device_id(self) -> str | None:
        return self.request.device_id

    @classmethod
    def of(
        cls,
        request: Message,
        reply_to: str,
        received: float,
        correlation_data: bytes | None = None,
    ) -> ReplyTarget:
        deadline = None if request.timeout_ms is None else received + request.timeout_ms / 1000.0
        return cls(
            request=request,
            reply_to=reply_to,
            received=received,
            correlation_data=correlation_data,
            deadline=deadline,
        )

    def expiry_interval_s(self, now: float) -> int | None:
        """MQTT 5 message expiry for the reply: the whole seconds left until the deadline."""
        if self.deadline is None:
            return None
        return max(1, math.ceil(self.deadline - now))


def reply_topic_allowed(topic: object, topics: Topics) -> bool:
    """Whether the hub may publish a reply on ``topic``."""
    return (
        isinstance(topic, str)
        and 0 < len(topic) <= _MAX_TOPIC
        and "+" not in topic
        and "#" not in topic
        and "\0" not in topic
        and not topic.startswith("$")
        and topics.parse_request_topic(topic) is None  # never onto a request topic: a loop
    )


def salvage_target(
    payload: bytes,
    *,
    limits: Limits,
    topics: Topics,
    topic_model: str | None,
    received: float,
    response_topic: str | None = None,
    correlation_data: bytes | None = None,
    reply_to: str | None = None,
) -> ReplyTarget | None:
    """A reply target read from a frame that does not decode, or ``None`` if there is none.

    The header is read with the frame-size limit lifted to the frame's own
    length (the bytes are already in memory), so an oversized frame can still
    be answered ``too_large``; the header-size limit still holds. ``reply_to``
    (a device's own reply topic, from its request topic) wins over the frame's.
    """
    relaxed = dataclasses.replace(limits, max_frame_bytes=max(len(payload), limits.max_frame_bytes))
    try:
        header: Mapping[str, Any] = decode_header(payload, relaxed)
    except Exception:  # garbage: not even a header to read
        return None
    if header.get("kind", "request") != "request":
        return None
    request_id = header.get("id")
    if reply_to is None:  # the first topic layout: the frame says where to answer
        reply_to = header.get("reply_to", response_topic)
    if not (isinstance(request_id, str) and 0 < len(request_id) <= 128):
        return None
    if not reply_topic_allowed(reply_to, topics):
        return None
    model = header.get("model")
    if not (isinstance(model, str) and NAME_PATTERN.fullmatch(model)):
        model = topic_model or "unknown"
    device = header.get("device")
    version = header.get("version")
    timeout_ms = header.get("timeout_ms")
    deadline = None
    if isinstance(timeout_ms, int | float) and not isinstance(timeout_ms, bool):
        try:
            budget_ms = float(timeout_ms)  # a 400-digit int overflows here, not later
        except OverflowError:
            budget_ms = math.inf
        if math.isfinite(budget_ms) and budget_ms >= 0:
            deadline = received + budget_ms / 1000.0
    try:
        request = Message(
            kind="request",
            request_id=request_id,
            model=model,
            model_version=version if isinstance(version, str) and 0 < len(version) <= 64 else None,
            device_id=device if isinstance(device, str) and 0 < len(device) <= 128 else None,
            reply_to=reply_to,
        )
    except ProtocolError:  # an id or name the envelope would refuse to carry back
        return None
    return ReplyTarget(
        request=request,
        reply_to=reply_to,
        received=received,
        correlation_data=correlation_data,
        deadline=deadline,
    )
