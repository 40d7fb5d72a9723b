"""Streaming clients of the hub's ``/v1/completions`` in their own process (bench part h).

``python -m bench._hub_generate_client URL MODEL STREAMS SECONDS MAX_TOKENS`` runs
``STREAMS`` concurrent clients (asyncio, httpx), each sending one streamed
request after the other until ``SECONDS`` have passed, and prints one JSON
line: completion tokens (from each answer's usage chunk), requests, the wall
time from the start to the last answer's end, and each request's time to
first text. A separate process, so that the clients' Python does not share the
hub's interpreter lock (they still share the machine's cores).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

PROMPTS = ["The assert statement", "def f(x):", "Python is a", "class Foo", "import os",
           "while True", "A list is", "return None"]  # fmt: skip


async def _one(client: Any, url: str, body: dict[str, Any]) -> tuple[int, float | None]:
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
            elif first is None and any(c.get("text") for c in event.get("choices", [])):
                first = time.perf_counter() - started
    return tokens, first


async def _stream(client: Any, url: str, i: int, model: str, until: float, n: int) -> list[Any]:
    done = []
    while time.perf_counter() < until:
        body = {
            "model": model,
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": n,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tokens, first = await _one(client, url, body)
        done.append((tokens, first, time.perf_counter()))
    return done


async def run(base: str, model: str, streams: int, seconds: float, n: int) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=streams + 2)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        url = f"{base}/v1/completions"
        await _one(client, url, {"model": model, "prompt": "x", "max_tokens": 2, "stream": True})
        started = time.perf_counter()
        until = started + seconds
        results = await asyncio.gather(
            *(_stream(client, url, i, model, until, n) for i in range(streams))
        )
    done = [r for stream in results for r in stream]
    return {
        "tokens": sum(t for t, _, _ in done),
        "requests": len(done),
        "seconds": max(end for _, _, end in done) - started,
        "ttft_s": [f for _, f, _ in done if f is not None],
    }


if __name__ == "__main__":
    url, model, streams, seconds, n = sys.argv[1:6]
    print(json.dumps(asyncio.run(run(url, model, int(streams), float(seconds), int(n)))))
