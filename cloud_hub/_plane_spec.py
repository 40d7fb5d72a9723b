"""What every process of a multi-process hub must know, decided once by the supervisor.

``PlaneSpec`` is plain data (JSON): the repository, which executor serves
which model instance on which device and where it listens, the ingress
settings (broker, topics, HTTP), the metrics directory, and the supervisor's
PID. The supervisor plans it (``plan_executors`` reads each model's
``config.json`` and expands its ``instance_group``) and hands it to each child
in an environment variable, so broker credentials never appear in ``ps``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._config import InstanceGroup
from ._executor_pool import Route
from ._link import DEFAULT_RING_BYTES, executor_address
from ._repository import model_configs, served_version

__all__ = ["ENV", "ExecutorSpec", "PlaneSpec", "gpu_count", "plan_executors", "routes_of"]

ENV = "TANDEM_HUB_PLANE"


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec:
    """One executor process: a model instance on a device, listening at ``address``."""

    model: str
    version: str
    instance: int
    device: str | None  # cpu, cuda:N, or None (a GPU when there is one)
    address: str


@dataclass(frozen=True, kw_only=True)
class PlaneSpec:
    hub_id: str
    repo: str
    metrics_dir: str
    routes_file: str = ""  # where the supervisor keeps the routes once it runs
    executors: tuple[ExecutorSpec, ...]
    broker: str | None = None  # the URL as given, credentials included
    share_group: str | None = "hubs"
    prefix: str = "tandem/v1"
    legacy_topics: bool = True  # also take requests on <prefix>/infer/<model>
    mqtt_ca: str | None = None
    mqtt_cert: str | None = None
    mqtt_key: str | None = None
    mqtt_client: str = "auto"  # auto | crt | paho
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: no HTTP ingress
    api_keys: str | None = None
    redis_url: str | None = None  # API keys' rate limits shared by every process and replica
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    ring_bytes: int = DEFAULT_RING_BYTES
    max_json_bytes: int = 16 * 1024 * 1024
    max_inflight_bytes: int = 256 * 1024 * 1024  # per HTTP ingress process
    log_level: str = "info"
    log_format: str = "text"
    parent_pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def routes(self) -> dict[str, Route]:
        """Model -> the version served and its instances' addresses (what an ingress uses)."""
        return routes_of(self.executors)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        for spec in data["executors"]:
            spec["address"] = spec["address"].encode("unicode_escape").decode()
        return json.dumps(data)

    @classmethod
    def from_json(cls, raw: str) -> PlaneSpec:
        data = json.loads(raw)
        executors = []
        for spec in data.pop("executors"):
            spec["address"] = spec["address"].encode().decode("unicode_escape")
            executors.append(ExecutorSpec(**spec))
        return cls(executors=tuple(executors), **data)


def routes_of(executors: Iterable[ExecutorSpec]) -> dict[str, Route]:
    """The routes that ``executors`` serve (one version per model: the last one listed)."""
    versions: dict[str, str] = {}
    for spec in executors:
        versions[spec.model] = spec.version
    out: dict[str, Route] = {}
    for model, version in versions.items():
        addresses = tuple(e.address for e in executors if e.model == model and e.version == version)
        out[model] = Route(version, addresses)
    return out


def gpu_count() -> int:
    """GPUs this machine shows (``nvidia-smi -L``), without importing a GPU library."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def plan_executors(
    repo: str | Path, hub_id: str, *, device: str | None = None, gpus: int | None = None
) -> tuple[ExecutorSpec, ...]:
    """One ``ExecutorSpec`` per model instance: ``instance_group`` expanded on this machine.

    ``device`` (``cpu``, ``cuda:N``) overrides every model's groups with one
    instance there, as ``tandem hub --device`` does.
    """
    count = gpu_count() if gpus is None else gpus
    specs: list[ExecutorSpec] = []
    for name, config in model_configs(repo).items():
        version = str(served_version(Path(repo) / name, config))
        if device is not None:
            devices: list[str | None] = [device]
        else:
            groups = config.instance_group or (InstanceGroup(),)
            devices = [d for g in groups for d in g.devices(count)]
            if not config.instance_group and count == 0:
                devices = [None]  # nothing configured: let the executor pick
        for instance, where in enumerate(devices):
            specs.append(
                ExecutorSpec(
                    model=name,
                    version=version,
                    instance=instance,
                    device=where,
                    address=executor_address(hub_id, name, version, instance),
                )
            )
    return tuple(specs)
