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
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shared import TlsSettings, TracingSettings

if TYPE_CHECKING:
    from ..repository._cdn_pull import ModelPuller
    from ._spec import PlaneSpec

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MQTT_CLIENTS",
    "HubServeSettings",
    "check_options",
    "default_workers",
    "ensure_repo",
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
    legacy_topics: bool = False  # also take requests on <prefix>/infer/<model>
    http_port: int = 8000  # 0: no HTTP API
    http_host: str = "127.0.0.1"
    grpc_port: int = 0  # KServe v2 gRPC from the HTTP ingress processes; 0: none
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
    repo_poll_s: float = 2.0  # how often new versions in the repository are looked for
    cdn: str | None = None  # pull --models from this CDN into the repository
    models: tuple[str, ...] = ()  # NAME or NAME@VERSION
    trusted_keys: tuple[Path, ...] = ()  # the publisher's public keys
    cdn_token: str | None = None
    cdn_ca: Path | None = None
    cdn_poll_s: float = 30.0  # how often the CDN is asked for new versions
    log_level: str = "info"
    log_format: str = "text"
    restart_max_s: float = 30.0  # the longest wait before a crashed process is restarted
    otlp_endpoint: str | None = None  # spans to this OTLP/HTTP receiver; None: OTEL_* env decide

    def problem(self) -> tuple[str, str] | None:
        """The first command-line mistake in these settings (``check_options``), or None."""
        return check_options(
            log_level=self.log_level,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            log_format=self.log_format,
            workers=self.workers,
            no_share=self.no_share,
            http_workers=self.http_workers,
            mqtt_client=self.mqtt_client,
            device=self.device,
            max_inflight_mib=self.max_inflight_mib,
            cdn=self.cdn,
            models=self.models,
            trusted_keys=self.trusted_keys,
            otlp_endpoint=self.otlp_endpoint,
        )


def check_options(
    *,
    log_level: str,
    http_port: int,
    log_format: str,
    grpc_port: int = 0,
    workers: int,
    no_share: bool,
    http_workers: int = 1,
    mqtt_client: str = "auto",
    device: str | None = None,
    max_inflight_mib: int = 256,
    cdn: str | None = None,
    models: tuple[str, ...] = (),
    trusted_keys: tuple[Path, ...] = (),
    otlp_endpoint: str | None = None,
) -> tuple[str, str] | None:
    """The first command-line mistake as ``(option, what to do)``, or None."""
    if otlp_endpoint is not None:
        try:
            TracingSettings(endpoint=otlp_endpoint)
        except ValueError:
            return "--otlp-endpoint", "use the receiver's http(s):// URL, e.g. http://otel:4318"
    problem = _check_cdn(cdn, models, trusted_keys)
    if problem is not None:
        return problem
    if log_level.lower() not in LOG_LEVELS:
        return "--log-level", f"use one of {', '.join(LOG_LEVELS)}"
    if not 0 <= http_port <= 65535:
        return "--http-port", "use a port from 1 to 65535, or 0 for none"
    if not 0 <= grpc_port <= 65535:
        return "--grpc-port", "use a port from 1 to 65535 (Triton's is 8001), or 0 for none"
    if grpc_port and not http_port:
        return "--grpc-port", "gRPC is served by the HTTP ingress processes: give --http-port too"
    if grpc_port and grpc_port == http_port:
        return "--grpc-port", "use a port other than --http-port's"
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


def ensure_repo(repo: Path, cdn: str | None) -> tuple[str, str] | None:
    """The ``--repo`` problem as ``(option, what to do)``, or None once it is a directory.

    A hub pulling from a CDN fills its repository, so a missing one is created
    (with its parents); without ``--cdn`` a missing repository is a mistake.
    """
    if repo.is_dir():
        return None
    if repo.exists():
        return "--repo", f"{repo} is not a directory"
    if cdn is None:
        return "--repo", f"{repo} does not exist (create it, or give --cdn to pull models into it)"
    try:
        repo.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return "--repo", f"cannot create {repo}: {e.strerror or e}"
    return None


def _check_cdn(
    cdn: str | None, models: tuple[str, ...], trusted_keys: tuple[Path, ...]
) -> tuple[str, str] | None:
    from ..repository._cdn_pull import parse_model_ref

    if cdn is None:
        return ("--model", "--model needs --cdn to pull from") if models else None
    if not cdn.startswith(("http://", "https://")):
        return "--cdn", "use the CDN's http:// or https:// URL"
    if not models:
        return "--model", "name the models to pull from --cdn (NAME or NAME@VERSION)"
    if not trusted_keys:
        return "--trusted-key", "pulling from a CDN needs the publisher's public key"
    for model in models:
        try:
            parse_model_ref(model)
        except ValueError as e:
            return "--model", str(e)
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
    from shared import MqttSettings, configure_logging

    from ._supervisor import HubSupervisor

    s = settings
    configure_logging(s.log_level.lower(), json=s.log_format.lower() == "json")
    MqttSettings.from_url(s.broker).with_tls(  # a bad URL is this command's error, not a child's
        ca_certs=s.mqtt_ca, certfile=s.mqtt_cert, keyfile=s.mqtt_key
    )
    puller = _first_pull(s) if s.cdn else None
    supervisor = HubSupervisor(
        plan(s),
        mqtt_workers=s.workers,
        http_workers=s.http_workers if s.http_port else 0,
        repo_poll_s=s.repo_poll_s,
        device=s.device,
        fetch=None if puller is None else lambda m, v: puller.pull_version(m, int(v)),
    )
    stop = threading.Event()
    if puller is not None:  # new versions land in the repository; its watch swaps them in
        threading.Thread(
            target=_keep_pulling, args=(puller, s.cdn_poll_s, stop), name="hub-pull", daemon=True
        ).start()
    try:
        supervisor.run_forever()
    finally:
        stop.set()


def _first_pull(s: HubServeSettings) -> ModelPuller:
    """Pull every model once; a model with no version to serve stops the command."""
    from shared import PublicKey

    from .._errors import RepositoryError
    from ..repository._cdn_pull import ModelPuller, parse_model_ref

    assert s.cdn is not None
    puller = ModelPuller(
        s.cdn,
        s.repo,
        [parse_model_ref(m) for m in s.models],
        [PublicKey.load(k) for k in s.trusted_keys],
        read_token=s.cdn_token,
        tls=TlsSettings.from_files(ca_certs=s.cdn_ca),
        packages=True,  # language model packages: served by the language executors
    )
    puller.pull()
    missing = [m.name for m in puller.models if not puller.have(m.name)]
    if missing:
        raise RepositoryError(
            f"no version of {', '.join(missing)} could be pulled from {s.cdn} (see the log)"
        )
    return puller


def _keep_pulling(puller: ModelPuller, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        puller.pull()


def plan(s: HubServeSettings) -> PlaneSpec:
    """The processes ``serve`` runs for ``s`` (reads each model's config, loads nothing)."""
    from ._spec import PlaneSpec, plan_executors, plan_language_executors

    hub_id = uuid.uuid4().hex[:8]

    def text(path: Path | None) -> str | None:
        return None if path is None else str(path)

    return PlaneSpec(
        hub_id=hub_id,
        repo=str(s.repo),
        metrics_dir="",  # the supervisor makes it
        executors=plan_executors(s.repo, hub_id, device=s.device),
        language=plan_language_executors(s.repo, hub_id),
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
        grpc_port=s.grpc_port,
        api_keys=text(s.api_keys),
        redis_url=s.redis_url,
        tls_cert=text(s.tls_cert),
        tls_key=text(s.tls_key),
        tls_client_ca=text(s.tls_client_ca),
        max_inflight_bytes=s.max_inflight_mib * MiB // max(1, s.http_workers),
        log_level=s.log_level.lower(),
        log_format=s.log_format.lower(),
        restart_max_s=s.restart_max_s,
        otlp_endpoint=s.otlp_endpoint,
    )
