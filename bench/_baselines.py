"""The baselines the hub is measured against, each run as its own process.

``python -m bench._baselines echo BROKER_URL REQUEST_TOPIC REPLY_TOPIC READY_FILE``
    A bare paho-mqtt client that republishes every request payload, as is,
    to the reply topic, QoS 1 both ways: the MQTT round trip with nothing
    on top, the limit of a broker-based offload on this stack. REPLY_TOPIC
    ``-`` answers each device on its own reply topic, derived from the
    request topic as the hub does (``.../dev/{device}/infer/{model}`` ->
    ``.../dev/{device}/reply``), for a REQUEST_TOPIC filter such as
    ``tandem/v1/dev/+/infer/+``.

``python -m bench._baselines echo-crt BROKER_URL REQUEST_TOPIC REPLY_TOPIC READY_FILE``
    The same consumer on awscrt's MQTT 5 client, the client the hub's
    ingress uses: what receiving a request and publishing a reply costs
    with nothing else on top (part c's bound for the hub's own work).

``python -m bench._baselines plain-http MODEL.onnx PORT``
    JSON-over-HTTP offload as simple joint-inference systems write it first:
    FastAPI on uvicorn (one worker), ``POST /infer`` takes ``{"data": nested
    lists}``, runs ONNX Runtime (default session options) on that one
    request and answers ``{"outputs": nested lists}``. The endpoint is a
    plain ``def`` (FastAPI runs it in its thread pool), and ``data`` is
    typed ``list[Any]``, so pydantic does not validate every number: the
    cheaper of the two obvious ways to write it.

``python -m bench._baselines otlp-sink PORT``
    An OTLP/HTTP trace receiver that takes every ``POST /v1/traces`` and
    answers 200 without decoding it (``GET /health``: 200): where part (d)'s
    traced agent exports, in a process of its own so that receiving costs the
    measured process nothing.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations at
# runtime, and a request model defined inside a function cannot be found from a string.

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _reply_topic(reply_topic: str) -> Callable[[str], str]:
    """The reply topic for a request topic: fixed, or (``-``) the device's own."""
    if reply_topic != "-":
        return lambda _topic: reply_topic
    return lambda topic: topic.rsplit("/infer/", 1)[0] + "/reply"


def echo(broker_url: str, request_topic: str, reply_topic: str, ready: Path) -> None:
    from shared import MqttSettings, create_client

    settings = MqttSettings.from_url(broker_url)
    client = create_client(settings, f"bench-echo-{ready.stem}", protocol="5")
    client.max_inflight_messages_set(0)

    def on_connect(c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure:
            c.subscribe(request_topic, qos=1)

    def on_subscribe(_c: Any, _u: Any, _m: Any, _codes: Any, _p: Any) -> None:
        ready.touch()

    reply_for = _reply_topic(reply_topic)

    def on_message(c: Any, _u: Any, message: Any) -> None:
        c.publish(reply_for(message.topic), message.payload, qos=1)

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect(settings.host, settings.port)
    client.loop_forever()


def echo_crt(broker_url: str, request_topic: str, reply_topic: str, ready: Path) -> None:
    from awscrt import mqtt5

    from shared import MqttSettings

    settings = MqttSettings.from_url(broker_url)
    reply_for = _reply_topic(reply_topic)
    qos1 = mqtt5.QoS.AT_LEAST_ONCE
    connected = threading.Event()
    clients: list[Any] = []

    def on_publish(data: Any) -> None:
        packet = data.publish_packet
        clients[0].publish(
            mqtt5.PublishPacket(topic=reply_for(packet.topic), payload=packet.payload, qos=qos1)
        )

    client = mqtt5.Client(
        mqtt5.ClientOptions(
            host_name=settings.host,
            port=settings.port,
            connect_options=mqtt5.ConnectPacket(
                client_id=f"bench-echo-crt-{ready.stem}", keep_alive_interval_sec=60
            ),
            session_behavior=mqtt5.ClientSessionBehaviorType.CLEAN,
            on_publish_callback_fn=on_publish,
            on_lifecycle_event_connection_success_fn=lambda _d: connected.set(),
            disable_metrics=True,
        )
    )
    clients.append(client)
    client.start()
    if not connected.wait(30.0):
        raise SystemExit(f"echo-crt: cannot connect to {settings.url}")
    subscription = mqtt5.Subscription(topic_filter=request_topic, qos=qos1)
    client.subscribe(mqtt5.SubscribePacket(subscriptions=[subscription])).result(30.0)
    ready.touch()
    threading.Event().wait()  # serve until the bench terminates this process


def plain_http(model: Path, port: int) -> None:
    import numpy as np
    import onnxruntime as ort
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    class InferRequest(BaseModel):
        data: list[Any]

    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/infer")
    def infer(request: InferRequest) -> dict[str, Any]:
        x = np.asarray(request.data, dtype=np.float32)
        (y,) = session.run(None, {input_name: x})
        return {"outputs": y.tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, workers=1, log_level="warning", access_log=False)


def otlp_sink(port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "echo":
        echo(args[0], args[1], args[2], Path(args[3]))
    elif mode == "echo-crt":
        echo_crt(args[0], args[1], args[2], Path(args[3]))
    elif mode == "plain-http":
        plain_http(Path(args[0]), int(args[1]))
    elif mode == "otlp-sink":
        otlp_sink(int(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: echo, echo-crt, plain-http or otlp-sink")


if __name__ == "__main__":
    main(sys.argv[1:])
