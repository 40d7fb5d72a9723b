"""The CDN's one MQTT connection to the fleet: hears reports, publishes assignments.

``FleetLink`` runs on a ``shared.PahoSession`` (connect, reconnect,
re-subscribe on every connection). It subscribes to every device's status
(QoS 1) and telemetry (QoS 0) topic, parses each message with the bounded
decoders in ``shared`` and hands typed events to ``on_event`` from the
session's network thread (the controller only queues them). A message whose
payload names another device than its topic is refused: a device may only
speak for itself. A retained message is dropped (``stale``): the broker
stored it some time ago, so it says nothing about the device now (a
heartbeat retained 30 days ago must not count as seen today when the link
starts). Bad payloads are counted and logged at debug level, never raised
into the session. Without ``on_event`` the link only publishes (it
subscribes to nothing).

Assignments go out retained at QoS 1 on the same connection
(``publish_retained``; ``model_cdn.AssignmentSender`` is the one caller).
The session keeps QoS 1 messages the broker has not acknowledged and sends
them again after a reconnect, so an assignment published while the broker
is away is delivered when it is back; ``stats.unacked`` counts what the
broker has not answered yet. With ``wait_s`` the call returns only once the
broker acknowledged (PUBACK), and raises ``BrokerError`` when it refused
(an MQTT 5 PUBACK reason code, e.g. an ACL's "not authorized") or stayed
silent.

``start`` waits for the first connection attempt, so an unreachable or
refusing broker is one clear ``BrokerError`` at once (and the link is
stopped); after that the session reconnects on its own.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import (
    DeviceReport,
    InboundMessage,
    MqttSettings,
    PahoSession,
    PublishHandle,
    TandemError,
    Topics,
    UpdateStatus,
)

from .._errors import BrokerError, CdnError

__all__ = ["FleetEvent", "FleetLink", "LinkStats"]

log = logging.getLogger("tandem.cdn.fleet")

FleetEvent = DeviceReport | UpdateStatus

_MAX_INFLIGHT = 256  # QoS 1 assignments on the wire at once; the rest wait in the session
_SETTLE_AT = 256  # answered publishes are dropped from the waiting list past this many


@dataclass
class LinkStats:
    reports: int = 0
    statuses: int = 0
    rejected: int = 0
    stale: int = 0  # retained reports, dropped
    published: int = 0
    acked: int = 0  # PUBACKs received, refusals included

    @property
    def unacked(self) -> int:
        return self.published - self.acked


class FleetLink:
    """See the module docstring. ``start()`` connects (and keeps reconnecting)."""

    def __init__(
        self,
        settings: MqttSettings,
        topics: Topics,
        on_event: Callable[[FleetEvent], None] | None = None,
        *,
        client_id: str | None = None,
    ) -> None:
        self.settings, self.topics, self.on_event = settings, topics, on_event
        self._stats = LinkStats()
        self._lock = threading.Lock()
        self._waiting: list[PublishHandle] = []  # published, not yet answered by the broker
        self._settle_at = _SETTLE_AT
        self._client_id = client_id or f"tandem-cdn-fleet-{uuid.uuid4().hex[:10]}"
        self._session: PahoSession | None = None
        self._status_head = f"{topics.prefix}/dev/"

    @property
    def connected(self) -> bool:
        session = self._session
        return session is not None and session.connected

    @property
    def started(self) -> bool:
        return self._session is not None

    @property
    def stats(self) -> LinkStats:
        """The counters; ``acked`` is brought up to date with the broker's answers on each read."""
        with self._lock:
            self._settle()
            return self._stats

    def _settle(self) -> None:
        """Count the broker's answers to waiting publishes (holding ``_lock``)."""
        waiting = self._waiting
        self._waiting = [handle for handle in waiting if not handle.done]
        self._stats.acked += len(waiting) - len(self._waiting)
        self._settle_at = max(_SETTLE_AT, 2 * len(self._waiting))

    def start(self, *, wait_s: float = 10.0) -> FleetLink:
        """Connect and subscribe; ``BrokerError`` if the broker is not there within ``wait_s``."""
        session = PahoSession(
            self.settings,
            self._client_id,
            on_message=self._on_message,
            on_connection=self._on_connection,
            max_inflight=_MAX_INFLIGHT,
        )
        if self.on_event is not None:
            prefix = self.topics.prefix
            session.subscribe(f"{prefix}/dev/+/status", 1)
            session.subscribe(f"{prefix}/dev/+/telemetry", 0)
        self._session = session
        if not session.start(wait_s=wait_s):
            failure = session.connect_failure
            self.stop(timeout_s=0)
            if failure is not None:
                raise BrokerError(failure.explain(self.settings.url))
            raise BrokerError(f"the MQTT broker at {self.settings.url} did not accept a connection")
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Disconnect, after up to ``timeout_s`` for the broker to acknowledge what was sent."""
        session, self._session = self._session, None
        if session is not None:
            session.stop(timeout_s=timeout_s)

    def publish_retained(
        self, device: str, document: Mapping[str, Any], *, wait_s: float | None = None
    ) -> None:
        """Publish ``document`` retained at QoS 1 on the device's assignment topic.

        ``wait_s`` None: queue it and return (the session sends it again after
        a reconnect). A number: return once the broker acknowledged it, or
        raise ``BrokerError`` when the link is down, the broker refused it or
        did not answer within ``wait_s`` seconds.
        """
        session = self._session
        if session is None:
            raise CdnError("the fleet link is not started")
        topic = self.topics.assign(device)
        payload = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        handle = session.publish(topic, payload, qos=1, retain=True)
        if handle.failed:
            raise BrokerError(f"cannot publish to the MQTT broker at {self.settings.url}")
        with self._lock:
            self._stats.published += 1
            self._waiting.append(handle)
            if len(self._waiting) >= self._settle_at:
                self._settle()
        if wait_s is not None:
            self._wait_for_ack(handle, topic, wait_s)

    def _wait_for_ack(self, handle: PublishHandle, topic: str, wait_s: float) -> None:
        where = self.settings.url
        if handle.offline:
            raise BrokerError(
                f"the MQTT broker at {where} is not connected; the assignment goes out "
                "when the link reconnects"
            )
        if handle.wait(wait_s):
            return
        if handle.refusal is not None:
            raise BrokerError(
                f"the MQTT broker at {where} refused the assignment on {topic}: {handle.refusal}"
            )
        raise BrokerError(f"the MQTT broker at {where} did not acknowledge within {wait_s:g} s")

    # ------------------------------------------------------ the session's thread

    def _on_connection(self, up: bool) -> None:
        if up:
            log.info("fleet link connected to %s", self.settings.url)

    def _on_message(self, message: InboundMessage) -> None:
        topic = message.topic
        if self.on_event is None or not topic.startswith(self._status_head):
            return
        device, _, leaf = topic[len(self._status_head) :].partition("/")
        if message.retain:
            with self._lock:
                self._stats.stale += 1
            log.debug("ignored a retained %s message on %s", leaf, topic)
            return
        try:
            event: FleetEvent
            if leaf == "telemetry":
                event = DeviceReport.from_json(message.payload)
            elif leaf == "status":
                event = UpdateStatus.from_json(message.payload)
            else:
                return
            if event.device != device:
                raise CdnError(f"{leaf} on {device}'s topic names device {event.device!r}")
        except (TandemError, ValueError) as e:
            with self._lock:
                self._stats.rejected += 1
            log.debug("ignored a %s message on %s: %s", leaf, topic, e)
            return
        with self._lock:
            if leaf == "telemetry":
                self._stats.reports += 1
            else:
                self._stats.statuses += 1
        self.on_event(event)
