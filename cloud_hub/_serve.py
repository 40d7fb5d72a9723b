"""What running a hub as a command does: ``tandem hub`` and ``python -m cloud_hub`` call ``serve``.

``check_options`` is the pure check both command lines make first (it names
the option at fault); ``serve`` configures logging, plans the hub's processes
(``PlaneSpec``: one executor per model instance, from each model's
``instance_group``) and runs them under a ``HubSupervisor`` until SIGINT or
SIGTERM, which drain it: the ingress processes stop taking requests and
answer those in flight, then the executors answer what they still queue.

``https_settings`` turns the ``--tls-*`` files into the HTTP API's TLS
settings, or raises ``shared.ConfigError`` (a ``ValueError``) when they
cannot work. ``serve`` raises ``shared.TandemError`` (a bad broker URL or
repository, a process that cannot start).
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shared import TlsSettings

if TYPE_CHECKING:
    from ._plane_spec import PlaneSpec

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MQTT_CLIENTS",
    "HubServeSettings",
    "check_options",
    "default_workers",
    "https_settings",
    "serve",
]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
MQTT_CLIENTS = ("auto", "crt", "paho")
MiB = 1024 * 1024


def default_workers() -> int:
    """MQTT ingress processes by default: one per core this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


@dataclass(frozen=True, kw_only=True)
class HubServeSettings:
    """One hub command's settings, as typed (paths, URLs); see ``tandem hub --help``."""

    repo: Path
    broker: str = "mqtt://127.0.0.1:1883"  # credentials included
    share_group: str = "hubs"
    no_share: bool = False  # subscribe plainly (one hub, or brokers without $share)
    prefix: str = "tandem/v1"
    legacy_topics: bool = True  # also take requests on <prefix>/infer/<model>
    http_port: int = 8000  # 0: no HTTP API
    http_host: str = "127.0.0.1"
    api_keys: Path | None = None
    redis_url: str | None = None  # API keys' rate limits shared across processes and replicas
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    mqtt_ca: Path | None = None
    mqtt_cert: Path | None = None
    mqtt_key: Path | None = None
    mqtt_client: str = "auto"
    device: str | None = None  # every model on this device (cpu, cuda, cuda:N)
    workers: int = field(default_factory=default_workers)  # MQTT ingress processes
    http_workers: int = 1  # HTTP ingress processes
    max_inflight_mib: int = 256  # request bodies held by the HTTP API at once, in all
    log_level: str = "info"
    log_format: str = "text"


def check_options(
    *,
    log_level: str,
    http_port: int,
    log_format: str,
    workers: int,
    no_share: bool,
    http_workers: int = 1,
    mqtt_client: str = "auto",
    device: str | None = None,
    max_inflight_mib: int = 256,
) -> tuple[str, str] | None:
    """The first command-line mistake as ``(option, what to do)``, or None."""
    if log_level.lower() not in LOG_LEVELS:
        return "--log-level", f"use one of {', '.join(LOG_LEVELS)}"
    if not 0 <= http_port <= 65535:
        return "--http-port", "use a port from 1 to 65535, or 0 for none"
    if log_format.lower() not in LOG_FORMATS:
        return "--log-format", "use text or json"
    if workers < 1:
        return "--workers", "use 1 or more"
    if http_workers < 1:
        return "--http-workers", "use 1 or more (--http-port 0 turns HTTP off)"
    if workers > 1 and no_share:
        return (
            "--workers",
            "several workers need a shared subscription to split the requests; drop --no-share",
        )
    if mqtt_client not in MQTT_CLIENTS:
        return "--mqtt-client", f"use one of {', '.join(MQTT_CLIENTS)}"
    if device is not None and not (
        device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdecimal())
    ):
        return "--device", "use cpu, cuda or cuda:N"
    if max_inflight_mib < 64:
        return "--max-inflight-mib", "use 64 or more (one request body may take 64 MiB)"
    return None


def https_settings(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> TlsSettings | None:
    """The HTTP API's TLS from the ``--tls-*`` files; ``ConfigError`` when they cannot work."""
    if client_ca is not None and cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
    return TlsSettings.from_files(ca_certs=client_ca, certfile=cert, keyfile=key)


def serve(settings: HubServeSettings) -> None:
    """Run the hub's processes until SIGINT or SIGTERM, then drain them."""
    from shared import MqttSettings
    from shared._logging import configure_logging

    from ._supervisor import HubSupervisor

    s = settings
    configure_logging(s.log_level.lower(), json=s.log_format.lower() == "json", stream=sys.stderr)
    MqttSettings.from_url(s.broker).with_tls(  # a bad URL is this command's error, not a child's
        ca_certs=s.mqtt_ca, certfile=s.mqtt_cert, keyfile=s.mqtt_key
    )
    supervisor = HubSupervisor(
        plan(s), mqtt_workers=s.workers, http_workers=s.http_workers if s.http_port else 0
    )
    supervisor.run_forever()


def plan(s: HubServeSettings) -> PlaneSpec:
    """The processes ``serve`` runs for ``s`` (reads each model's config, loads nothing)."""
    from ._plane_spec import PlaneSpec, plan_executors

    hub_id = uuid.uuid4().hex[:8]

    def text(path: Path | None) -> str | None:
        return None if path is None else str(path)

    return PlaneSpec(
        hub_id=hub_id,
        repo=str(s.repo),
        metrics_dir="",  # the supervisor makes it
        executors=plan_executors(s.repo, hub_id, device=s.device),
        broker=s.broker,
        share_group=None if s.no_share else s.share_group,
        prefix=s.prefix,
        legacy_topics=s.legacy_topics,
        mqtt_ca=text(s.mqtt_ca),
        mqtt_cert=text(s.mqtt_cert),
        mqtt_key=text(s.mqtt_key),
        mqtt_client=s.mqtt_client,
        http_host=s.http_host,
        http_port=s.http_port,
        api_keys=text(s.api_keys),
        redis_url=s.redis_url,
        tls_cert=text(s.tls_cert),
        tls_key=text(s.tls_key),
        tls_client_ca=text(s.tls_client_ca),
        max_inflight_bytes=s.max_inflight_mib * MiB // max(1, s.http_workers),
        log_level=s.log_level.lower(),
        log_format=s.log_format.lower(),
    )
