"""Closed-loop MQTT load: N requesters spread over a few clients, each a device of its own.

Two clients, one behaviour (``_MqttLoad``):

* ``CrtMqttLoad``: awscrt's MQTT 5 client, the one the hub's ingress uses.
  Its event loop reads, parses and acknowledges packets in C without the
  GIL, so a request costs the bench's process less CPU than with paho
  (part c reports the load generator's cores next to every row); the
  default for part c's MQTT rows.
* ``PahoMqttLoad``: raw paho-mqtt clients (MQTT 5, TCP_NODELAY, no cap on
  QoS 1 in flight), as the earlier runs used, kept for one reference row.

Client ``k`` is the device ``{name}-{k}``: it publishes on that device's
own request topic (``{prefix}/dev/{device}/infer/{model}``) and subscribes
to its reply topic, as edge agents do. Every requester's request frame is
encoded once up front (the hub does not deduplicate request ids), a reply is
matched by its header's id, and the next request is published from the
client's own thread, in the reply's callback.

``run(model, inputs, n, warm_s, window_s)`` keeps n requests in flight for
``warm_s`` and then ``window_s`` seconds and returns a ``Window`` (answers
inside the window and their latencies; ``answered`` counts every successful
answer of the run). It then stops sending and waits for the requests still
in flight, so the next run starts clean.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ._load import Window, WindowClock

__all__ = ["CrtMqttLoad", "PahoMqttLoad"]

_SUBSCRIBE_S = 10.0


class _MqttLoad:
    """The closed loop over ``clients`` MQTT connections; subclasses connect and publish."""

    client_kind = ""

    def __init__(
        self,
        broker_url: str,
        *,
        clients: int = 4,
        timeout_ms: float = 30_000.0,
        prefix: str = "tandem/v1",
        name: str = "bench-load",
    ) -> None:
        from shared import MqttSettings, Topics

        self.settings = MqttSettings.from_url(broker_url)
        self.timeout_ms = timeout_ms
        self.topics = Topics(prefix)
        self.devices = [f"{name}-{k}" for k in range(clients)]
        self._frames: list[bytes] = []
        self._slot_topics: list[str] = []
        self._sent: list[float] = []
        self._clock: WindowClock | None = None
        self._window: Window | None = None
        self._answered = [0] * clients  # one counter per client: each is bumped by one thread
        self._errors = [0] * clients
        self._outstanding = 0
        self._lock = threading.Lock()
        self._connect()

    def _connect(self) -> None:
        raise NotImplementedError

    def _publish(self, k: int, topic: str, frame: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(
        self, model: str, inputs: dict[str, Any], n: int, warm_s: float, window_s: float
    ) -> Window:
        from shared import Message, encode_message

        k = len(self.devices)
        self._slot_topics = [self.topics.device_infer(self.devices[s % k], model) for s in range(n)]
        self._frames = [
            encode_message(
                Message(
                    kind="request",
                    request_id=_slot_id(slot, 0),
                    model=model,
                    timeout_ms=self.timeout_ms,
                    device_id=self.devices[slot % k],
                    tensors=inputs,
                )
            )
            for slot in range(n)
        ]
        self._id_at = [f.index(_slot_id(s, 0).encode()) for s, f in enumerate(self._frames)]
        self._resent = [0] * n
        self._sent = [0.0] * n
        self._answered = [0] * k
        self._errors = [0] * k
        window = Window(seconds=window_s)
        self._window = window
        self._clock = clock = WindowClock(warm_s, window_s)
        self._outstanding = n
        for slot in range(n):
            self._sent[slot] = time.perf_counter()
            self._publish(slot % k, self._slot_topics[slot], self._frames[slot])
        time.sleep(max(0.0, clock.end - time.perf_counter()))
        clock.running = False
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        while self._outstanding and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._outstanding:
            raise RuntimeError(f"{self._outstanding} MQTT requests never came back")
        window.answered = sum(self._answered)
        window.errors = sum(self._errors)
        return window

    def _on_reply(self, k: int, payload: bytes) -> None:
        """One reply on client ``k``'s thread: record it, then send that requester's next."""
        from shared import decode_header

        now = time.perf_counter()
        header = decode_header(payload)
        slot = int(header["id"].split(".", 1)[0])
        clock, window = self._clock, self._window
        if clock is None or window is None:
            return  # a late reply after a run that timed out
        failed = "error" in header
        if not failed:
            self._answered[k] += 1
        if clock.inside(now):
            if failed:
                self._errors[k] += 1
            else:
                window.latencies_ms.append((now - self._sent[slot]) * 1000.0)
        if clock.running:
            self._sent[slot] = time.perf_counter()
            self._publish(k, self._slot_topics[slot], self._fresh(slot))
        else:
            with self._lock:
                self._outstanding -= 1

    def _fresh(self, slot: int) -> bytes:
        """The slot's frame with a new request id: a hub computes a (device, id) once."""
        self._resent[slot] += 1
        frame, at = self._frames[slot], self._id_at[slot]
        fresh = _slot_id(slot, self._resent[slot]).encode()
        return frame[:at] + fresh + frame[at + len(fresh) :]


def _slot_id(slot: int, sent: int) -> str:
    """A request id of fixed width: its slot, then how many times the slot was sent before."""
    return f"{slot:08d}.{sent:012d}"


class PahoMqttLoad(_MqttLoad):
    """Raw paho clients, one network thread each."""

    client_kind = "paho-mqtt"

    def _connect(self) -> None:
        from shared import create_client

        self._clients: list[Any] = []
        subscribed = threading.Semaphore(0)
        for k, device in enumerate(self.devices):
            client = create_client(self.settings, device, protocol="5")
            client.max_inflight_messages_set(0)  # paho's default caps QoS 1 in flight at 20
            client.max_queued_messages_set(0)
            topic = self.topics.reply(device)
            client.on_connect = lambda c, _u, _f, _r, _p, t=topic: c.subscribe(t, qos=1)
            client.on_subscribe = lambda *_a: subscribed.release()
            client.on_message = lambda _c, _u, m, k=k: self._on_reply(k, m.payload)
            client.connect(self.settings.host, self.settings.port)
            client.loop_start()
            self._clients.append(client)
        for _ in self.devices:
            if not subscribed.acquire(timeout=_SUBSCRIBE_S):
                self.close()
                raise RuntimeError("the load generator's paho clients could not subscribe")

    def _publish(self, k: int, topic: str, frame: bytes) -> None:
        self._clients[k].publish(topic, frame, qos=1)

    def close(self) -> None:
        for client in self._clients:
            client.disconnect()
            client.loop_stop()
        self._clients.clear()


class CrtMqttLoad(_MqttLoad):
    """awscrt MQTT 5 clients; callbacks come on awscrt's event-loop threads."""

    client_kind = "awscrt MQTT 5"

    def _connect(self) -> None:
        from awscrt import mqtt5

        self._mqtt5 = mqtt5
        self._qos1 = mqtt5.QoS.AT_LEAST_ONCE
        self._clients = []
        self._stopped: list[threading.Event] = []
        for k, device in enumerate(self.devices):
            connected, stopped = threading.Event(), threading.Event()
            client = mqtt5.Client(
                mqtt5.ClientOptions(
                    host_name=self.settings.host,
                    port=self.settings.port,
                    connect_options=mqtt5.ConnectPacket(
                        client_id=device, keep_alive_interval_sec=60
                    ),
                    session_behavior=mqtt5.ClientSessionBehaviorType.CLEAN,
                    on_publish_callback_fn=lambda d, k=k: self._on_reply(
                        k, d.publish_packet.payload
                    ),
                    on_lifecycle_event_connection_success_fn=lambda _d, e=connected: e.set(),
                    on_lifecycle_event_stopped_fn=lambda _d, e=stopped: e.set(),
                    disable_metrics=True,
                )
            )
            client.start()
            self._clients.append(client)
            self._stopped.append(stopped)
            if not connected.wait(_SUBSCRIBE_S):
                self.close()
                raise RuntimeError(f"the load generator could not connect to {self.settings.url}")
            packet = mqtt5.SubscribePacket(
                subscriptions=[
                    mqtt5.Subscription(topic_filter=self.topics.reply(device), qos=self._qos1)
                ]
            )
            client.subscribe(packet).result(_SUBSCRIBE_S)

    def _publish(self, k: int, topic: str, frame: bytes) -> None:
        self._clients[k].publish(
            self._mqtt5.PublishPacket(topic=topic, payload=frame, qos=self._qos1)
        )

    def close(self) -> None:
        for client in self._clients:
            client.stop()
        for stopped in self._stopped:
            stopped.wait(5.0)
        self._clients.clear()
