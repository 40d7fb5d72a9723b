"""The CDN's one MQTT connection to the fleet: hears reports, publishes assignments.

``FleetLink`` subscribes to every device's status (QoS 1) and telemetry
(QoS 0) topic, parses each message with the bounded decoders in ``shared``
and hands typed events to ``on_event`` from paho's network thread (the
controller only queues them). A message whose payload names another device
than its topic is refused: a device may only speak for itself. Bad payloads
are counted and logged at debug level, never raised into paho.

Assignments go out retained at QoS 1 on the same connection. paho keeps
unacknowledged QoS 1 messages and sends them again after a reconnect, so an
assignment published while the broker is away is delivered when it is back;
``unacked`` counts what the broker has not confirmed yet.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
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

from .._errors import CdnError

__all__ = ["FleetEvent", "FleetLink", "LinkStats"]

log = logging.getLogger("tandem.cdn.fleet")

FleetEvent = DeviceReport | UpdateStatus


@dataclass
class LinkStats:
    reports: int = 0
    statuses: int = 0
    rejected: int = 0
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
        on_event: Callable[[FleetEvent], None],
        *,
        client_id: str | None = None,
    ) -> None:
        self.settings, self.topics, self.on_event = settings, topics, on_event
        self.stats = LinkStats()
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._client_id = client_id or f"tandem-cdn-fleet-{uuid.uuid4().hex[:10]}"
        self._client: Any = None
        self._status_head = f"{topics.prefix}/dev/"

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self, *, wait_s: float = 10.0) -> FleetLink:
        """Connect and subscribe; ``CdnError`` if the broker is not there within ``wait_s``."""
        client = create_client(
            self.settings, self._client_id, protocol=resolve_protocol(self.settings)
        )
        client.max_inflight_messages_set(256)
        client.max_queued_messages_set(0)  # unbounded: an assignment is never dropped
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        self._client = client
        try:
            client.connect_async(
                self.settings.host, self.settings.port, keepalive=self.settings.keepalive_s
            )
        except (OSError, ValueError) as e:
            raise CdnError(f"cannot reach the MQTT broker at {self.settings.url}: {e}") from e
        client.loop_start()
        if not self._connected.wait(wait_s):
            self.stop()
            raise CdnError(f"the MQTT broker at {self.settings.url} did not accept a connection")
        return self

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        client.disconnect()
        client.loop_stop()
        self._connected.clear()

    def publish_retained(self, device: str, document: dict[str, Any]) -> None:
        """Queue ``document`` retained at QoS 1 on the device's assignment topic."""
        client = self._client
        if client is None:
            raise CdnError("the fleet link is not started")
        payload = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        info = client.publish(self.topics.assign(device), payload, qos=1, retain=True)
        # MQTT_ERR_NO_CONN: queued by paho, sent after the reconnect
        if info.rc not in (0, 4):
            raise CdnError(f"cannot publish to the MQTT broker (paho error {info.rc})")
        with self._lock:
            self.stats.published += 1

    # ----------------------------------------------------------- paho threads

    def _on_connect(self, client: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            log.warning("MQTT broker refused the fleet link: %s", reason)
            return
        prefix = self.topics.prefix
        client.subscribe([(f"{prefix}/dev/+/status", 1), (f"{prefix}/dev/+/telemetry", 0)])
        self._connected.set()
        log.info("fleet link connected to %s", self.settings.url)

    def _on_disconnect(self, *_args: Any) -> None:
        self._connected.clear()

    def _on_publish(self, *_args: Any) -> None:
        with self._lock:
            self.stats.acked += 1

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        topic: str = message.topic
        if not topic.startswith(self._status_head):
            return
        device, _, leaf = topic[len(self._status_head) :].partition("/")
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
