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
import logging
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..language import engine_missing, is_language_model_dir, read_language_config
from ..repository._config import InstanceGroup
from ..repository._repository import model_configs, served_version
from ._executor_pool import ServedVersion
from ._ipc import DEFAULT_RING_BYTES, executor_address
from ._llm_wire import language_address

log = logging.getLogger(__name__)

__all__ = [
    "ENV",
    "ExecutorSpec",
    "LanguageExecutorSpec",
    "PlaneSpec",
    "gpu_count",
    "plan_executors",
    "plan_language_executors",
    "served_versions_of",
]

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
class LanguageExecutorSpec:
    """One language executor process: a language model's engine, listening at ``address``."""

    model: str
    version: str
    instance: int
    address: str
    created: int = 0  # Unix time it was planned (OpenAI's ``created``)


@dataclass(frozen=True, kw_only=True)
class PlaneSpec:
    hub_id: str
    repo: str
    metrics_dir: str
    served_file: str = ""  # where the supervisor keeps the served versions once it runs
    control_dir: str = ""  # where ingress asks the supervisor to load or unload (_model_control)
    executors: tuple[ExecutorSpec, ...]
    language: tuple[LanguageExecutorSpec, ...] = ()
    broker: str | None = None  # the URL as given, credentials included
    share_group: str | None = "hubs"
    prefix: str = "tandem/v1"
    legacy_topics: bool = False  # also take requests on <prefix>/infer/<model>
    mqtt_ca: str | None = None
    mqtt_cert: str | None = None
    mqtt_key: str | None = None
    mqtt_client: str = "auto"  # auto | crt | paho
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: no HTTP ingress
    grpc_port: int = 0  # each HTTP ingress also serves KServe v2 gRPC here; 0: no gRPC
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
    restart_max_s: float = 30.0  # the longest wait before a crashed process is restarted
    parent_pid: int = 0
    otlp_endpoint: str | None = None  # where ingress spans go (None: the OTEL_* environment)
    extra: dict[str, Any] = field(default_factory=dict)

    def served_versions(self) -> dict[str, ServedVersion]:
        """Model -> the version served and its instances' addresses (what an ingress uses)."""
        return served_versions_of(self.executors)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        for spec in [*data["executors"], *data["language"]]:
            spec["address"] = spec["address"].encode("unicode_escape").decode()
        return json.dumps(data)

    @classmethod
    def from_json(cls, raw: str) -> PlaneSpec:
        data = json.loads(raw)
        executors = []
        for spec in data.pop("executors"):
            spec["address"] = spec["address"].encode().decode("unicode_escape")
            executors.append(ExecutorSpec(**spec))
        language = []
        for spec in data.pop("language", []):
            spec["address"] = spec["address"].encode().decode("unicode_escape")
            language.append(LanguageExecutorSpec(**spec))
        return cls(executors=tuple(executors), language=tuple(language), **data)


def served_versions_of(executors: Iterable[ExecutorSpec]) -> dict[str, ServedVersion]:
    """The served versions of ``executors`` (one version per model: the last one listed)."""
    versions: dict[str, str] = {}
    for spec in executors:
        versions[spec.model] = spec.version
    out: dict[str, ServedVersion] = {}
    for model, version in versions.items():
        addresses = tuple(e.address for e in executors if e.model == model and e.version == version)
        out[model] = ServedVersion(version, addresses)
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
    repo: str | Path,
    hub_id: str,
    *,
    device: str | None = None,
    gpus: int | None = None,
    pinned: Mapping[str, str] | None = None,
) -> tuple[ExecutorSpec, ...]:
    """One ``ExecutorSpec`` per model instance: ``instance_group`` expanded on this machine.

    ``device`` (``cpu``, ``cuda:N``) overrides every model's groups with one
    instance there, as ``tandem hub --device`` does. ``pinned`` (model -> version,
    an explicit load's) serves that version instead of the repository's choice,
    where its directory exists.
    """
    count = gpu_count() if gpus is None else gpus
    specs: list[ExecutorSpec] = []
    for name, config in model_configs(repo).items():
        pin = (pinned or {}).get(name)
        if pin is not None and (Path(repo) / name / pin).is_dir():
            version = pin
        else:
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


def plan_language_executors(repo: str | Path, hub_id: str) -> tuple[LanguageExecutorSpec, ...]:
    """One ``LanguageExecutorSpec`` per language model of ``repo`` (one engine per replica).

    A model whose engine cannot run on this machine (``engine_missing``) is left
    out, with one logged line saying what is missing; the others are planned.
    """
    specs = []
    for model_dir in sorted(p for p in Path(repo).iterdir() if p.is_dir()):
        if model_dir.name.startswith((".", "_")) or not is_language_model_dir(model_dir):
            continue
        config = read_language_config(model_dir)
        missing = engine_missing(config.engine)
        if missing is not None:
            log.error("language model %s is not served: %s", config.name, missing)
            continue
        specs.append(
            LanguageExecutorSpec(
                model=config.name,
                version=str(config.version),
                instance=0,
                address=language_address(hub_id, config.name, 0),
                created=int(time.time()),
            )
        )
    return tuple(specs)
