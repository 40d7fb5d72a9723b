"""``shared.MqttSession`` on paho-mqtt 2.x: the session devices and the CDN use.

paho-mqtt is pure Python and light, so it is what a device installs; its
network thread runs every callback. The interface and the rules every
session keeps are in ``_mqtt_session``; the hub's awscrt twin is
``cloud_hub/mqtt/_crt_session.py``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from typing import Any, Literal

from ._mqtt import MqttSettings, create_client, publish_properties, resolve_protocol
from ._mqtt_session import (
    ConnectFailure,
    ConnectionHandler,
    InboundMessage,
    MessageHandler,
    MqttRefusal,
    MqttSession,
    PublishHandle,
)

__all__ = ["PahoSession"]

log = logging.getLogger(__name__)


_ERR_NO_CONN = 4  # paho's MQTT_ERR_NO_CONN: a QoS 1 message is kept and sent after a reconnect
_MAX_REFUSALS = 1024  # PUBACK refusals remembered until their handle reads them
_NO_MATCHING_SUBSCRIBERS = 0x10  # an MQTT 5 PUBACK reason: accepted, but nobody reads it


class _PahoHandle(PublishHandle):
    __slots__ = ("_checked", "_info", "_reason", "_session", "offline")

    def __init__(self, info: Any, session: PahoSession, *, offline: bool) -> None:
        self._info = info
        self._session = session
        self._reason: MqttRefusal | None = None  # a PUBACK reason other than success
        self._checked = False
        self.offline = offline

    def wait(self, timeout_s: float) -> bool:
        if self._info.rc:
            return False
        try:
            self._info.wait_for_publish(timeout_s)
        except (RuntimeError, ValueError):  # never queued
            return False
        return self.done and self.refusal is None

    @property
    def failed(self) -> bool:
        return bool(self._info.rc)

    @property
    def done(self) -> bool:
        return bool(self._info.rc) or bool(self._info.is_published())

    @property
    def refusal(self) -> MqttRefusal | None:
        reason = self._puback_reason()
        return reason if reason is not None and reason.code >= 0x80 else None

    @property
    def no_subscribers(self) -> bool:
        reason = self._puback_reason()
        return reason is not None and reason.code == _NO_MATCHING_SUBSCRIBERS

    def _puback_reason(self) -> MqttRefusal | None:
        # paho records a PUBACK's reason in on_publish, before it marks the message published.
        if not self._checked and not self._info.rc and self._info.is_published():
            self._reason = self._session._take_refusal(self._info.mid)
            self._checked = True
        return self._reason


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
        self._unacked: deque[Any] = deque(maxlen=4096)
        self._pending_subs: dict[int, list[str]] = {}  # SUBSCRIBE mid -> its filters
        # Held while a SUBSCRIBE is sent and recorded: its SUBACK may come back on the
        # network thread before ``client.subscribe`` has even returned the mid.
        self._subs_lock = threading.Lock()
        self._refusals: dict[int, MqttRefusal] = {}  # mid -> its PUBACK's refusal (or 0x10)
        self._refusals_lock = threading.Lock()
        self._attempt_failed = False  # the current attempt's failure is already recorded
        self._closing = False

    @property
    def protocol(self) -> Literal["5", "3.1.1"]:
        return self._protocol or "3.1.1"

    def start(self, *, wait_s: float | None = None) -> bool:
        if self._client is None:
            if self._protocol is None:
                self._protocol = resolve_protocol(self.settings, client_id=self.client_id)
            client = create_client(self.settings, self.client_id, protocol=self._protocol)
            client.max_inflight_messages_set(self._max_inflight)
            client.max_queued_messages_set(0)
            client.on_pre_connect = self._on_pre_connect
            client.on_connect = self._on_connect
            client.on_disconnect = self._on_disconnect
            client.on_subscribe = self._on_subscribe
            client.on_message = self._on_message
            client.on_publish = self._on_publish
            client.on_connect_fail = self._on_connect_fail
            self._starting()
            self._closing = False
            self._client = client
            client.connect_async(
                self.settings.host,
                self.settings.port,
                self.settings.keepalive_s,
                properties=_connect_properties(self.settings, self._protocol),
            )
            client.loop_start()
        return self._first_outcome(wait_s)

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
        self._connection_changed(False)  # paho may not call on_disconnect once its loop stopped

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
        offline = info.rc == _ERR_NO_CONN
        if qos and offline:
            # Kept in paho's queue and sent after the reconnect, when paho marks it
            # published; "no connection" would make it look dropped to wait_for_publish.
            info.rc = 0
        if qos and not info.rc:
            self._unacked.append(info)
        return _PahoHandle(info, self, offline=offline)

    def _send_subscribe(self, filters: dict[str, int]) -> None:
        client = self._client
        if client is None:
            return
        with self._subs_lock:
            result, mid = client.subscribe(list(filters.items()))
            if result == 0:
                self._pending_subs[mid] = list(filters)

    def _send_unsubscribe(self, topic_filter: str) -> None:
        client = self._client
        if client is not None:
            client.unsubscribe(topic_filter)

    def _take_refusal(self, mid: int) -> MqttRefusal | None:
        with self._refusals_lock:
            return self._refusals.pop(mid, None)

    # -- paho's callbacks (its network thread) ----------------------------------------------

    def _on_pre_connect(self, _c: Any, _u: Any) -> None:
        self._attempt_failed = False

    def _on_connect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            refusal = MqttRefusal(int(reason.value), str(reason))
            self._attempt_failed = True
            self._connect_failed(ConnectFailure(str(refusal), refusal))
            return
        with self._subs_lock:
            self._pending_subs.clear()  # a clean start: what the last connection sent is gone
        self._connection_changed(True)

    def _on_connect_fail(self, _c: Any, _u: Any) -> None:
        # paho calls this inside its ``except OSError`` block: the error is the current one.
        error = sys.exc_info()[1]
        reason = (str(error) or type(error).__name__) if error else "connection failed"
        self._attempt_failed = True
        self._connect_failed(ConnectFailure(reason))

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not self.connected:
            if not self._attempt_failed and not self._closing:
                self._connect_failed(ConnectFailure(f"closed before answering ({reason})"))
            return
        if not self._closing:
            log.warning("lost the broker %s (%s); reconnecting", self.settings.url, reason)
        self._connection_changed(False)

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, codes: Any, _p: Any) -> None:
        with self._subs_lock:
            names = self._pending_subs.pop(mid, [])
            waiting = bool(self._pending_subs)
        failed = [(n, c) for n, c in zip(names, codes, strict=False) if c.is_failure]
        if failed:
            log.error("broker refused the subscription %s: %s", failed[0][0], failed[0][1])
            return
        if not waiting:
            self.subscribed.set()

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        if reason.value >= 0x80 or reason.value == _NO_MATCHING_SUBSCRIBERS:
            with self._refusals_lock:
                if len(self._refusals) >= _MAX_REFUSALS:
                    self._refusals.pop(next(iter(self._refusals)))
                self._refusals[mid] = MqttRefusal(int(reason.value), str(reason))
        elif self._refusals:  # a reused message id: forget an old refusal
            with self._refusals_lock:
                self._refusals.pop(mid, None)

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


def _connect_properties(settings: MqttSettings, protocol: str) -> Any:
    """MQTT 5 CONNECT properties: the maximum packet size this client takes, if limited."""
    if protocol != "5" or settings.max_packet_bytes is None:
        return None
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    properties = Properties(PacketTypes.CONNECT)
    properties.MaximumPacketSize = settings.max_packet_bytes
    return properties


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
