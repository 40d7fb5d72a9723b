"""The main job on embedded defaults: broker, hub and a fleet of edge agents on real digits.

``run_demo`` builds (or loads from cache) the demo's edge/cloud model pair,
starts an MQTT broker (in-process amqtt unless a URL is given) and a hub,
then streams the test digits through a fleet of ``EdgeAgent`` threads three
times, once per mode: edge-only, cloud-only and collaborative (offload
budget, calibrated on held-out digits). It returns per-mode figures and the
per-sample outputs that the plot's offline sweep needs. No printing here:
the CLI renders.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cloud_hub import Hub
from edge_agent import EdgeAgent, InferenceResult, OffloadPolicy
from shared import MqttSettings, Topics

from ._broker import EmbeddedBroker
from ._data import load_digit_splits
from ._training import build_demo_models

__all__ = ["DemoConfig", "DemoReport", "ModeResult", "run_demo"]

Progress = Callable[[str, float], None]
MODEL = "mnist"


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    devices: int = 8
    budget: float = 0.20  # share of requests the collaborative mode may offload
    score: str = "margin"
    deadline_ms: float = 250.0
    broker_url: str | None = None  # None: start the embedded amqtt broker
    cache_dir: Path | None = None
    limit: int | None = None  # stream only the first N test digits
    topic_prefix: str = "tandem/demo"


@dataclass
class ModeResult:
    name: str
    accuracy: float
    offload_rate: float  # share of requests sent to the cloud (answered or not)
    p50_ms: float
    p99_ms: float
    sources: Counter[str] = field(default_factory=Counter)
    fallbacks: int = 0
    deadline_misses: int = 0


@dataclass
class DemoReport:
    modes: list[ModeResult]
    edge_logits: np.ndarray  # local outputs on the test stream, for the offline sweep
    cloud_logits: np.ndarray
    labels: np.ndarray
    calibration_threshold: float
    model_report: dict[str, object]
    broker: str
    elapsed_s: float
    edge_float_onnx: Path  # the float edge model, for `tandem models publish`
    cloud_onnx: Path


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoReport:
    started = time.perf_counter()
    report = progress or (lambda stage, fraction: None)
    models = build_demo_models(config.cache_dir, progress=report)
    splits = load_digit_splits()
    images, labels = splits.test_images, splits.test_labels
    if config.limit is not None:
        images, labels = images[: config.limit], labels[: config.limit]
    topics = Topics(config.topic_prefix)
    with _broker(config.broker_url) as settings:
        share_group = None if config.broker_url is None else "hubs"
        hub = Hub(models.hub_repository, mqtt=settings, topics=topics, share_group=share_group)
        with hub:
            modes: list[ModeResult] = []
            outputs: dict[str, np.ndarray] = {}
            threshold = float("nan")
            plans: list[tuple[str, Callable[[], OffloadPolicy]]] = [
                ("edge-only", OffloadPolicy.always_local),
                ("cloud-only", OffloadPolicy.always_cloud),
                ("collaborative", lambda: OffloadPolicy.budget(config.budget, score=config.score)),
            ]
            for name, make_policy in plans:
                agents = [
                    EdgeAgent(
                        models.edge_int8_onnx,
                        device_id=f"demo-{i:03d}",
                        broker=settings,
                        cloud_model=MODEL,
                        policy=make_policy(),
                        topics=topics,
                        default_deadline_ms=config.deadline_ms,
                    )
                    for i in range(config.devices)
                ]
                try:
                    for agent in agents:
                        agent.start(wait_s=10.0)
                        if name == "collaborative":
                            threshold = agent.calibrate(splits.calibration_images)
                    results = _stream(agents, images, functools.partial(report, f"stream {name}"))
                finally:
                    for agent in agents:
                        agent.close()
                modes.append(_summarize(name, results, labels))
                outputs[name] = np.concatenate([r.output for r in results])
    return DemoReport(
        modes=modes,
        edge_logits=outputs["edge-only"],
        cloud_logits=outputs["cloud-only"],
        labels=labels,
        calibration_threshold=threshold,
        model_report=dict(models.report),
        broker=config.broker_url or "embedded amqtt",
        elapsed_s=time.perf_counter() - started,
        edge_float_onnx=models.edge_float_onnx,
        cloud_onnx=models.cloud_onnx,
    )


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[MqttSettings]:
    if url is not None:
        yield MqttSettings.from_url(url)
        return
    with EmbeddedBroker() as broker:
        # amqtt speaks MQTT 3.1.1 only: say so rather than probe for 5.
        yield MqttSettings.from_url(broker.url, protocol="3.1.1")


def _stream(
    agents: list[EdgeAgent], images: np.ndarray, progress: Callable[[float], None]
) -> list[InferenceResult]:
    """Send every image through the fleet, one request per image; results in input order."""
    work: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(images)):
        work.put(i)
    results: list[InferenceResult | None] = [None] * len(images)
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def device(agent: EdgeAgent) -> None:
        while True:
            try:
                i = work.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = agent.infer(images[i : i + 1])
            except BaseException as e:  # surfaced below; a demo must not hide a failure
                errors.append(e)
                return
            with lock:
                done[0] += 1
                if done[0] % 25 == 0 or done[0] == len(images):
                    progress(done[0] / len(images))

    threads = [threading.Thread(target=device, args=(a,), daemon=True) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _summarize(name: str, results: list[InferenceResult], labels: np.ndarray) -> ModeResult:
    predictions = np.array([int(np.argmax(r.output)) for r in results])
    latencies = np.array([r.latency.total_ms for r in results])
    sources = Counter(r.source.value for r in results)
    offloaded = sum(1 for r in results if r.source.value != "edge")
    return ModeResult(
        name=name,
        accuracy=float((predictions == labels).mean()),
        offload_rate=offloaded / len(results),
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        sources=sources,
        fallbacks=sources.get("edge-fallback", 0),
        deadline_misses=sum(not r.deadline_met for r in results),
    )
