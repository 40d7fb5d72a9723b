"""``shared.MqttSession`` on awscrt's MQTT 5 client: the hub's ingress, measured cheaper.

Why the hub uses it (bench part c, same broker and frame): a bare consumer
that receives a request and publishes a reply, both QoS 1, costs about half
the CPU per message with awscrt's C client (its event loop reads, parses and
acknowledges packets in C, without the GIL) than with paho-mqtt, which does
all of that in Python. Devices keep paho (light, pure Python); awscrt is a
hub-only dependency.

awscrt's client speaks MQTT 5 only: ``open_session`` falls back to
``PahoSession`` for an MQTT 3.1.1 broker (the demo's embedded amqtt), and
when awscrt is not installed.

Callbacks arrive on awscrt's event-loop thread, one connection per thread,
so a session's messages are delivered one at a time, in order. The client
reconnects by itself (exponential backoff with jitter between the
settings' delays) and sessions start clean, so ``_connection_changed``
subscribes again on every connection.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from concurrent.futures import Future
from typing import Any, Literal

from shared import (
    ConnectFailure,
    InboundMessage,
    MqttRefusal,
    MqttSession,
    MqttSettings,
    PahoSession,
    PublishHandle,
    resolve_protocol,
)

__all__ = ["CrtSession", "crt_available", "open_session"]

log = logging.getLogger(__name__)


def crt_available() -> bool:
    try:
        import awscrt.mqtt5  # noqa: F401
    except ImportError:
        return False
    return True


def open_session(
    settings: MqttSettings,
    client_id: str,
    *,
    client: Literal["auto", "crt", "paho"] = "auto",
    **handlers: Any,
) -> MqttSession:
    """The hub's MQTT session: awscrt's when it can serve this broker, else paho's."""
    protocol = resolve_protocol(settings)
    # awscrt cannot skip only the hostname check, which TlsSettings.insecure means.
    insecure = settings.tls is not None and settings.tls.insecure
    if client == "paho" or protocol != "5" or insecure or not crt_available():
        if client == "crt":
            why = (
                "the broker speaks MQTT 3.1.1"
                if protocol != "5"
                else "TLS without hostname checks"
                if insecure
                else "awscrt is missing"
            )
            log.warning("awscrt's MQTT client cannot be used (%s); using paho", why)
        return PahoSession(settings, client_id, protocol=protocol, **handlers)
    return CrtSession(settings, client_id, **handlers)


class _CrtHandle(PublishHandle):
    __slots__ = ("_future", "offline")

    def __init__(self, future: Future[Any] | None, *, offline: bool = False) -> None:
        self._future = future
        self.offline = offline

    def wait(self, timeout_s: float) -> bool:
        if self._future is None:
            return False
        try:
            self._future.result(timeout_s)
        except Exception:  # timeout, or the publish failed (offline, too large)
            return False
        return self.refusal is None

    @property
    def failed(self) -> bool:
        future = self._future
        return future is None or (future.done() and future.exception() is not None)

    @property
    def done(self) -> bool:
        return self._future is None or self._future.done()

    @property
    def refusal(self) -> MqttRefusal | None:
        future = self._future
        if future is None or not future.done() or future.exception() is not None:
            return None
        puback = getattr(future.result(), "puback", None)  # None for QoS 0
        code = None if puback is None else puback.reason_code
        return None if code is None or int(code) < 0x80 else _refusal(code)


class CrtSession(MqttSession):
    """``MqttSession`` on ``awscrt.mqtt5.Client`` (MQTT 5 brokers only)."""

    def __init__(self, settings: MqttSettings, client_id: str, **handlers: Any) -> None:
        super().__init__(settings, client_id, **handlers)
        from awscrt import mqtt5

        self._mqtt5 = mqtt5
        self._qos = {0: mqtt5.QoS.AT_MOST_ONCE, 1: mqtt5.QoS.AT_LEAST_ONCE}
        self._client: Any = None
        self._unacked: list[Future[Any]] = []
        self._unacked_lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def protocol(self) -> Literal["5", "3.1.1"]:
        return "5"

    def start(self, *, wait_s: float | None = None) -> bool:
        if self._client is None:
            self._starting()
            self._stopped.clear()
            self._client = self._build()
            self._client.start()
        return self._first_outcome(wait_s)

    def _build(self) -> Any:
        mqtt5, s = self._mqtt5, self.settings
        from awscrt import io

        connect = mqtt5.ConnectPacket(
            client_id=self.client_id,
            keep_alive_interval_sec=s.keepalive_s,
            username=s.username,
            password=None if s.password is None else s.password.encode(),
            maximum_packet_size=s.max_packet_bytes,  # the broker drops larger ones for us
        )
        socket_options = io.SocketOptions()
        socket_options.connect_timeout_ms = int(s.connect_timeout_s * 1000)
        return mqtt5.Client(
            mqtt5.ClientOptions(
                host_name=s.host,
                port=s.port,
                socket_options=socket_options,
                tls_ctx=_tls_context(s),
                connect_options=connect,
                session_behavior=mqtt5.ClientSessionBehaviorType.CLEAN,
                min_reconnect_delay_ms=int(s.reconnect_min_delay_s * 1000),
                max_reconnect_delay_ms=int(s.reconnect_max_delay_s * 1000),
                on_publish_callback_fn=self._on_publish,
                on_lifecycle_event_connection_success_fn=self._on_success,
                on_lifecycle_event_connection_failure_fn=self._on_failure,
                on_lifecycle_event_disconnection_fn=self._on_disconnection,
                on_lifecycle_event_stopped_fn=lambda _d: self._stopped.set(),
                disable_metrics=True,
            )
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        with self._unacked_lock:
            pending, self._unacked = self._unacked, []
        for future in pending:
            if not self.connected:
                break
            try:
                future.result(timeout_s)
            except Exception:
                break
        client.stop()
        self._stopped.wait(timeout_s)
        self._connection_changed(False)

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
        packet = self._mqtt5.PublishPacket(
            topic=topic,
            payload=payload,
            qos=self._qos[qos],
            retain=retain,
            correlation_data_bytes=correlation_data,
            message_expiry_interval_sec=expiry_s,
            response_topic=response_topic,
        )
        offline = not self.connected  # awscrt keeps QoS 1 for the next connection
        try:
            future = client.publish(packet)
        except Exception as e:  # invalid packet (e.g. a bad topic): refused at once
            log.warning("publish to %s refused: %s", topic, e)
            return _CrtHandle(None)
        if qos:
            with self._unacked_lock:
                self._unacked.append(future)
                if len(self._unacked) > 4096:
                    self._unacked = [f for f in self._unacked if not f.done()]
        return _CrtHandle(future, offline=offline and bool(qos))

    def _send_subscribe(self, filters: dict[str, int]) -> None:
        client = self._client
        if client is None:
            return
        mqtt5 = self._mqtt5
        packet = mqtt5.SubscribePacket(
            subscriptions=[
                mqtt5.Subscription(topic_filter=f, qos=self._qos[q]) for f, q in filters.items()
            ]
        )
        client.subscribe(packet).add_done_callback(lambda f: self._on_suback(f, list(filters)))

    def _on_suback(self, future: Future[Any], filters: list[str]) -> None:
        try:
            suback = future.result()
        except Exception as e:
            log.error("subscription to %s failed: %s", filters, e)
            return
        refused = [
            (f, code)
            for f, code in zip(filters, suback.reason_codes, strict=False)
            if int(code) >= 0x80
        ]
        if refused:
            log.error("broker refused the subscription %s: %s", refused[0][0], refused[0][1])
            return
        if self.connected:
            self.subscribed.set()

    def _send_unsubscribe(self, topic_filter: str) -> None:
        client = self._client
        if client is not None:
            client.unsubscribe(self._mqtt5.UnsubscribePacket(topic_filters=[topic_filter]))

    # -- awscrt's callbacks (its event-loop thread) ------------------------------------------

    def _on_publish(self, data: Any) -> None:
        packet = data.publish_packet
        self._deliver(
            InboundMessage(
                packet.topic,
                packet.payload,
                bool(packet.retain),
                packet.response_topic,
                packet.correlation_data_bytes,
            )
        )

    def _on_success(self, _data: Any) -> None:
        if self.settings.tcp_nodelay:
            _nodelay_to(self.settings.host, self.settings.port)
        log.info("connected to %s (awscrt MQTT 5)", self.settings.url)
        self._connection_changed(True)

    def _on_failure(self, data: Any) -> None:
        connack = data.connack_packet
        code = None if connack is None else connack.reason_code
        if code is not None and int(code) >= 0x80:
            refusal = _refusal(code)
            self._connect_failed(ConnectFailure(str(refusal), refusal))
            return
        self._connect_failed(ConnectFailure(str(data.exception or "connection failed")))

    def _on_disconnection(self, data: Any) -> None:
        if self._client is not None and self.connected:
            log.warning("lost the broker %s (%s); reconnecting", self.settings.url, data.exception)
        self._connection_changed(False)


def _refusal(code: Any) -> MqttRefusal:
    """An awscrt reason code enum (``NOT_AUTHORIZED``) as paho names it ("Not authorized")."""
    return MqttRefusal(int(code), code.name.replace("_", " ").capitalize())


def _nodelay_to(host: str, port: int) -> int:
    """Turn Nagle off on this process's TCP connections to ``host:port``; returns how many.

    awscrt's sockets leave Nagle on and its options cannot change that. A reply
    published from another thread goes out alone, right after the request's
    PUBACK: Nagle then holds it until the broker acknowledges that PUBACK, which
    a delayed ACK does 40 ms later, so every quiet request took 40 ms. Socket
    options belong to the socket, so setting one through a duplicate of its
    descriptor (found in /proc/self/fd) reaches awscrt's.
    """
    try:
        peers = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:
        return 0
    changed = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not target.startswith("socket:"):
            continue
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                dup = socket.fromfd(int(name), family, socket.SOCK_STREAM)
            except OSError:
                continue
            with dup:
                try:
                    peer = dup.getpeername()
                except OSError:
                    continue
                if not isinstance(peer, tuple):  # a Unix socket: no host and port
                    break
                if peer[0] in peers and peer[1] == port:
                    dup.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    changed += 1
            break
    return changed


def _tls_context(settings: MqttSettings) -> Any:
    tls = settings.tls
    if tls is None:
        return None
    from awscrt import io

    if tls.certfile is not None and tls.keyfile is not None:
        options = io.TlsContextOptions.create_client_with_mtls_from_path(tls.certfile, tls.keyfile)
    else:
        options = io.TlsContextOptions()
    if tls.ca_certs is not None:
        options.override_default_trust_store_from_path(None, tls.ca_certs)
    return io.ClientTlsContext(options)
