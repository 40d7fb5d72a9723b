"""The CDN's one MQTT connection to the fleet: hears reports, publishes assignments.

``FleetLink`` subscribes to every device's status (QoS 1) and telemetry
(QoS 0) topic, parses each message with the bounded decoders in ``shared``
and hands typed events to ``on_event`` from paho's network thread (the
controller only queues them). A message whose payload names another device
than its topic is refused: a device may only speak for itself. A retained
message is dropped (``stale``): the broker stored it some time ago, so it
says nothing about the device now (a heartbeat retained 30 days ago must
not count as seen today when the link starts). Bad payloads
are counted and logged at debug level, never raised into paho. Without
``on_event`` the link only publishes (it subscribes to nothing).

Assignments go out retained at QoS 1 on the same connection
(``publish_retained``; ``model_cdn.AssignmentPublisher`` is the one caller).
paho keeps unacknowledged QoS 1 messages and sends them again after a
reconnect, so an assignment published while the broker is away is delivered
when it is back; ``unacked`` counts what the broker has not confirmed yet.
With ``wait_s`` the call returns only once the broker acknowledged
(PUBACK), and raises ``BrokerError`` when it refused or stayed silent.

``start`` connects once in the caller's thread, so an unreachable or
refusing broker is one clear ``BrokerError`` at once; after that paho's
network thread reconnects on its own.
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
    MqttSettings,
    TandemError,
    Topics,
    UpdateStatus,
    create_client,
    resolve_protocol,
)

from .._errors import BrokerError, CdnError

__all__ = ["FleetEvent", "FleetLink", "LinkStats"]

log = logging.getLogger("tandem.cdn.fleet")

FleetEvent = DeviceReport | UpdateStatus

_ERR_NO_CONN = 4  # paho's MQTT_ERR_NO_CONN: queued, sent after the reconnect
_MAX_REFUSALS = 1024  # refused PUBACKs remembered until a waiting publish reads them


@dataclass
class LinkStats:
    reports: int = 0
    statuses: int = 0
    rejected: int = 0
    stale: int = 0  # retained reports, dropped
    published: int = 0
    acked: int = 0

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
        self.stats = LinkStats()
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._answered = threading.Event()  # CONNACK or a disconnect, whichever comes first
        self._refused: Any = None  # the CONNACK's failure reason, if the broker refused
        self._publish_refusals: dict[int, Any] = {}  # mid -> PUBACK failure reason
        self._client_id = client_id or f"tandem-cdn-fleet-{uuid.uuid4().hex[:10]}"
        self._client: Any = None
        self._status_head = f"{topics.prefix}/dev/"

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def started(self) -> bool:
        return self._client is not None

    def start(self, *, wait_s: float = 10.0) -> FleetLink:
        """Connect and subscribe; ``BrokerError`` if the broker is not there within ``wait_s``."""
        where = self.settings.url
        protocol = resolve_protocol(self.settings)  # an unreachable broker: "3.1.1", no error
        client = create_client(self.settings, self._client_id, protocol=protocol)
        client.max_inflight_messages_set(256)
        client.max_queued_messages_set(0)  # unbounded: an assignment is never dropped
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        self._answered.clear()
        self._refused = None
        try:
            client.connect(self.settings.host, self.settings.port, self.settings.keepalive_s)
        except (OSError, ValueError) as e:
            raise BrokerError(f"cannot reach the MQTT broker at {where}: {e}") from e
        self._client = client
        client.loop_start()
        self._answered.wait(wait_s)
        if not self._connected.is_set():
            refused = self._refused
            self.stop()
            if refused is not None:
                raise BrokerError(f"the MQTT broker at {where} refused the connection: {refused}")
            raise BrokerError(f"the MQTT broker at {where} did not accept a connection")
        return self

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        client.disconnect()
        client.loop_stop()
        self._connected.clear()

    def publish_retained(
        self, device: str, document: Mapping[str, Any], *, wait_s: float | None = None
    ) -> None:
        """Publish ``document`` retained at QoS 1 on the device's assignment topic.

        ``wait_s`` None: queue it and return (paho sends it again after a
        reconnect). A number: return once the broker acknowledged it, or raise
        ``BrokerError`` when the link is down, the broker refused it or did
        not answer within ``wait_s`` seconds.
        """
        client = self._client
        if client is None:
            raise CdnError("the fleet link is not started")
        topic = self.topics.assign(device)
        payload = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        info = client.publish(topic, payload, qos=1, retain=True)
        if info.rc not in (0, _ERR_NO_CONN):
            raise BrokerError(f"cannot publish to the MQTT broker (paho error {info.rc})")
        with self._lock:
            self.stats.published += 1
        if wait_s is not None:
            self._wait_for_ack(info, topic, wait_s)

    def _wait_for_ack(self, info: Any, topic: str, wait_s: float) -> None:
        where = self.settings.url
        if info.rc == _ERR_NO_CONN:
            raise BrokerError(
                f"the MQTT broker at {where} is not connected; the assignment goes out "
                "when the link reconnects"
            )
        info.wait_for_publish(wait_s)
        if not info.is_published():
            raise BrokerError(f"the MQTT broker at {where} did not acknowledge within {wait_s:g} s")
        with self._lock:
            reason = self._publish_refusals.pop(info.mid, None)
        if reason is not None:
            raise BrokerError(
                f"the MQTT broker at {where} refused the assignment on {topic}: {reason}"
            )

    # ----------------------------------------------------------- paho threads

    def _on_connect(self, client: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            log.warning("MQTT broker refused the fleet link: %s", reason)
            self._refused = reason
            self._answered.set()
            return
        if self.on_event is not None:
            prefix = self.topics.prefix
            client.subscribe([(f"{prefix}/dev/+/status", 1), (f"{prefix}/dev/+/telemetry", 0)])
        self._connected.set()
        self._answered.set()
        log.info("fleet link connected to %s", self.settings.url)

    def _on_disconnect(self, *_args: Any) -> None:
        self._connected.clear()
        self._answered.set()  # wakes a start() waiting for a CONNACK that will not come

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        # Runs before paho marks the message published, so a waiting publish sees it.
        with self._lock:
            self.stats.acked += 1
            if getattr(reason, "is_failure", False):
                if len(self._publish_refusals) >= _MAX_REFUSALS:
                    self._publish_refusals.pop(next(iter(self._publish_refusals)))
                self._publish_refusals[mid] = reason
            else:
                self._publish_refusals.pop(mid, None)  # a reused mid: forget an old refusal

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        topic: str = message.topic
        if self.on_event is None or not topic.startswith(self._status_head):
            return
        device, _, leaf = topic[len(self._status_head) :].partition("/")
        if getattr(message, "retain", False):
            with self._lock:
                self.stats.stale += 1
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
                self.stats.rejected += 1
            log.debug("ignored a %s message on %s: %s", leaf, topic, e)
            return
        with self._lock:
            if leaf == "telemetry":
                self.stats.reports += 1
            else:
                self.stats.statuses += 1
        self.on_event(event)
