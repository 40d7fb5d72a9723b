"""bench/_delay_relay.py: bytes cross in order and intact, and no chunk leaves before it is due.

No timing assertions: the relay's own record (when each chunk was read, when
it was due, when it was written) is checked against the relay's contract; the
round trips it adds are measured in bench part i.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
from collections.abc import Iterator

import pytest

from bench._delay_relay import Chunk, DelayRelay

from ._brokers import MosquittoProcess

ONE_WAY_S = 0.01


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A TCP server on loopback that writes back whatever it reads, until its client ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    listener.close()
    thread.join(10)


def _check_record(chunks: list[Chunk], one_way_s: float) -> None:
    """Each chunk held one way's delay, written in the order read, none before its due time."""
    assert chunks
    for chunk in chunks:
        assert chunk.due >= chunk.received + one_way_s
        assert chunk.released >= chunk.due
    for connection in {c.connection for c in chunks}:
        for direction in ("up", "down"):
            mine = [c for c in chunks if (c.connection, c.direction) == (connection, direction)]
            assert [c.received for c in mine] == sorted(c.received for c in mine)
            assert [c.due for c in mine] == sorted(c.due for c in mine)


def test_bytes_cross_both_ways_in_order_intact_and_held(echo_server: int) -> None:
    payload = os.urandom(300_000)
    with DelayRelay("127.0.0.1", echo_server, ONE_WAY_S) as relay:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as client:
            got = bytearray()
            reader = threading.Thread(
                target=lambda: got.extend(_read_all(client, len(payload))), daemon=True
            )
            reader.start()
            for start in range(0, len(payload), 7_001):  # many small writes: many chunks
                client.sendall(payload[start : start + 7_001])
            reader.join(30)
            assert bytes(got) == payload
            client.shutdown(socket.SHUT_WR)
            assert client.recv(1) == b""  # the end of stream crossed the relay after the data
        chunks = relay.chunks()
    _check_record(chunks, ONE_WAY_S)
    for direction in ("up", "down"):
        assert sum(c.size for c in chunks if c.direction == direction) == len(payload)


def _read_all(sock: socket.socket, n: int) -> bytes:
    parts, seen = [], 0
    while seen < n and (data := sock.recv(65536)):
        parts.append(data)
        seen += len(data)
    return b"".join(parts)


def test_mqtt_through_the_relay_keeps_every_message_in_order(
    mosquitto: MosquittoProcess,
) -> None:
    import paho.mqtt.client as mqtt

    n = 40
    got: queue.Queue[bytes] = queue.Queue()
    with DelayRelay("127.0.0.1", mosquitto.port, ONE_WAY_S) as relay:
        client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             client_id="relay-test", protocol=mqtt.MQTTv5)  # fmt: skip
        subscribed = threading.Event()
        client.on_connect = lambda c, *_: c.subscribe("relay/test", qos=1)
        client.on_subscribe = lambda *_: subscribed.set()
        client.on_message = lambda _c, _u, m: got.put(m.payload)
        client.connect("127.0.0.1", relay.port)
        client.loop_start()
        try:
            assert subscribed.wait(30)
            sent = [f"{i}:".encode() + os.urandom(200) for i in range(n)]
            for body in sent:
                client.publish("relay/test", body, qos=1)
            received = [got.get(timeout=30) for _ in range(n)]
        finally:
            client.disconnect()
            client.loop_stop()
        chunks = relay.chunks()
    assert received == sent
    assert {c.direction for c in chunks} == {"up", "down"}
    _check_record(chunks, ONE_WAY_S)


def test_a_target_that_is_down_ends_the_client_s_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = int(placeholder.getsockname()[1])
    with DelayRelay("127.0.0.1", port, ONE_WAY_S) as relay:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as client:
            client.settimeout(30)
            # closed before the accept finished reads as a reset: either way no hang
            with contextlib.suppress(ConnectionResetError):
                assert client.recv(1) == b""
        assert relay.chunks() == []


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="one_way_s"):
        DelayRelay("127.0.0.1", 1, -0.001)
