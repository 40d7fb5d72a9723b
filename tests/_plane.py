"""A multi-process hub (``HubSupervisor``) on a real broker, and devices that talk to it raw."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho

from cloud_hub.plane._spec import PlaneSpec, plan_executors
from cloud_hub.plane._supervisor import HubSupervisor
from shared import Message, MqttSettings, Topics, create_client, decode_message, encode_message

from ._models import linear_classifier_weights, write_linear_classifier

__all__ = ["Requester", "expected_logits", "linear_repo", "running_hub", "wait_until"]


def linear_repo(root: Path, *, max_batch_size: int = 8, delay_ms: float = 5.0) -> Path:
    """A repository with the linear classifier as ``linear`` (x: FP32[n, 16] -> logits[n, 4])."""
    write_linear_classifier(root / "linear" / "1" / "model.onnx")
    (root / "linear" / "config.json").write_text(
        f'{{"max_batch_size": {max_batch_size}, "max_queue_delay_ms": {delay_ms}}}'
    )
    return root


def expected_logits(x: np.ndarray) -> np.ndarray:
    weight, bias = linear_classifier_weights()
    return (x @ weight + bias).astype(np.float32)


@contextlib.contextmanager
def running_hub(
    repo: Path,
    broker_url: str | None,
    *,
    mqtt: int = 1,
    http_port: int = 0,
    http: int = 1,
    grpc_port: int = 0,
    otlp_endpoint: str | None = None,
) -> Iterator[HubSupervisor]:
    hub_id = uuid.uuid4().hex[:8]
    spec = PlaneSpec(
        hub_id=hub_id,
        repo=str(repo),
        metrics_dir="",
        executors=plan_executors(repo, hub_id),
        broker=broker_url,
        prefix=f"tandem/{hub_id}/v1",  # hubs of several tests share the broker, not requests
        http_port=http_port,
        grpc_port=grpc_port,
        log_level="warning",
        ring_bytes=16 * 1024 * 1024,
        otlp_endpoint=otlp_endpoint,
    )
    supervisor = HubSupervisor(spec, mqtt_workers=mqtt, http_workers=http).start()
    try:
        yield supervisor
    finally:
        supervisor.stop()


def wait_until(condition: object, timeout_s: float = 30.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} did not hold within {timeout_s}s")


@dataclass
class Requester:
    """A device without the SDK: publishes request frames, keeps every reply by request id."""

    broker_url: str
    prefix: str = "tandem/v1"
    model: str = "linear"
    device: str = field(default_factory=lambda: f"dev-{uuid.uuid4().hex[:6]}")
    replies: dict[str, Message] = field(default_factory=dict)
    sent: dict[str, np.ndarray] = field(default_factory=dict)
    duplicates: int = 0  # replies to a request already answered

    def __post_init__(self) -> None:
        self.topics = Topics(self.prefix)
        self._lock = threading.Lock()
        settings = MqttSettings.from_url(self.broker_url)
        self._client: paho.Client = create_client(settings, f"req-{self.device}", protocol="5")
        self._client.max_inflight_messages_set(0)
        subscribed = threading.Event()
        self._client.on_connect = lambda c, *_: c.subscribe(self.topics.reply(self.device), qos=1)
        self._client.on_subscribe = lambda *_: subscribed.set()
        self._client.on_message = self._on_message
        self._client.connect(settings.host, settings.port)
        self._client.loop_start()
        if not subscribed.wait(10):
            raise AssertionError("the requester could not subscribe")

    def send(self, x: np.ndarray, *, timeout_ms: float = 5000.0) -> str:
        request_id = uuid.uuid4().hex
        frame = encode_message(
            Message(
                kind="request",
                request_id=request_id,
                model=self.model,
                reply_to=self.topics.reply(self.device),
                device_id=self.device,
                timeout_ms=timeout_ms,
                tensors={"x": x},
            )
        )
        with self._lock:
            self.sent[request_id] = x
        self._client.publish(self.topics.device_infer(self.device, self.model), frame, qos=1)
        return request_id

    def _on_message(self, _c: object, _u: object, message: paho.MQTTMessage) -> None:
        reply = decode_message(message.payload)  # (raising here would end paho's thread)
        with self._lock:
            if reply.request_id in self.replies:
                self.duplicates += 1
            self.replies[reply.request_id] = reply

    def answered(self, ids: list[str] | None = None) -> int:
        with self._lock:
            return sum(1 for i in (ids or list(self.sent)) if i in self.replies)

    def check_correct(self) -> tuple[int, int]:
        """(ok, errors) over the replies so far; an ok reply must carry its own request's answer."""
        ok = errors = 0
        with self._lock:
            for request_id, reply in self.replies.items():
                if not reply.ok:
                    errors += 1
                    continue
                logits = reply.tensors["logits"]
                x = self.sent[request_id]
                assert logits.dtype == np.float32 and logits.shape == (x.shape[0], 4)
                np.testing.assert_allclose(logits, expected_logits(x), rtol=1e-5, atol=1e-5)
                ok += 1
        return ok, errors

    def close(self) -> None:
        assert self.duplicates == 0, f"{self.duplicates} requests were answered twice"
        self._client.disconnect()
        self._client.loop_stop()
