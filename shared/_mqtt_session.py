"""One MQTT connection that stays up, behind one small interface for every client of ours.

``MqttSession`` is what the agent's uplink, the updater, the hub's ingress,
the CDN's fleet link and the assignment publisher need from MQTT, and no
more::

    session = PahoSession(settings, "tandem-edge-cam-7", on_message=handle)
    session.subscribe("tandem/v1/dev/cam-7/reply")   # remembered: sent again on every connect
    session.start(wait_s=5.0)                         # connects in the background, retrying
    handle = session.publish(topic, frame, qos=1, correlation_data=b"...", expiry_s=3)
    handle.wait(5.0)                                  # the broker's PUBACK
    session.stop()                                    # unacknowledged QoS 1 first

Rules every implementation keeps:

- ``start`` returns at once, or after ``wait_s`` for the first connection
  (True when connected); the session reconnects with backoff
  (``MqttSettings.reconnect_*``) for as long as it runs;
- every ``subscribe`` is sent again on every connection (sessions are not
  kept: clean start), so an owner never re-subscribes by hand;
  ``subscribed`` is set while every filter is granted;
- ``on_connection(True/False)`` tells the owner when the connection comes
  and goes, on the session's own thread; an owner with requests in flight
  fails them there (they would wait for replies that will not come);
- ``on_message`` receives an ``InboundMessage`` on the session's thread; an
  exception it raises is logged, never raised into the client library (which
  would end its network thread);
- ``publish`` never blocks on the network: it queues and returns a
  ``PublishHandle``; MQTT 5 properties (correlation data, message expiry,
  response topic) are sent only on MQTT 5 connections.

``PahoSession`` (paho-mqtt, pure Python, light: what devices use) lives here;
the hub may use a C-backed one (``cloud_hub``'s awscrt session) with the same
interface, chosen by measurement.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ._mqtt import MqttSettings, create_client, publish_properties, resolve_protocol

__all__ = ["InboundMessage", "MqttSession", "PahoSession", "PublishHandle"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message the session received. ``response_topic``/``correlation_data``: MQTT 5 only."""

    topic: str
    payload: bytes
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None


class PublishHandle(ABC):
    """A queued publish; ``wait`` for the broker's acknowledgement (QoS 1) or the send (QoS 0)."""

    @abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """True once the broker acknowledged it (QoS 1) or it was written (QoS 0)."""

    @property
    @abstractmethod
    def failed(self) -> bool:
        """True when the client refused it (not connected and not queued, too large)."""


MessageHandler = Callable[[InboundMessage], None]
ConnectionHandler = Callable[[bool], None]


class MqttSession(ABC):
    """A long-lived MQTT connection (see the module docstring for the rules)."""

    def __init__(
        self,
        settings: MqttSettings,
        client_id: str,
        *,
        on_message: MessageHandler | None = None,
        on_connection: ConnectionHandler | None = None,
    ) -> None:
        self.settings = settings
        self.client_id = client_id
        self.on_message = on_message
        self.on_connection = on_connection
        self.subscribed = threading.Event()
        self._filters: dict[str, int] = {}
        self._filters_lock = threading.Lock()

    @property
    @abstractmethod
    def protocol(self) -> Literal["5", "3.1.1"]:
        """The MQTT version of the connection (known after ``start``)."""

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @abstractmethod
    def start(self, *, wait_s: float | None = None) -> bool:
        """Connect in the background; with ``wait_s``, wait that long for the first connection."""

    @abstractmethod
    def stop(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` for unacknowledged QoS 1 publishes, then disconnect."""

    @abstractmethod
    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
        response_topic: str | None = None,
    ) -> PublishHandle:
        """Queue one message (never blocks on the network)."""

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe now if connected, and again on every later connection."""
        with self._filters_lock:
            self._filters[topic_filter] = qos
        self.subscribed.clear()
        if self.connected:
            self._send_subscribe({topic_filter: qos})

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving ``topic_filter`` (and do not subscribe to it again)."""
        with self._filters_lock:
            removed = self._filters.pop(topic_filter, None) is not None
        if removed and self.connected:
            self._send_unsubscribe(topic_filter)

    @property
    def filters(self) -> dict[str, int]:
        with self._filters_lock:
            return dict(self._filters)

    @abstractmethod
    def _send_subscribe(self, filters: dict[str, int]) -> None: ...

    @abstractmethod
    def _send_unsubscribe(self, topic_filter: str) -> None: ...

    # -- for implementations: call from the client's callbacks ------------------------------

    def _deliver(self, message: InboundMessage) -> None:
        handler = self.on_message
        if handler is None:
            return
        try:
            handler(message)
        except Exception:  # the client library's thread must go on
            log.exception("MQTT message handler failed on %s", message.topic)

    def _connection_changed(self, up: bool) -> None:
        if up:
            filters = self.filters
            if filters:
                self._send_subscribe(filters)
            else:
                self.subscribed.set()
        else:
            self.subscribed.clear()
        handler = self.on_connection
        if handler is not None:
            try:
                handler(up)
            except Exception:
                log.exception("MQTT connection handler failed")


# -- paho-mqtt -------------------------------------------------------------------------------


class _PahoHandle(PublishHandle):
    def __init__(self, info: Any) -> None:
        self._info = info

    def wait(self, timeout_s: float) -> bool:
        if self._info.rc:
            return False
        try:
            self._info.wait_for_publish(timeout_s)
        except (RuntimeError, ValueError):  # never queued
            return False
        return bool(self._info.is_published())

    @property
    def failed(self) -> bool:
        return bool(self._info.rc)


class PahoSession(MqttSession):
    """``MqttSession`` on paho-mqtt 2.x: its network thread runs every callback."""

    def __init__(
        self,
        settings: MqttSettings,
        client_id: str,
        *,
        on_message: MessageHandler | None = None,
        on_connection: ConnectionHandler | None = None,
        protocol: Literal["5", "3.1.1"] | None = None,
        max_inflight: int = 0,
    ) -> None:
        super().__init__(settings, client_id, on_message=on_message, on_connection=on_connection)
        self._protocol = protocol
        self._max_inflight = max_inflight  # 0: no cap on QoS 1 in flight
        self._client: Any = None
        self._connected = threading.Event()
        self._unacked: deque[Any] = deque(maxlen=4096)
        self._pending_subs: dict[int, list[str]] = {}
        self._closing = False

    @property
    def protocol(self) -> Literal["5", "3.1.1"]:
        return self._protocol or "3.1.1"

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self, *, wait_s: float | None = None) -> bool:
        if self._client is None:
            if self._protocol is None:
                self._protocol = resolve_protocol(self.settings)
            client = create_client(self.settings, self.client_id, protocol=self._protocol)
            client.max_inflight_messages_set(self._max_inflight)
            client.max_queued_messages_set(0)
            client.on_connect = self._on_connect
            client.on_disconnect = self._on_disconnect
            client.on_subscribe = self._on_subscribe
            client.on_message = self._on_message
            client.on_connect_fail = self._on_connect_fail
            self._client = client
            client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive_s)
            client.loop_start()
        if wait_s is None:
            return self.connected
        return self._connected.wait(wait_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        client, self._closing = self._client, True
        if client is None:
            return
        deadline = time.monotonic() + timeout_s
        for info in list(self._unacked):
            left = deadline - time.monotonic()
            if left <= 0 or not self.connected:
                break
            with contextlib.suppress(RuntimeError, ValueError):
                info.wait_for_publish(left)
        client.disconnect()
        client.loop_stop()
        self._client = None
        self._connected.clear()
        self.subscribed.clear()

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
        response_topic: str | None = None,
    ) -> PublishHandle:
        client = self._client
        if client is None:
            raise RuntimeError("the MQTT session is not started")
        properties = None
        if self._protocol == "5":
            properties = (
                publish_properties(correlation_data=correlation_data, expiry_interval_s=expiry_s)
                if response_topic is None
                else _full_properties(response_topic, correlation_data, expiry_s)
            )
        info = client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if qos and not info.rc:
            self._unacked.append(info)
        return _PahoHandle(info)

    def _send_subscribe(self, filters: dict[str, int]) -> None:
        client = self._client
        if client is None:
            return
        result, mid = client.subscribe(list(filters.items()))
        if result == 0:
            self._pending_subs[mid] = list(filters)

    def _send_unsubscribe(self, topic_filter: str) -> None:
        client = self._client
        if client is not None:
            client.unsubscribe(topic_filter)

    # -- paho's callbacks (its network thread) ----------------------------------------------

    def _on_connect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            log.error("broker %s refused %s: %s", self.settings.url, self.client_id, reason)
            return
        self._connected.set()
        self._connection_changed(True)

    def _on_connect_fail(self, _c: Any, _u: Any) -> None:
        log.warning("cannot reach the broker %s; retrying", self.settings.url)

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        if not self._closing:
            log.warning("lost the broker %s (%s); reconnecting", self.settings.url, reason)
        if was:
            self._connection_changed(False)

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, codes: Any, _p: Any) -> None:
        names = self._pending_subs.pop(mid, [])
        failed = [(n, c) for n, c in zip(names, codes, strict=False) if c.is_failure]
        if failed:
            log.error("broker refused the subscription %s: %s", failed[0][0], failed[0][1])
            return
        if not self._pending_subs:
            self.subscribed.set()

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        properties = message.properties
        self._deliver(
            InboundMessage(
                message.topic,
                message.payload,
                bool(message.retain),
                getattr(properties, "ResponseTopic", None) if properties else None,
                getattr(properties, "CorrelationData", None) if properties else None,
            )
        )


def _full_properties(
    response_topic: str, correlation_data: bytes | None, expiry_s: int | None
) -> Any:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    properties = Properties(PacketTypes.PUBLISH)
    properties.ResponseTopic = response_topic
    if correlation_data is not None:
        properties.CorrelationData = correlation_data
    if expiry_s is not None:
        properties.MessageExpiryInterval = expiry_s
    return properties
