"""A FastAPI service built on ``AsyncEdgeAgent``: one agent, many concurrent requests.

The service owns one agent for its whole life (FastAPI's lifespan starts and
closes it); each HTTP request awaits ``agent.infer`` without blocking the
event loop (the local model runs in a worker thread, the wait for the hub is
a future). Uncertain digits go to the hub; when the hub is slow or away the
caller still gets the local answer, marked ``degraded``.

Run it: ``.venv/bin/python examples/async_service.py`` (starts a broker and
a hub in process, serves on a free port, sends it 200 digits concurrently,
prints where the answers came from and why). In your own service, build the app
with ``create_app(model, broker_url, calibration_images)`` in a module and
serve it with ``uvicorn yourmodule:app``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import uvicorn
from _local import CLOUD_MODEL, demo_data, local_broker, mnist_hub  # this folder's helpers
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from edge_agent import AsyncEdgeAgent, InvalidInputError, OffloadPolicy
from shared import MqttSettings


class Digit(BaseModel):
    pixels: list[float]  # 784 values in [0, 1], row by row


class Answer(BaseModel):
    digit: int
    source: str  # "edge", "cloud" or "edge-fallback"
    reason: str
    degraded: bool
    latency_ms: float


def create_app(
    edge_model: Path,
    broker: str | MqttSettings,
    calibration: np.ndarray,
    *,
    deadline_ms: float = 200.0,
) -> FastAPI:
    """The service: ``POST /digits`` answers one digit, from the device or the cloud."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        agent = AsyncEdgeAgent(
            edge_model,
            device_id="reader-1",
            broker=broker,
            cloud_model=CLOUD_MODEL,
            policy=OffloadPolicy.budget(0.2, score="margin"),
        )
        await agent.start()
        await asyncio.to_thread(agent.calibrate, calibration)  # threshold for a 20% budget
        app.state.agent = agent
        try:
            yield
        finally:
            await agent.close()

    app = FastAPI(title="digit reader", lifespan=lifespan)

    @app.post("/digits")
    async def read_digit(digit: Digit) -> Answer:
        agent: AsyncEdgeAgent = app.state.agent
        image = np.asarray(digit.pixels, dtype=np.float32)
        if image.size != 784:
            raise HTTPException(422, f"need 784 pixels, got {image.size}")
        try:
            result = await agent.infer(image.reshape(1, 1, 28, 28), deadline_ms=deadline_ms)
        except InvalidInputError as e:  # NaN pixels, for instance: the client's mistake
            raise HTTPException(422, str(e)) from e
        return Answer(
            digit=int(result.output.argmax()),
            source=str(result.source),
            reason=result.reason,
            degraded=result.degraded,
            latency_ms=result.latency.total_ms,
        )

    return app


async def _serve_and_call(app: FastAPI, images: np.ndarray) -> list[dict[str, object]]:
    """Serve ``app`` on a free loopback port in this loop, post every image at once, stop."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                serving.result()  # raises what stopped it
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            clients = asyncio.Semaphore(16)  # 16 callers at a time, as a busy service sees

            async def post(image: np.ndarray) -> httpx.Response:
                async with clients:
                    return await http.post("/digits", json={"pixels": image.ravel().tolist()})

            responses = await asyncio.gather(*(post(image) for image in images))
            nan_pixel = '{"pixels": [NaN' + ", 0.0" * 783 + "]}"  # what a broken camera sends
            bad = await http.post(
                "/digits", content=nan_pixel, headers={"content-type": "application/json"}
            )
    finally:
        server.should_exit = True
        await serving
        sock.close()
    answers = [r.raise_for_status().json() for r in responses]
    answers.append({"bad_request_status": bad.status_code})
    return answers


def main(broker_url: str | None = None, n: int = 200) -> dict[str, object]:
    models, digits = demo_data()
    with local_broker(broker_url) as mqtt, mnist_hub(models, mqtt):
        app = create_app(models.edge_int8_onnx, mqtt, digits.calibration_images)
        *answers, bad = asyncio.run(_serve_and_call(app, digits.test_images[:n]))
    predicted = np.array([a["digit"] for a in answers])
    accuracy = float((predicted == digits.test_labels[:n]).mean())
    sources = Counter(str(a["source"]) for a in answers)
    reasons = Counter(str(a["reason"]) for a in answers)
    degraded = sum(bool(a["degraded"]) for a in answers)
    print(f"{n} requests, 16 at a time: accuracy {accuracy:.1%}, answered by {dict(sources)}")
    print(f"why: {dict(reasons)}")
    print(f"a NaN pixel is refused with HTTP {bad['bad_request_status']}")
    return {
        "accuracy": accuracy,
        "sources": dict(sources),
        "reasons": dict(reasons),
        "degraded": degraded,
        "nan_status": bad["bad_request_status"],
    }


if __name__ == "__main__":
    main()
