"""The intake the hub's request fronts share: ``RequestIntake``.

A front (``TextFront``, ``SpecFront``) takes the messages on its own topics
from the hub's MQTT session and hands every other one to the handler that
was there before it. For one of its own (``_parse`` reads the topic) the
intake counts it ``received``, drops a retained one (a replay, never run),
decodes the frame within ``limits`` (``_decode``) and hands an undecodable
one to ``_refuse_undecodable`` (the front answers it with a typed error
when ``_readable_header`` gives its id, and drops it otherwise), and the
rest to ``_take_decoded``. Drops are counted and logged at a bounded rate
(``RateLimitedLog``); ``RecentRequests`` and ``TransitBaseline`` are the
front's, for its own trust rules (``_late_s``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Generic, TypeVar

from shared import InboundMessage, Limits, MqttSession, RequestTopic, decode_header

from ._admission import RecentRequests, TransitBaseline
from ._log_limit import RateLimitedLog

__all__ = ["RequestIntake"]

F = TypeVar("F")  # a decoded frame


class RequestIntake(Generic[F]):
    """A front's intake of requests on an MQTT session (see the module docstring).

    Call ``__init__`` where the front takes the session's handler over: the session's
    messages come to ``_handle`` from then on."""

    def __init__(self, session: MqttSession, limits: Limits | None, logger: logging.Logger,
                 dropped: str) -> None:  # fmt: skip
        self.session = session
        self.limits = limits or Limits()
        self._next: Callable[[InboundMessage], None] | None = session.on_message
        session.on_message = self._handle
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._recent = RecentRequests()
        self._transit = TransitBaseline()
        self._drop_log = RateLimitedLog(logger, dropped)

    def _parse(self, topic: str) -> RequestTopic | None:
        """The request topic, or ``None`` when it is not one of this front's."""
        raise NotImplementedError

    def _decode(self, payload: bytes) -> F:
        """The decoded frame (any exception: the frame's fault)."""
        raise NotImplementedError

    def _refuse_undecodable(self, message: InboundMessage, device: str, error: Exception) -> None:
        raise NotImplementedError

    def _take_decoded(self, message: InboundMessage, where: RequestTopic, device: str,
                      decoded: F, received: float) -> None:  # fmt: skip
        raise NotImplementedError

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def _drop(self, why: str) -> None:
        self._count("dropped")
        self._drop_log.warning("%s", why)

    # -- the session's thread -------------------------------------------------------------

    def _handle(self, message: InboundMessage) -> None:
        where = self._parse(message.topic)
        if where is None:
            if self._next is not None:
                self._next(message)
            return
        self._count("received")
        received = time.monotonic()
        device = where.device
        assert device is not None
        if message.retain:
            self._drop(f"retained message on {message.topic} ignored")
            return
        try:
            decoded = self._decode(message.payload)
        except Exception as e:  # ProtocolError family; anything else is the frame's fault too
            self._refuse_undecodable(message, device, e)
            return
        self._take_decoded(message, where, device, decoded, received)

    def _readable_header(self, message: InboundMessage) -> dict[str, object]:
        """What can be read of an undecodable frame's header (over any frame size limit);
        ``{}`` when nothing can."""
        relaxed = dataclasses.replace(
            self.limits, max_frame_bytes=max(len(message.payload), self.limits.max_frame_bytes)
        )
        try:
            return decode_header(message.payload, relaxed)
        except Exception:
            return {}

    def _late_s(self, device: str, sent_at_ms: float | None, budget_ms: float | None,
                received: float) -> float | None:  # fmt: skip
        """How late past its whole budget a request arrived (seconds; counted
        ``expired_in_transit``), or ``None`` when it is in time or names no budget."""
        if sent_at_ms is None or budget_ms is None:
            return None
        late_s = self._transit.lateness_s(device, time.time() - sent_at_ms / 1000.0, received)
        if late_s * 1000.0 > budget_ms:
            self._count("expired_in_transit")
            return late_s
        return None
