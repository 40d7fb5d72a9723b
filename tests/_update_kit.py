"""What the updater tests share: a publisher that signs real ONNX models onto the
loopback CDN, a factory-provisioned device store, an MQTT probe for the status
topic, and an app that keeps calling the agent while updates happen.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent import EdgeAgent, ModelUpdater
from edge_agent.updater import CurrentPointer, DeviceModelStore, TrustRecord
from shared import (
    ModelManifest,
    SigningKey,
    Topics,
    UpdateState,
    UpdateStatus,
    compress_blob,
    digest,
    encode_sample,
    format_time,
    make_delta,
    sign_document,
)

from ._brokers import MosquittoProcess
from ._models import linear_classifier_weights, write_linear_classifier
from ._test_cdn import LoopbackCdn

__all__ = [
    "MODEL",
    "SAMPLE",
    "Published",
    "Publisher",
    "Rig",
    "StatusProbe",
    "Traffic",
    "provision",
    "wait_until",
]

MODEL = "lin"
SAMPLE = np.random.default_rng(7).normal(size=(2, 16)).astype(np.float32)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


@dataclass
class Published:
    """One model version as the publisher made it."""

    version: int
    raw: bytes
    blob: bytes
    weight: np.ndarray
    bias: np.ndarray
    document: dict[str, Any]  # the signed manifest

    @property
    def signed(self) -> bytes:
        return json.dumps(self.document).encode()

    @property
    def blob_digest(self) -> str:
        return digest(self.blob)

    def expected(self, x: np.ndarray = SAMPLE) -> np.ndarray:
        return x @ self.weight + self.bias


def _now() -> datetime:
    return datetime.now(UTC)


class Publisher:
    """Builds, signs and uploads versions of the ``lin`` classifier to a ``LoopbackCdn``."""

    def __init__(self, cdn: LoopbackCdn, key: SigningKey, workdir: Path, model: str = MODEL):
        self.cdn, self.key, self.workdir, self.model = cdn, key, workdir, model

    def build(
        self,
        version: int,
        *,
        seed: int | None = None,
        bias_shift: float | None = None,
        deltas_from: Sequence[Published] = (),
        delta_method: str = "zstd-patch",
        published_at: datetime | None = None,
        expires_at: datetime | None = None,
        keys: Sequence[SigningKey] | None = None,
        smoke_outputs_off: bool = False,
        extra: dict[str, Any] | None = None,
        raw_digest: str | None = None,
    ) -> Published:
        """A signed version (not uploaded). ``bias_shift`` makes it ``seed``'s model with
        the bias moved, so that a delta from that version is small."""
        seed = version if seed is None else seed
        weight, bias = linear_classifier_weights(seed=seed)
        path = write_linear_classifier(self.workdir / f"v{version}-{seed}.onnx", seed=seed)
        raw = path.read_bytes()
        if bias_shift is not None:
            raw, bias = _shift_bias(raw, bias_shift)
        blob = compress_blob(raw)
        expected = SAMPLE @ weight + bias + (0.5 if smoke_outputs_off else 0.0)
        published_at = published_at or _now() - timedelta(minutes=1)
        expires_at = expires_at or _now() + timedelta(days=1)
        deltas = []
        for base in deltas_from:
            delta = make_delta(base.raw, raw, method=delta_method)
            self.cdn.put_blob(digest(delta), delta)
            deltas.append(
                {
                    "from_version": base.version,
                    "digest": digest(delta),
                    "size": len(delta),
                    "compression": delta_method,
                }
            )
        signed = {
            "type": "manifest",
            "spec_version": "1.0",
            "name": self.model,
            "version": version,
            "format": "onnx",
            "requires": {"runtime": "onnxruntime", "opset": 17},
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [None, 16]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [None, 4]}],
            "blob": {
                "digest": digest(blob),
                "size": len(blob),
                "raw_size": len(raw),
                "compression": "zstd",
                **({"raw_digest": raw_digest} if raw_digest is not None else {}),
            },
            "deltas": deltas,
            "smoke_test": {
                "inputs": {"x": encode_sample(SAMPLE)},
                "outputs": {"logits": encode_sample(expected.astype(np.float32))},
                "atol": 1e-4,
            },
            "published_at": format_time(published_at),
            "expires_at": format_time(expires_at),
            **(extra or {}),
        }
        document = sign_document(signed, *(keys or [self.key]))
        return Published(version, raw, blob, weight, bias, document)

    def upload(self, published: Published, *, latest: bool = True) -> Published:
        self.cdn.put_manifest(self.model, published.version, published.signed, latest=latest)
        self.cdn.put_blob(published.blob_digest, published.blob)
        return published

    def publish(self, version: int, **options: Any) -> Published:
        return self.upload(self.build(version, **options))

    def assignment(
        self,
        device: str,
        version: int,
        *,
        rollback: bool = False,
        issued_at: datetime | None = None,
        expires_at: datetime | None = None,
        model: str | None = None,
        key: SigningKey | None = None,
    ) -> bytes:
        issued_at = issued_at or _now()
        signed = {
            "type": "assignment",
            "spec_version": "1.0",
            "device": device,
            "model": model or self.model,
            "version": version,
            "rollback": rollback,
            "rollout": "r-test",
            "issued_at": format_time(issued_at),
            "expires_at": format_time(expires_at or issued_at + timedelta(days=1)),
        }
        return json.dumps(sign_document(signed, key or self.key)).encode()


def _shift_bias(raw: bytes, shift: float) -> tuple[bytes, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(raw)
    for i, init in enumerate(model.graph.initializer):
        if init.name == "b":
            bias = (numpy_helper.to_array(init) + np.float32(shift)).astype(np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(bias, "b"))
    out = io.BytesIO()
    onnx.save_model(model, out)
    return out.getvalue(), bias


def provision(store_dir: Path, published: Published, issued_at: str | None = None) -> None:
    """A device as it leaves the factory: ``published`` installed and committed."""
    store = DeviceModelStore(store_dir)
    manifest = ModelManifest.from_dict(published.document["signed"])
    store.install(MODEL, manifest, published.signed, published.raw)
    trust = TrustRecord(published.version, issued_at)
    store.commit(MODEL, CurrentPointer(published.version, None, trust))


@dataclass
class StatusProbe:
    """A test's own MQTT client: publishes assignments, collects status reports."""

    broker: MosquittoProcess
    device: str
    topics: Topics = field(default_factory=Topics)
    reports: list[UpdateStatus] = field(default_factory=list)

    def __post_init__(self) -> None:
        import paho.mqtt.client as mqtt

        self._client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"probe-{self.device}",
            protocol=mqtt.MQTTv311,
        )
        subscribed = threading.Event()
        self._client.on_message = lambda _c, _u, msg: self.reports.append(
            UpdateStatus.from_json(bytes(msg.payload))
        )
        self._client.on_subscribe = lambda *_a: subscribed.set()
        self._client.connect("127.0.0.1", self.broker.port)
        self._client.loop_start()
        self._client.subscribe(self.topics.status(self.device), qos=1)
        assert subscribed.wait(10), "the probe could not subscribe"

    def assign(self, document: bytes) -> None:
        """Publish ``document`` as this device's retained assignment."""
        info = self._client.publish(self.topics.assign(self.device), document, qos=1, retain=True)
        info.wait_for_publish(10)

    def states(self) -> list[str]:
        return [r.state.value for r in self.reports]

    def wait_for(self, *states: UpdateState, timeout_s: float = 30.0) -> UpdateStatus:
        wanted = set(states)
        wait_until(
            lambda: any(r.state in wanted for r in self.reports),
            timeout_s,
            f"a {'/'.join(s.value for s in states)} report (got {self.states()})",
        )
        return next(r for r in self.reports if r.state in wanted)

    def close(self) -> None:
        self.assign(b"")  # clear the retained assignment
        self._client.disconnect()
        self._client.loop_stop()


class Traffic:
    """An app that calls ``agent.infer`` in a loop, in a thread, and keeps every answer."""

    def __init__(self, agent: EdgeAgent) -> None:
        self.agent = agent
        self.answers: list[tuple[str, np.ndarray]] = []
        self.errors: list[BaseException] = []
        self.calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def versions(self) -> list[str]:
        return [v for v, _ in self.answers]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.calls += 1
            try:
                result = self.agent.infer({"x": SAMPLE}, deadline_ms=5000)
            except BaseException as e:
                self.errors.append(e)
                continue
            self.answers.append((result.model_versions["edge"], result.output))
            time.sleep(0.001)


@dataclass
class Rig:
    """One device and its world: a loopback CDN, a publisher key, a store with v1."""

    cdn: LoopbackCdn
    key: SigningKey
    publisher: Publisher
    store_dir: Path
    device: str
    v1: Published

    @classmethod
    def create(cls, cdn: LoopbackCdn, workdir: Path, device: str) -> Rig:
        key = SigningKey.generate()
        publisher = Publisher(cdn, key, workdir / "published")
        v1 = publisher.publish(1)
        store_dir = workdir / "device" / "models"
        provision(store_dir, v1)
        return cls(cdn, key, publisher, store_dir, device, v1)

    def agent(self) -> EdgeAgent:
        """An agent started the way a device restarts: on what the store verifies."""
        runtime = ModelUpdater.bootstrap(self.store_dir, [self.key.public_key], MODEL)
        assert runtime is not None
        return EdgeAgent(runtime, device_id=self.device)

    def updater(self, agent: EdgeAgent, **options: Any) -> ModelUpdater:
        return ModelUpdater(
            agent,
            model=MODEL,
            device_id=self.device,
            cdn_url=self.cdn.url,
            trusted_keys=[self.key.public_key],
            store_dir=self.store_dir,
            **options,
        )

    def pointer(self) -> CurrentPointer | None:
        return DeviceModelStore(self.store_dir).pointer(MODEL)
