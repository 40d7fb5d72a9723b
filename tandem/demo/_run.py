"""The main job on embedded defaults: broker, CDN, hub and a fleet of edge agents on real digits.

``run_demo`` builds (or loads from cache) the demo's edge/cloud model pair,
starts an MQTT broker (in-process amqtt unless a URL is given), delivers the
edge model to every simulated device through the model CDN (published,
signed, served and installed by each device's ``ModelUpdater``: see
``tandem.demo._delivery``), starts a hub serving the cloud model, then streams
the test digits through a fleet of ``EdgeAgent`` threads three times, once
per mode: edge-only, cloud-only and collaborative (offload budget,
calibrated on held-out digits). It returns per-mode figures, what the
delivery did, and the per-sample outputs that the plot's offline sweep
needs. No printing here: the CLI renders.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloud_hub import Hub
from edge_agent import EdgeAgent, OffloadPolicy
from shared import MqttSettings, Topics

from ..broker import BrokerStartError, EmbeddedBroker
from ._delivery import DeviceInstall, EdgeDelivery, deliver_edge_model
from ._errors import DeliveryError, DemoError
from ._stream import ModeResult, stream, summarize
from .data import DigitSplits, load_digit_splits
from .models import build_demo_models

__all__ = [
    "BrokerStartError",
    "DeliveryError",
    "DemoConfig",
    "DemoError",
    "DemoReport",
    "DeviceInstall",
    "EdgeDelivery",
    "ModeResult",
    "run_demo",
]

Progress = Callable[[str, float], None]
MODEL = "mnist"  # the cloud model, as the hub serves it


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

    def __post_init__(self) -> None:
        problems = [
            f"{name} {value!r}"
            for name, value, ok in (
                ("devices", self.devices, self.devices >= 1),
                ("budget", self.budget, 0.0 <= self.budget <= 1.0),
                ("deadline_ms", self.deadline_ms, self.deadline_ms > 0),
                ("limit", self.limit, self.limit is None or self.limit >= 1),
            )
            if not ok
        ]
        if problems:
            raise ValueError(f"bad demo settings: {', '.join(problems)}")

    def device_ids(self) -> list[str]:
        return [f"demo-{i:03d}" for i in range(self.devices)]


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
    delivery: EdgeDelivery  # how the edge model reached the devices
    budget: float
    score: str

    @property
    def gap_recovered(self) -> float:
        """Share of the edge-to-cloud accuracy gap the collaborative mode recovered."""
        edge, cloud, collab = (self.mode(n) for n in ("edge-only", "cloud-only", "collaborative"))
        gap = cloud.accuracy - edge.accuracy
        return (collab.accuracy - edge.accuracy) / gap if gap > 0 else float("nan")

    def mode(self, name: str) -> ModeResult:
        return next(m for m in self.modes if m.name == name)

    def to_dict(self) -> dict[str, Any]:
        """``report.json``: the figures, the delivery and how the models were built."""
        return {
            "modes": [m.to_dict() for m in self.modes],
            "budget": self.budget,
            "score": self.score,
            "calibrated_threshold": self.calibration_threshold,
            "gap_recovered": self.gap_recovered,
            "delivery": self.delivery.to_dict(),
            "models": self.model_report,
            "elapsed_s": self.elapsed_s,
        }


@dataclass(frozen=True)
class _Fleet:
    """What every mode's agents share: their models, broker, topics and deadline."""

    delivery: EdgeDelivery
    mqtt: MqttSettings
    topics: Topics
    deadline_ms: float

    def agents(self, policy: Callable[[], OffloadPolicy]) -> list[EdgeAgent]:
        """One agent per device, each on the model its store verifies; none left open on error."""
        agents: list[EdgeAgent] = []
        try:
            for install in self.delivery.devices:
                agent = EdgeAgent(
                    self.delivery.runtime(install.device),
                    device_id=install.device,
                    broker=self.mqtt,
                    cloud_model=MODEL,
                    policy=policy(),
                    topics=self.topics,
                    default_deadline_ms=self.deadline_ms,
                )
                agents.append(agent)
        except BaseException:
            for agent in agents:
                agent.close()
            raise
        return agents


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoReport:
    started = time.perf_counter()
    report = progress or (lambda stage, fraction: None)
    models = build_demo_models(config.cache_dir, progress=report)
    splits = load_digit_splits()
    images, labels = splits.test_images, splits.test_labels
    if config.limit is not None:
        images, labels = images[: config.limit], labels[: config.limit]
    topics = Topics(config.topic_prefix)
    with (
        tempfile.TemporaryDirectory(prefix="tandem-demo-") as workdir,
        _broker(config.broker_url) as mqtt,
    ):
        delivery = deliver_edge_model(
            models.edge_float_onnx,
            splits,
            devices=config.device_ids(),
            workdir=Path(workdir),
            broker=mqtt,
            topics=topics,
            cloud_model=MODEL,
            progress=report,
        )
        fleet = _Fleet(delivery, mqtt, topics, config.deadline_ms)
        share_group = None if config.broker_url is None else "hubs"
        with Hub(models.hub_repository, mqtt=mqtt, topics=topics, share_group=share_group):
            modes, outputs, threshold = _run_modes(fleet, config, splits, images, labels, report)
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
        delivery=delivery,
        budget=config.budget,
        score=config.score,
    )


def _run_modes(
    fleet: _Fleet,
    config: DemoConfig,
    splits: DigitSplits,
    images: np.ndarray,
    labels: np.ndarray,
    report: Progress,
) -> tuple[list[ModeResult], dict[str, np.ndarray], float]:
    """Each mode on a fresh fleet; (results, outputs by mode, calibrated threshold)."""
    plans: Sequence[tuple[str, Callable[[], OffloadPolicy]]] = [
        ("edge-only", OffloadPolicy.always_local),
        ("cloud-only", OffloadPolicy.always_cloud),
        ("collaborative", lambda: OffloadPolicy.budget(config.budget, score=config.score)),
    ]
    modes: list[ModeResult] = []
    outputs: dict[str, np.ndarray] = {}
    threshold = float("nan")
    for name, policy in plans:
        agents = fleet.agents(policy)
        try:
            for agent in agents:
                agent.start(wait_s=10.0)
                if name == "collaborative":
                    threshold = agent.calibrate(splits.calibration_images)
            results = stream(agents, images, functools.partial(report, f"stream {name}"))
        finally:
            for agent in agents:
                agent.close()
        modes.append(summarize(name, results, labels))
        outputs[name] = np.concatenate([r.output for r in results])
    return modes, outputs, threshold


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[MqttSettings]:
    if url is not None:
        yield MqttSettings.from_url(url)
        return
    with EmbeddedBroker() as broker:
        # amqtt speaks MQTT 3.1.1 only: say so rather than probe for 5.
        yield MqttSettings.from_url(broker.url, protocol="3.1.1")
