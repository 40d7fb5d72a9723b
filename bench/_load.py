"""Closed-loop load generators: N requesters, each sending its next request when answered.

They are built to cost the machine as little per request as Python allows,
because they share the cores with the server they measure (the MQTT ones
are in ``bench._load_mqtt``):

* ``HttpLoad``: N keep-alive connections on one asyncio loop, speaking just
  enough HTTP/1.1 (a prepared request, then the head and a
  ``Content-Length`` body back); no client library's per-request work.
* ``InProcessLoad``: N asyncio tasks awaiting the futures of an in-process
  ``submit`` (a ``DynamicBatcher``'s), with no transport at all.

``binary_infer_request`` builds the body and headers of a hub ``/infer``
request with binary tensors (Triton's binary tensor data extension).

``run(n, warm_s, window_s)`` keeps n requests in flight for ``warm_s`` and
then ``window_s`` seconds, and returns a ``Window``: the answers that
arrived inside the window and their latencies (``answered`` counts every
successful answer of the run, to reconcile with a server's counters). It
then stops sending and waits for the requests still in flight, so the next
run starts clean. ``WindowClock`` holds a window's bounds for every loader.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["HttpLoad", "InProcessLoad", "Window", "WindowClock", "binary_infer_request"]


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
    answered: int = 0  # every successful answer of the run, warm-up and drain included

    @property
    def throughput(self) -> float:
        return len(self.latencies_ms) / self.seconds

    def record(self, clock: WindowClock, t0: float, t1: float, ok: bool) -> None:
        """One answer sent at ``t0``, come at ``t1``: counted; kept if inside the window
        (a latency, or an error); past the window's end, the clock stops the run."""
        self.answered += ok
        if clock.inside(t1):
            if ok:
                self.latencies_ms.append((t1 - t0) * 1000.0)
            else:
                self.errors += 1
        if t1 >= clock.end:
            clock.running = False


class WindowClock:
    """The window's bounds, shared by the threads that record answers."""

    def __init__(self, warm_s: float, window_s: float) -> None:
        now = time.perf_counter()
        self.start = now + warm_s
        self.end = self.start + window_s
        self.running = True

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end


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
        clock = WindowClock(warm_s, window_s)
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
        clock: WindowClock,
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
            window.record(clock, t0, t1, ok)


class InProcessLoad:
    """N asyncio tasks, each awaiting ``submit()`` (an awaitable future) in a loop."""

    def __init__(self, submit: Callable[[], Any]) -> None:
        self.submit = submit

    def run(self, n: int, warm_s: float, window_s: float) -> Window:
        return asyncio.run(self._run(n, warm_s, window_s))

    async def _run(self, n: int, warm_s: float, window_s: float) -> Window:
        window = Window(seconds=window_s)
        clock = WindowClock(warm_s, window_s)
        await asyncio.gather(*(self._requester(clock, window) for _ in range(n)))
        return window

    async def _requester(self, clock: WindowClock, window: Window) -> None:
        now: Callable[[], float] = time.perf_counter
        while clock.running:
            t0 = now()
            await self.submit()
            t1 = now()
            window.answered += 1
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
