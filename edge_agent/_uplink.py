"""MQTT uplink: sends requests to the hub and matches replies by correlation id.

The uplink runs on the device's one MQTT connection, a ``DeviceLink``
(``_device_link``: a ``shared.PahoSession`` whose client id is the device
id), which it creates unless given one; the device's updater and telemetry
share it. ``send`` publishes at QoS 1 on the device's own request topic
(``…/dev/{device}/infer/{model}``: the broker lets only this device write
there, and the hub answers on this device's reply topic, whatever the
request says) and returns a ``concurrent.futures.Future`` resolved by the
reply that carries the same request id. Correlation lives in the envelope
header (its id and ``reply_to``), so MQTT 3.1.1 brokers work; on MQTT 5 a
request also carries a message expiry (its deadline, in whole seconds), so
a broker holding it for a hub that is not there drops it once its answer is
useless. That one property is packed by hand (``shared.publish_properties``):
paho's ``Properties`` class costs tens of microseconds per message on both
ends, and the response topic and correlation data it would carry are in the
envelope already.

Failure is fast: ``send`` raises ``UplinkError`` at once when not connected,
and losing the connection fails every pending future, so the agent falls
back without waiting out its deadline. ``start(wait_s=…)`` waits for the
first connection attempt to end, not for ``wait_s`` when the broker refuses
or cannot be reached; ``connect_problem`` then says why. A reply that
arrives after its request gave up is counted and handed to ``on_late_reply``
(the agent hears from the hub through it), then dropped; ``on_connected``
runs after every (re)connect, on the session's network thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import (
    ErrorCode,
    InboundMessage,
    Limits,
    Message,
    MqttSettings,
    ProtocolError,
    Topics,
    TransferOptions,
    decode_message,
    encode_message,
)

from ._device_link import DeviceLink
from ._errors import UplinkError

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
    """The device's MQTT link to the hub, on its ``DeviceLink``."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        device_id: str,
        topics: Topics | None = None,
        transfer: TransferOptions | None = None,
        limits: Limits | None = None,
        link: DeviceLink | None = None,
    ) -> None:
        self.settings = settings
        self.device_id = device_id
        self.topics = topics or Topics()
        self.transfer = transfer or TransferOptions()
        self.limits = limits or Limits()
        self.reply_topic = self.topics.reply(device_id)
        self.link = link or DeviceLink(settings, device_id)
        self.stats = UplinkStats()
        self._pending: dict[str, Future[Message]] = {}
        self._lock = threading.Lock()
        self._open = False
        self._waited_out: float | None = None  # start's wait, when it ended with no outcome
        self.on_connected: Callable[[], None] | None = None
        self.on_late_reply: Callable[[Message], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, wait_s: float | None = None) -> MqttUplink:
        """Connect in the background; with ``wait_s``, wait up to that long for the first try.

        The wait ends at the first CONNACK, or as soon as the first attempt
        fails (refused, no route, bad credentials: ``connect_problem`` says
        which). An unreachable broker is not an error: the session keeps
        retrying with backoff and the agent answers locally meanwhile.
        """
        if self._open:
            return self
        self._open = True
        self.link.watch(self._on_connection)
        self.link.listen(self.reply_topic, self._on_reply)
        connected = self.link.open(wait_s=wait_s or None)
        no_outcome = wait_s and not connected and self.link.connect_failure is None
        self._waited_out = wait_s if no_outcome else None
        return self

    def stop(self) -> None:
        if not self._open:
            return
        self._open = False
        self.link.unlisten(self.reply_topic)
        self.link.unwatch(self._on_connection)
        self.link.close()
        self._fail_pending("uplink stopped")

    @property
    def connected(self) -> bool:
        return self._open and self.link.connected

    def wait_connected(self, timeout_s: float) -> bool:
        return self.link.wait_connected(timeout_s)

    @property
    def protocol(self) -> str | None:
        """The MQTT version the connection speaks ("5" or "3.1.1"), once started."""
        return self.link.protocol

    @property
    def connect_problem(self) -> str | None:
        """Why the last connection attempt failed, in a few words (None: it did not)."""
        failure = self.link.connect_failure
        if failure is not None:
            if failure.refusal is not None:
                return f"refused the connection: {failure.refusal}"
            return f"is unreachable ({failure.reason})"
        if self._waited_out is not None and not self.link.connected:
            return f"gave no answer within {self._waited_out:g} s"
        return None

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
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> tuple[Future[Message], int]:
        """Publish one request; returns its reply future and the bytes sent.

        ``extra``: more header fields (the device's answer, ``shared.EdgeAnswer``);
        ``traceparent``/``tracestate``: the W3C trace context of the sending span.
        """
        if not self.connected:
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
            traceparent=traceparent,
            tracestate=tracestate,
        )
        message.tensors = tensors
        payload = encode_message(message, self.transfer)
        future: Future[Message] = Future()
        with self._lock:
            self._pending[request_id] = future
        try:
            handle = self.link.publish(
                self.topics.device_infer(self.device_id, model),
                payload,
                qos=1,
                expiry_s=max(1, math.ceil(timeout_ms / 1000.0)),
            )
        except (OSError, ValueError, RuntimeError) as e:
            self.forget(request_id)
            raise UplinkError(f"publish failed: {e}") from e
        if handle.failed or handle.offline:  # offline: the connection went since the check
            self.forget(request_id)
            raise UplinkError("publish failed: not connected to the broker")
        self.stats.sent += 1
        return future, len(payload)

    def publish(self, topic: str, payload: bytes, *, qos: int = 0) -> None:
        """Publish a side message (telemetry, status); ``UplinkError`` when not connected."""
        if not self.connected:
            raise UplinkError("not connected to the broker", ErrorCode.INTERNAL)
        try:
            handle = self.link.publish(topic, payload, qos=qos)
        except (OSError, ValueError, RuntimeError) as e:
            raise UplinkError(f"publish failed: {e}") from e
        if handle.failed:
            raise UplinkError("publish failed: not connected to the broker")

    def forget(self, request_id: str) -> None:
        """Stop waiting for a request's reply (it timed out or was answered)."""
        with self._lock:
            self._pending.pop(request_id, None)

    # -- the session's network thread: keep these short ----------------------------------------

    def _on_connection(self, up: bool) -> None:
        if not up:
            self.stats.disconnects += 1  # the session logs it
            self._fail_pending("broker connection lost")
            return
        self.stats.connects += 1
        listener = self.on_connected
        if listener is not None:
            try:
                listener()
            except Exception:  # a listener's bug must not take the network thread down
                log.exception("on_connected failed")

    def _on_reply(self, msg: InboundMessage) -> None:
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
