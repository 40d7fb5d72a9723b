"""One MQTT connection that stays up, behind one small interface for every client of ours.

``MqttSession`` is what the agent's uplink, the updater, the hub's ingress,
the CDN's fleet link and the assignment publisher need from MQTT, and no
more::

    session = PahoSession(settings, device_client_id("cam-7"), on_message=handle)
    session.subscribe("tandem/v1/dev/cam-7/reply")  # remembered: sent on every connect
    if not session.start(wait_s=5.0):   # the first attempt's outcome: refused, unreachable
        raise SomeError(session.connect_failure.explain(settings.url))
    handle = session.publish(topic, frame, qos=1, correlation_data=b"...", expiry_s=3)
    handle.wait(5.0)            # True: the broker's PUBACK said yes
    handle.refusal              # an ACL's "no": MqttRefusal(0x87, "Not authorized")
    session.stop()              # waits for unacknowledged QoS 1 first

Rules every implementation keeps:

- ``start`` returns at once, or with ``wait_s`` as soon as the first
  connection attempt has an outcome (True when connected; False when it was
  refused or the broker was not reached, and ``connect_failure`` says which,
  in one line: ``explain(url)``); either way the session reconnects with
  backoff (``MqttSettings.reconnect_*``) for as long as it runs.
  ``wait_connected`` waits across attempts. Failures before the first
  connection are the owner's to report (logged here at INFO); once a
  connection was lost, the first failure of each streak is a WARNING;
- every ``subscribe`` is sent again on every connection (sessions are not
  kept: clean start), so an owner never re-subscribes by hand;
  ``subscribed`` is set while every filter is granted;
- ``on_connection(True/False)`` tells the owner when the connection comes
  and goes, on the session's own thread; an owner with requests in flight
  fails them there (they would wait for replies that will not come).
  ``connects`` and ``disconnects`` count those changes;
- ``on_message`` receives an ``InboundMessage`` on the session's thread; an
  exception it raises is logged, never raised into the client library (which
  would end its network thread);
- ``publish`` never blocks on the network: it queues and returns a
  ``PublishHandle``. A QoS 1 message published while disconnected is kept
  (``handle.offline``) and sent when the session connects again. On MQTT 5 a
  broker may refuse a QoS 1 message in its PUBACK (reason code >= 0x80, e.g.
  an ACL's "not authorized"): ``wait`` then returns False and
  ``handle.refusal`` says why, never passing for delivered. MQTT 5
  properties (correlation data, message expiry, response topic) are sent
  only on MQTT 5 connections.

This module is the interface alone (with the rules above that every
implementation shares, in ``MqttSession``'s own methods). Two implement it:
``PahoSession`` (``shared/_paho_session.py``: paho-mqtt, pure Python, light:
what devices use), which a device's agent, updater and telemetry share under
the device's id (``edge_agent.DeviceLink``) and the CDN's fleet link runs on
too; and the hub's C-backed ``CrtSession`` (``cloud_hub/mqtt/_crt_session.py``,
awscrt), chosen by measurement. They are the only places a paho or awscrt
client is created (tests/test_mqtt_clients.py keeps it so).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ._mqtt import MqttSettings

__all__ = [
    "ConnectFailure",
    "InboundMessage",
    "MqttRefusal",
    "MqttSession",
    "PublishHandle",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A message the session received. ``response_topic``/``correlation_data``: MQTT 5 only."""

    topic: str
    payload: bytes
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class MqttRefusal:
    """A broker's "no": an MQTT 5 reason code >= 0x80 and its name.

    MQTT 3.1.1 CONNACK codes are given their MQTT 5 equivalents (3.1.1's
    "not authorised", 5, is 0x87); a 3.1.1 PUBACK cannot refuse.
    """

    code: int
    reason: str  # e.g. "Not authorized"

    def __str__(self) -> str:
        return f"{self.reason} (reason code 0x{self.code:02x})"


@dataclass(frozen=True, slots=True)
class ConnectFailure:
    """Why the last connection attempt failed.

    ``refusal`` when the broker answered no (bad credentials, not
    authorized, a client id it will not take); None when it was not reached
    (``reason``: the socket's or TLS's error) or closed the connection
    without answering.
    """

    reason: str
    refusal: MqttRefusal | None = None

    @property
    def refused(self) -> bool:
        return self.refusal is not None

    def explain(self, url: str) -> str:
        """One line for an error message, naming the broker."""
        if self.refusal is not None:
            return f"the MQTT broker at {url} refused the connection: {self.refusal}"
        return f"cannot reach the MQTT broker at {url}: {self.reason}"


class PublishHandle(ABC):
    """A queued publish: ``wait`` for the broker's acknowledgement (QoS 1) or the send (QoS 0)."""

    __slots__ = ()  # one per message: the implementations' slots keep them small

    offline: bool = False  # published while disconnected (QoS 1: sent after the reconnect)

    @abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """True once the broker accepted it (QoS 1) or it was written (QoS 0).

        False when that did not happen within ``timeout_s``, the client
        refused it (``failed``) or the broker did (``refusal``).
        """

    @property
    @abstractmethod
    def failed(self) -> bool:
        """True when the client refused it (too large, a bad topic, QoS 0 while offline)."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True once the broker answered (accepted or refused), or the client refused it."""

    @property
    @abstractmethod
    def refusal(self) -> MqttRefusal | None:
        """The broker's refusal in its PUBACK (MQTT 5 only), once ``done``; else None."""

    @property
    def no_subscribers(self) -> bool:
        """True once the broker accepted it but said no subscription matched (MQTT 5
        PUBACK reason 0x10): nobody will read it. False until then, and under MQTT 3.1.1."""
        return False


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
        self.connects = 0  # connections made
        self.disconnects = 0  # connections lost (or closed by ``stop``)
        self.connect_failure: ConnectFailure | None = None  # the last failed attempt's
        self._connected = threading.Event()
        self._answered = threading.Event()  # the first attempt's outcome is known
        self._filters: dict[str, int] = {}
        self._filters_lock = threading.Lock()
        self._down_lock = threading.Lock()  # a stop and the client's thread may both see it go

    @property
    @abstractmethod
    def protocol(self) -> Literal["5", "3.1.1"]:
        """The MQTT version of the connection (known after ``start``)."""

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a connection, across failed attempts."""
        return self._connected.wait(timeout_s)

    @abstractmethod
    def start(self, *, wait_s: float | None = None) -> bool:
        """Connect in the background; with ``wait_s``, wait that long for the first outcome."""

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

    def _starting(self) -> None:
        """A new client is about to connect: its first attempt has no outcome yet."""
        self._answered.clear()
        self.connect_failure = None

    def _first_outcome(self, wait_s: float | None) -> bool:
        if wait_s is not None:
            self._answered.wait(wait_s)
        return self.connected

    def _deliver(self, message: InboundMessage) -> None:
        handler = self.on_message
        if handler is None:
            return
        try:
            handler(message)
        except Exception:  # the client library's thread must go on
            log.exception("MQTT message handler failed on %s", message.topic)

    def _connect_failed(self, failure: ConnectFailure) -> None:
        # The first connection's failure is its owner's to report (``start`` returns it);
        # after a connection was lost, the first failure of a streak is logged here.
        first_of_streak = self.connect_failure is None
        self.connect_failure = failure
        self._answered.set()
        if not first_of_streak:
            level = logging.DEBUG
        else:
            level = logging.WARNING if self.connects else logging.INFO
        log.log(level, "%s; retrying (%s)", failure.explain(self.settings.url), self.client_id)

    def _connection_changed(self, up: bool) -> None:
        if up:
            self.connect_failure = None
            self.connects += 1
            self._connected.set()
            self._answered.set()
            filters = self.filters
            if filters:
                self._send_subscribe(filters)
            else:
                self.subscribed.set()
        else:
            with self._down_lock:
                if not self._connected.is_set():
                    return  # not connected: a failed attempt, or already counted
                self._connected.clear()
                self.disconnects += 1
            self.subscribed.clear()
        handler = self.on_connection
        if handler is not None:
            try:
                handler(up)
            except Exception:
                log.exception("MQTT connection handler failed")
