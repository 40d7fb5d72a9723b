"""MQTT uplink: sends requests to the hub and matches replies by correlation id.

One paho-mqtt 2.x client per agent, run by paho's network thread
(``loop_start``), reconnecting by itself with backoff. ``send`` publishes at
QoS 1 on the model's request topic and returns a ``concurrent.futures.Future``
resolved by the reply that carries the same request id, on this device's
reply topic. Correlation lives in the envelope header (its id and
``reply_to``), so MQTT 3.1.1 brokers work; on MQTT 5 a request also carries a
message expiry (its deadline, in whole seconds), so a broker holding it for a
hub that is not there drops it once its answer is useless. That one property
is packed by hand: paho's ``Properties`` class costs tens of microseconds per
message on both ends, and the response topic and correlation data it would
carry are in the envelope already.

Failure is fast: ``send`` raises ``UplinkError`` at once when not connected,
and losing the connection fails every pending future, so the agent falls
back without waiting out its deadline. ``start(wait_s=…)`` waits for the
first connection attempt to end, not for ``wait_s`` when the broker refuses
or cannot be reached; ``connect_problem`` then says why. A reply that
arrives after its request gave up is counted and handed to ``on_late_reply``
(the agent hears from the hub through it), then dropped; ``on_connected``
runs after every (re)connect, on paho's network thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import (
    ErrorCode,
    Limits,
    Message,
    MqttSettings,
    ProtocolError,
    Topics,
    TransferOptions,
    create_client,
    decode_message,
    encode_message,
    publish_properties,
    resolve_protocol,
)

from ._errors import UplinkError

if TYPE_CHECKING:
    from paho.mqtt.properties import Properties

__all__ = ["MqttUplink", "UplinkStats"]

log = logging.getLogger("tandem.edge.uplink")


@dataclass
class UplinkStats:
    sent: int = 0
    replies: int = 0
    late_replies: int = 0
    bad_replies: int = 0
    connects: int = 0
    disconnects: int = 0


class MqttUplink:
    """The device's MQTT link to the hub."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        device_id: str,
        topics: Topics | None = None,
        transfer: TransferOptions | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.settings = settings
        self.device_id = device_id
        self.topics = topics or Topics()
        self.transfer = transfer or TransferOptions()
        self.limits = limits or Limits()
        self.reply_topic = self.topics.reply(device_id)
        self.stats = UplinkStats()
        self.protocol: str | None = None
        self._pending: dict[str, Future[Message]] = {}
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._attempted = threading.Event()  # the first connection attempt has ended
        self._client: Any = None
        self.connect_problem: str | None = None  # why the last attempt failed, if it did
        self.on_connected: Callable[[], None] | None = None
        self.on_late_reply: Callable[[Message], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, wait_s: float | None = None) -> MqttUplink:
        """Connect in the background; with ``wait_s``, wait up to that long for the first try.

        The wait ends at the first CONNACK, or as soon as the first attempt
        fails (refused, no route, bad credentials: ``connect_problem`` says
        which). An unreachable broker is not an error: the client keeps
        retrying with backoff and the agent answers locally meanwhile.
        """
        if self._client is not None:
            return self
        protocol = resolve_protocol(self.settings)
        self.protocol = protocol
        client = create_client(self.settings, f"tandem-edge-{self.device_id}", protocol=protocol)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        self._client = client
        self._attempted.clear()
        try:
            client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive_s)
        except (OSError, ValueError) as e:
            raise UplinkError(f"cannot connect to {self.settings.url}: {e}") from e
        client.loop_start()
        if wait_s and not self._attempted.wait(wait_s):
            self.connect_problem = f"no answer within {wait_s:g} s"
        return self

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        client.disconnect()
        client.loop_stop()
        self._connected.clear()
        self._fail_pending("uplink stopped")

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    # -- requests ----------------------------------------------------------------------------

    def send(
        self,
        *,
        model: str,
        tensors: dict[str, np.ndarray],
        timeout_ms: float,
        request_id: str,
        model_version: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[Future[Message], int]:
        """Publish one request; returns its reply future and the bytes sent.

        ``extra``: more header fields (the device's answer, ``shared.EdgeAnswer``).
        """
        client = self._client
        if client is None or not self._connected.is_set():
            raise UplinkError("not connected to the broker", ErrorCode.INTERNAL)
        message = Message(
            kind="request",
            request_id=request_id,
            model=model,
            model_version=model_version,
            reply_to=self.reply_topic,
            timeout_ms=max(0.0, timeout_ms),
            device_id=self.device_id,
            sent_at_ms=time.time() * 1000.0,
            extra=dict(extra) if extra else {},
        )
        message.tensors = tensors
        payload = encode_message(message, self.transfer)
        future: Future[Message] = Future()
        with self._lock:
            self._pending[request_id] = future
        try:
            info = client.publish(
                self.topics.infer(model),
                payload,
                qos=1,
                properties=self._properties(timeout_ms),
            )
        except (OSError, ValueError, RuntimeError) as e:
            self.forget(request_id)
            raise UplinkError(f"publish failed: {e}") from e
        if info.rc != 0:
            self.forget(request_id)
            raise UplinkError(f"publish failed (paho rc={info.rc})")
        self.stats.sent += 1
        return future, len(payload)

    def publish(self, topic: str, payload: bytes, *, qos: int = 0) -> None:
        """Publish a side message (telemetry, status); ``UplinkError`` when not connected."""
        client = self._client
        if client is None or not self._connected.is_set():
            raise UplinkError("not connected to the broker", ErrorCode.INTERNAL)
        try:
            info = client.publish(topic, payload, qos=qos)
        except (OSError, ValueError, RuntimeError) as e:
            raise UplinkError(f"publish failed: {e}") from e
        if info.rc != 0:
            raise UplinkError(f"publish failed (paho rc={info.rc})")

    def forget(self, request_id: str) -> None:
        """Stop waiting for a request's reply (it timed out or was answered)."""
        with self._lock:
            self._pending.pop(request_id, None)

    def _properties(self, timeout_ms: float) -> Properties | None:
        if self.protocol != "5":
            return None
        return publish_properties(expiry_interval_s=max(1, math.ceil(timeout_ms / 1000.0)))

    # -- paho callbacks (network thread: keep them short) -------------------------------------

    def _on_connect(
        self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            self.connect_problem = f"refused: {reason}"
            self._attempted.set()
            log.warning("broker %s refused the connection: %s", self.settings.url, reason)
            return
        client.subscribe(self.reply_topic, qos=1)
        self.stats.connects += 1
        self.connect_problem = None
        self._connected.set()
        self._attempted.set()
        listener = self.on_connected
        if listener is not None:
            try:
                listener()
            except Exception:  # a listener's bug must not take paho's thread down
                log.exception("on_connected failed")

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        self.connect_problem = "unreachable (connection failed)"
        self._attempted.set()

    def _on_disconnect(
        self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        if was:
            self.stats.disconnects += 1
            log.info("lost the broker %s (%s); retrying with backoff", self.settings.url, reason)
        self._fail_pending("broker connection lost")

    def _on_message(self, _client: Any, _userdata: Any, msg: Any) -> None:
        try:
            reply = decode_message(msg.payload, self.limits)
        except ProtocolError as e:
            self.stats.bad_replies += 1
            log.warning("dropped a malformed reply on %s: %s", msg.topic, e)
            return
        with self._lock:
            future = self._pending.pop(reply.request_id, None)
        if future is None:
            self.stats.late_replies += 1
            listener = self.on_late_reply
            if listener is not None:
                try:
                    listener(reply)
                except Exception:
                    log.exception("on_late_reply failed")
            return
        self.stats.replies += 1
        if not future.done():
            future.set_result(reply)

    def _fail_pending(self, why: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(UplinkError(why))
