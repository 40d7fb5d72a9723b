"""The learning loop's system on one machine: a CDN with rollouts, a collecting hub, a fleet.

``LearningFleet`` (a context manager) starts, in this process, what the
loop runs on, each part the real one:

- a model CDN: SQLite registry, local blob store, the HTTP API with its admin
  routes (token in ``admin_token``) and the rollout service (``FleetService``:
  the fleet link and the controller that signs assignments), on a loopback
  port; the edge model's first version published through the publish pipeline;
- a hub serving the cloud model from a copy of the demo's repository whose
  ``config.json`` collects examples into ``examples`` (a local store);
- ``devices`` devices, each an ``EdgeAgent`` on the version its
  ``ModelUpdater`` installed from the CDN (and which it follows: rollouts
  reach it over MQTT), a ``TelemetryReporter`` heartbeat (what the rollout
  gates judge) and an offload budget calibrated on held-out digits.

Devices share their answers (``ExampleSharing``) only while ``sharing`` is
on, so what the loop judges the models on never becomes training data.
Leaving the context stops everything, devices first.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_hub import Hub
from edge_agent import EdgeAgent, ExampleSharing, ModelUpdater, OffloadPolicy, TelemetryReporter
from shared import MqttSettings, SigningKey, Topics, UpdateState

from .._errors import DeliveryError
from ..data import DigitSplits
from ..models import QUANTIZATION, DemoModels

__all__ = ["EDGE", "HUB_MODEL", "FleetSettings", "LearningFleet"]

EDGE = "mnist-edge"
HUB_MODEL = "mnist"
_ADMIN = "learning-loop"  # the CDN's admin token: loopback only, for this run


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    devices: int = 8
    budget: float = 0.2
    score: str = "margin"
    sample_rate: float = 0.05  # share of offloads a device marks sampled when it shares
    deadline_ms: float = 500.0
    heartbeat_s: float = 0.5
    topic_prefix: str = "tandem/learn"
    keep_inputs: bool = True
    share_group: str | None = None  # the hub's shared subscription (None: amqtt has none)


@dataclass
class _Device:
    agent: EdgeAgent
    updater: ModelUpdater
    reporter: TelemetryReporter


@dataclass
class LearningFleet:
    """See the module docstring; build with ``start``."""

    settings: FleetSettings
    workdir: Path
    mqtt: MqttSettings
    key: SigningKey = field(default_factory=SigningKey.generate)
    admin_token: str = _ADMIN
    cdn_url: str = ""
    examples: Path = field(init=False)
    devices: list[_Device] = field(default_factory=list)
    hub: Hub | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __post_init__(self) -> None:
        self.examples = self.workdir / "examples"
        self.topics = Topics(self.settings.topic_prefix)

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def running(
        cls,
        settings: FleetSettings,
        models: DemoModels,
        splits: DigitSplits,
        mqtt: MqttSettings,
        progress: Callable[[str, float], None],
    ) -> Iterator[LearningFleet]:
        with tempfile.TemporaryDirectory(prefix="tandem-learn-") as tmp:
            fleet = cls(settings, Path(tmp), mqtt)
            with fleet._stack:
                fleet._start_cdn(models, splits, progress)
                fleet._start_hub(models)
                fleet._start_devices(splits, progress)
                yield fleet

    def _start_cdn(
        self, models: DemoModels, splits: DigitSplits, progress: Callable[[str, float], None]
    ) -> None:
        from cloud_hub.http import HttpServer
        from model_cdn import FleetService, LocalBlobStore, create_app, open_registry, publish_model
        from model_cdn.publish import LocalTarget

        progress("publish v1 to the CDN", 0.0)
        registry = open_registry(f"sqlite:///{self.workdir / 'registry.db'}")
        self._stack.callback(registry.close)
        store = LocalBlobStore(self.workdir / "blobs")
        publish_model(
            models.edge_float_onnx,
            name=EDGE,
            target=LocalTarget(registry, store),
            signing_key=self.key,
            quantize=QUANTIZATION,
            calibration=splits.calibration_images,
            validation=(splits.test_images, splits.test_labels),
        )
        service = FleetService(
            registry, self.key, self.mqtt, self.topics, leader_lease_s=None, tick_s=0.2
        ).start()
        self._stack.callback(service.stop)
        app = create_app(
            registry=registry,
            store=store,
            admin_token=self.admin_token,
            controller=service.controller,
        )
        server = HttpServer(app, port=0)
        server.start()
        self._stack.callback(server.stop)
        self.cdn_url = server.url
        self._registry, self._store = registry, store
        progress("publish v1 to the CDN", 1.0)

    def _start_hub(self, models: DemoModels) -> None:
        repo = self.workdir / "hub"
        shutil.copytree(models.hub_repository, repo)
        config_path = repo / HUB_MODEL / "config.json"
        config = json.loads(config_path.read_text())
        config["collection"] = {
            "store": str(self.examples),
            "keep_inputs": self.settings.keep_inputs,
            "shard_rows": 256,
            "flush_s": 5.0,
            "max_per_device": 5000,
        }
        config_path.write_text(json.dumps(config, indent=2))
        self.hub = Hub(
            repo, mqtt=self.mqtt, topics=self.topics, share_group=self.settings.share_group
        ).start()
        self._stack.callback(self.hub.stop)

    def _start_devices(self, splits: DigitSplits, progress: Callable[[str, float], None]) -> None:
        from model_cdn import make_assignment

        s = self.settings
        progress("devices install v1", 0.0)
        for i in range(s.devices):
            device = f"learn-{i:03d}"
            store_dir = self.workdir / "devices" / device
            self._registry.put_assignment(
                device,
                EDGE,
                make_assignment(self.key, device=device, model=EDGE, version=1, ttl_days=1),
            )
            agent = EdgeAgent(
                None,
                device_id=device,
                broker=self.mqtt,
                cloud_model=HUB_MODEL,
                policy=OffloadPolicy.budget(s.budget, score=s.score),
                topics=self.topics,
                default_deadline_ms=s.deadline_ms,
                labels={"site": "demo"},
            )
            self._stack.callback(agent.close)
            updater = ModelUpdater(
                agent,
                model=EDGE,
                device_id=device,
                cdn_url=self.cdn_url,
                trusted_keys=[self.key.public_key],
                store_dir=store_dir,
                mqtt=self.mqtt,
                topics=self.topics,
            )
            status = updater.check_now()
            if status is None or status.state is not UpdateState.INSTALLED:
                raise DeliveryError(f"{device} did not install {EDGE}@1: {status}")
            agent.start(wait_s=10.0)
            agent.calibrate(splits.calibration_images)
            updater.start()
            self._stack.callback(updater.stop)
            reporter = TelemetryReporter(agent, interval_s=s.heartbeat_s).start()
            self._stack.callback(reporter.stop)
            self.devices.append(_Device(agent, updater, reporter))
            progress("devices install v1", (i + 1) / s.devices)

    # -- what the loop does ---------------------------------------------------------------

    @property
    def agents(self) -> list[EdgeAgent]:
        return [d.agent for d in self.devices]

    def sharing(self, on: bool) -> None:
        """Devices share their answers (the hub collects) only while this is on."""
        for i, agent in enumerate(self.agents):
            agent.share_answers = (
                ExampleSharing(sample_rate=self.settings.sample_rate, seed=i) if on else None
            )

    def flush_examples(self) -> None:
        """Write what the hub still buffers (the loop reads the shards next)."""
        assert self.hub is not None and self.hub.collector is not None
        self.hub.collector.flush()

    def admin(self) -> Any:
        from model_cdn import AdminClient

        return AdminClient(self.cdn_url, token=self.admin_token, timeout_s=60)

    def published_model(self, version: int) -> bytes:
        """The model devices install for ``version``: its blob in the CDN's store, unpacked."""
        from shared import ModelManifest, decompress_blob

        record = self._registry.get_version(EDGE, version)
        blob = ModelManifest.from_dict(record.manifest["signed"]).blob
        return decompress_blob(self._store.get(blob.digest), blob.raw_size)

    def versions(self) -> list[str]:
        """The edge model each device serves now (``name@version``)."""
        return [
            "none" if a.runtime is None else f"{a.runtime.name}@{a.runtime.version}"
            for a in self.agents
        ]
