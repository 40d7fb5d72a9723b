"""Closed-loop load generators: N requesters, each sending its next request when answered.

Both are built to cost the machine as little per request as Python allows,
because they share the cores with the server they measure:

* ``MqttLoad``: a few raw paho-mqtt clients (MQTT 5, TCP_NODELAY, no cap on
  QoS 1 in flight) share the N requesters. Every requester's request frame
  is encoded once up front (the hub does not deduplicate request ids), and
  a reply is matched by reading only its JSON header; the next request is
  published from paho's network thread, in the reply's callback.
* ``HttpLoad``: N keep-alive connections on one asyncio loop, speaking just
  enough HTTP/1.1 (a prepared request, then the head and a
  ``Content-Length`` body back); no client library's per-request work.
* ``InProcessLoad``: N asyncio tasks awaiting the futures of an in-process
  ``submit`` (a ``DynamicBatcher``'s), with no transport at all.

``binary_infer_request`` builds the body and headers of a hub ``/infer``
request with binary tensors (Triton's binary tensor data extension).

``run(n, warm_s, window_s)`` keeps n requests in flight for ``warm_s`` and
then ``window_s`` seconds, and returns a ``Window``: the answers that
arrived inside the window and their latencies. It then stops sending and
waits for the requests still in flight, so the next run starts clean.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["HttpLoad", "InProcessLoad", "MqttLoad", "Window", "binary_infer_request"]


def binary_infer_request(input_name: str, x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a hub ``/infer`` request with binary tensors both ways.

    Triton's binary tensor data extension: a JSON header, then the raw bytes
    of ``x`` as FP32; ``binary_data_output`` asks for the reply the same way.
    """
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + x.tobytes(), headers


@dataclass
class Window:
    """Answers that arrived in the measuring window: count, latencies (ms), errors."""

    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def throughput(self) -> float:
        return len(self.latencies_ms) / self.seconds


class _Clock:
    """The window's bounds, shared by the threads that record answers."""

    def __init__(self, warm_s: float, window_s: float) -> None:
        now = time.perf_counter()
        self.start = now + warm_s
        self.end = self.start + window_s
        self.running = True

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end


class MqttLoad:
    """N requesters over a few paho clients, against one model's request topic."""

    def __init__(self, broker_url: str, *, clients: int = 4, timeout_ms: float = 30_000.0) -> None:
        from shared import MqttSettings, create_client

        self.settings = MqttSettings.from_url(broker_url)
        self.timeout_ms = timeout_ms
        self._clients: list[Any] = []
        self._topics: list[str] = []
        subscribed = threading.Semaphore(0)
        for k in range(clients):
            client = create_client(self.settings, f"bench-load-{k}", protocol="5")
            client.max_inflight_messages_set(0)  # paho's default caps QoS 1 in flight at 20
            client.max_queued_messages_set(0)
            topic = f"bench/load/{k}/reply"
            client.user_data_set(k)
            client.on_connect = lambda c, _u, _f, _r, _p, t=topic: c.subscribe(t, qos=1)
            client.on_subscribe = lambda *_a: subscribed.release()
            client.on_message = self._on_message
            client.connect(self.settings.host, self.settings.port)
            client.loop_start()
            self._clients.append(client)
            self._topics.append(topic)
        for _ in range(clients):
            if not subscribed.acquire(timeout=10.0):
                self.close()
                raise RuntimeError("the load generator's clients could not subscribe")
        self._frames: list[bytes] = []
        self._sent: list[float] = []
        self._topic = ""
        self._clock: _Clock | None = None
        self._window: Window | None = None
        self._outstanding = 0
        self._lock = threading.Lock()

    def run(
        self,
        model: str,
        inputs: dict[str, Any],
        n: int,
        warm_s: float,
        window_s: float,
    ) -> Window:
        from shared import Message, Topics, encode_message

        k = len(self._clients)
        self._topic = Topics().infer(model)
        self._frames = [
            encode_message(
                Message(
                    kind="request",
                    request_id=str(slot),
                    model=model,
                    reply_to=self._topics[slot % k],
                    timeout_ms=self.timeout_ms,
                    device_id=f"bench-load-{slot}",
                    tensors=inputs,
                )
            )
            for slot in range(n)
        ]
        self._sent = [0.0] * n
        window = Window(seconds=window_s)
        self._window = window
        self._clock = clock = _Clock(warm_s, window_s)
        self._outstanding = n
        for slot in range(n):
            self._sent[slot] = time.perf_counter()
            self._clients[slot % k].publish(self._topic, self._frames[slot], qos=1)
        time.sleep(max(0.0, clock.end - time.perf_counter()))
        clock.running = False
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        while self._outstanding and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._outstanding:
            raise RuntimeError(f"{self._outstanding} MQTT requests never came back")
        return window

    def _on_message(self, client: Any, _k: Any, message: Any) -> None:
        from shared import decode_header

        now = time.perf_counter()
        header = decode_header(message.payload)
        slot = int(header["id"])
        clock, window = self._clock, self._window
        assert clock is not None and window is not None
        if clock.inside(now):
            if "error" in header:
                window.errors += 1
            else:
                window.latencies_ms.append((now - self._sent[slot]) * 1000.0)
        if clock.running:
            self._sent[slot] = time.perf_counter()
            client.publish(self._topic, self._frames[slot], qos=1)
        else:
            with self._lock:
                self._outstanding -= 1

    def close(self) -> None:
        for client in self._clients:
            client.disconnect()
            client.loop_stop()
        self._clients.clear()


class HttpLoad:
    """N keep-alive HTTP/1.1 connections on one asyncio loop, POSTing one prepared body."""

    def __init__(self, port: int, path: str, body: bytes, headers: dict[str, str]) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.port = port
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def run(self, n: int, warm_s: float, window_s: float) -> Window:
        return asyncio.run(self._run(n, warm_s, window_s))

    def one(self) -> bytes:
        """One request on a fresh connection: the response body (to check the answer)."""

        async def go() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(self.request)
                return await _read_response(reader)
            finally:
                writer.close()

        return asyncio.run(go())

    async def _run(self, n: int, warm_s: float, window_s: float) -> Window:
        window = Window(seconds=window_s)
        conns = [await asyncio.open_connection("127.0.0.1", self.port) for _ in range(n)]
        clock = _Clock(warm_s, window_s)
        try:
            await asyncio.gather(*(self._requester(r, w, clock, window) for r, w in conns))
        finally:
            for _, writer in conns:
                writer.close()
        return window

    async def _requester(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        clock: _Clock,
        window: Window,
    ) -> None:
        clock_now: Callable[[], float] = time.perf_counter
        while clock.running:
            t0 = clock_now()
            writer.write(self.request)
            try:
                await _read_response(reader)
                ok = True
            except _HttpStatusError:
                ok = False
            t1 = clock_now()
            if clock.inside(t1):
                if ok:
                    window.latencies_ms.append((t1 - t0) * 1000.0)
                else:
                    window.errors += 1
            if t1 >= clock.end:
                clock.running = False


class InProcessLoad:
    """N asyncio tasks, each awaiting ``submit()`` (an awaitable future) in a loop."""

    def __init__(self, submit: Callable[[], Any]) -> None:
        self.submit = submit

    def run(self, n: int, warm_s: float, window_s: float) -> Window:
        return asyncio.run(self._run(n, warm_s, window_s))

    async def _run(self, n: int, warm_s: float, window_s: float) -> Window:
        window = Window(seconds=window_s)
        clock = _Clock(warm_s, window_s)
        await asyncio.gather(*(self._requester(clock, window) for _ in range(n)))
        return window

    async def _requester(self, clock: _Clock, window: Window) -> None:
        now: Callable[[], float] = time.perf_counter
        while clock.running:
            t0 = now()
            await self.submit()
            t1 = now()
            if clock.inside(t1):
                window.latencies_ms.append((t1 - t0) * 1000.0)
            if t1 >= clock.end:
                clock.running = False


class _HttpStatusError(Exception):
    pass


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
            break
    if length is None:
        raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
    body = await reader.readexactly(length)
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        raise _HttpStatusError(head[:200].decode(errors="replace"))
    return body
