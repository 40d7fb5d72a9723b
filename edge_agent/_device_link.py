"""A device's one MQTT connection, shared by its agent, updater and telemetry: ``DeviceLink``.

A device holds one MQTT session (``shared.PahoSession``) whose client id is
its device id (``shared.device_client_id``), the id that the broker's
configuration (``tandem fleet provision --dynsec-file``) binds to the
device's credentials. Everything the device says or hears goes over it:

- the agent's uplink (``MqttUplink``) hears its replies on
  ``…/dev/{device}/reply`` and publishes requests on the device's own
  ``…/dev/{device}/infer/{model}``, and ``TelemetryReporter`` publishes
  through the uplink;
- a ``ModelUpdater`` in the same process hears the retained assignment on
  ``…/dev/{device}/assign`` and publishes its status reports (it takes the
  agent's link: ``agent.link``). An updater alone opens a link of its own,
  under the same client id.

``listen(topic, handler)`` hands the messages of one exact topic to one
handler (the session subscribes again on every connection); ``watch``
adds a callback for the connection coming and going. Both run on the
session's network thread, and an exception they raise is logged there.

``open`` and ``close`` count the owners: the first ``open`` connects (in the
background, retrying with backoff), the last ``close`` disconnects, so an
agent and an updater may stop in either order and the other keeps the
connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Literal

from shared import (
    ConnectFailure,
    InboundMessage,
    MqttSettings,
    PahoSession,
    PublishHandle,
    device_client_id,
)

__all__ = ["DeviceLink"]

log = logging.getLogger("tandem.edge.link")

_CLOSE_S = 2.0  # the last close waits this long for the broker to acknowledge QoS 1 messages


class DeviceLink:
    """One device's MQTT connection (see the module docstring)."""

    def __init__(self, settings: MqttSettings, device_id: str) -> None:
        self.settings = settings
        self.device_id = device_id
        self.session = PahoSession(
            settings,
            device_client_id(device_id),
            on_message=self._on_message,
            on_connection=self._on_connection,
        )
        self._handlers: dict[str, Callable[[InboundMessage], None]] = {}
        self._watchers: list[Callable[[bool], None]] = []
        self._lock = threading.Lock()
        self._owners = 0

    # -- owners ------------------------------------------------------------------------------

    def open(self, *, wait_s: float | None = None) -> bool:
        """Connect if no owner has yet; with ``wait_s``, wait for the first attempt's outcome.

        Returns whether it is connected (``connect_failure`` says why not).
        """
        with self._lock:
            self._owners += 1
        return self.session.start(wait_s=wait_s)

    def close(self) -> None:
        """One owner is done; the last one disconnects."""
        with self._lock:
            self._owners = max(0, self._owners - 1)
            last = self._owners == 0
        if last:
            self.session.stop(timeout_s=_CLOSE_S)

    def serves(self, settings: MqttSettings) -> bool:
        """Whether ``settings`` name this link's broker (then share this link, never open
        another connection under the device's client id: the broker would drop one)."""
        return (settings.host, settings.port) == (self.settings.host, self.settings.port)

    # -- the connection ----------------------------------------------------------------------

    @property
    def client_id(self) -> str:
        return self.session.client_id

    @property
    def connected(self) -> bool:
        return self.session.connected

    def wait_connected(self, timeout_s: float) -> bool:
        return self.session.wait_connected(timeout_s)

    @property
    def connect_failure(self) -> ConnectFailure | None:
        return self.session.connect_failure

    @property
    def protocol(self) -> Literal["5", "3.1.1"] | None:
        """The MQTT version spoken, once started (None before)."""
        return self.session.protocol if self._owners else None

    @property
    def connects(self) -> int:
        return self.session.connects

    @property
    def disconnects(self) -> int:
        return self.session.disconnects

    # -- messages ----------------------------------------------------------------------------

    def listen(
        self, topic: str, handler: Callable[[InboundMessage], None], *, qos: int = 1
    ) -> None:
        """Hand every message on ``topic`` (exact, no wildcards) to ``handler``."""
        with self._lock:
            self._handlers[topic] = handler
        self.session.subscribe(topic, qos)

    def unlisten(self, topic: str) -> None:
        with self._lock:
            self._handlers.pop(topic, None)
        self.session.unsubscribe(topic)

    def watch(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(True/False)`` when the connection comes and goes."""
        with self._lock:
            self._watchers = [*self._watchers, callback]

    def unwatch(self, callback: Callable[[bool], None]) -> None:
        with self._lock:
            self._watchers = [w for w in self._watchers if w != callback]

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, expiry_s: int | None = None
    ) -> PublishHandle:
        """Queue one message (``PublishHandle``; ``RuntimeError`` before any ``open``)."""
        return self.session.publish(topic, payload, qos=qos, expiry_s=expiry_s)

    # -- the session's thread ----------------------------------------------------------------

    def _on_message(self, message: InboundMessage) -> None:
        handler = self._handlers.get(message.topic)
        if handler is None:
            log.debug("no listener for a message on %s", message.topic)
            return
        handler(message)  # the session logs what it raises

    def _on_connection(self, up: bool) -> None:
        for watcher in self._watchers:
            try:
                watcher(up)
            except Exception:  # one owner's bug must not keep the others from hearing it
                log.exception("a connection watcher failed")
