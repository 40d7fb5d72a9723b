"""``tandem hub``: serve a model repository over MQTT and HTTP (``cloud_hub``'s ``serve``).

The options are checked here, then ``cloud_hub.plane._launch.serve`` runs the hub;
this module loads only when ``tandem hub`` is asked for, and torch only when
a model needs it. ``python -m cloud_hub`` is the same command without typer,
for machines that install the hub alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from cloud_hub.plane import (  # light: the hub's heavy parts load when it serves
    LOG_LEVELS,
    MQTT_CLIENTS,
    HubServeSettings,
    default_workers,
    ensure_repo,
)

from ._common import MqttCaOption, MqttCertOption, MqttKeyOption, TlsClientCaOption, TlsKeyOption

__all__ = ["hub"]


RepoOption = Annotated[
    Path,
    typer.Option(
        "--repo",
        "-r",
        help="Model repository: <repo>/<model>/<version>/model.onnx (or model.pt), "
        "plus an optional <repo>/<model>/config.json. Created when missing with --cdn.",
        resolve_path=True,
        show_default=False,
    ),
]
BrokerOption = Annotated[
    str,
    typer.Option(help="MQTT broker URL: mqtt://[user[:pass]@]host[:port]; mqtts:// turns on TLS."),
]
ShareGroupOption = Annotated[
    str,
    typer.Option(
        help="Shared-subscription group: hub replicas in the same group split the "
        "requests, each answered once."
    ),
]
NoShareOption = Annotated[
    bool,
    typer.Option(
        "--no-share",
        help="Subscribe without a shared subscription (one hub only, or brokers "
        "without $share such as the embedded amqtt).",
    ),
]
PrefixOption = Annotated[str, typer.Option(help="Topic prefix; must match the devices' prefix.")]
HttpPortOption = Annotated[
    int,
    typer.Option(
        help="Port of the HTTP API (Open Inference Protocol v2, as Triton and KServe "
        "speak it, plus /metrics for Prometheus); 0 turns it off.",
    ),
]
GrpcPortOption = Annotated[
    int,
    typer.Option(
        help="Port of the KServe v2 gRPC API (Triton's GRPCInferenceService: tritonclient.grpc "
        "works unchanged; Triton's own port is 8001), served by every HTTP ingress process on "
        "--http-host with the same API keys, rate and size limits and TLS; 0 turns it off.",
    ),
]
HttpHostOption = Annotated[
    str,
    typer.Option(
        help="Address the HTTP API listens on; 0.0.0.0 for every interface. Without "
        "--api-keys it has no authentication: expose it behind a proxy that adds it."
    ),
]
ApiKeysOption = Annotated[
    Path | None,
    typer.Option(
        "--api-keys",
        help="API key file ('tandem keys create'): /v2 model routes then need a key "
        "with scope infer (or models:read for metadata), within its rate. Health "
        "probes and /metrics stay open. Re-read when it changes.",
        dir_okay=False,
        show_default=False,
    ),
]
HubTlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        help="PEM certificate (chain) of the HTTP API: it then serves HTTPS. Needs --tls-key.",
        show_default=False,
    ),
]
LogLevelOption = Annotated[str, typer.Option(help=f"Logging level: {', '.join(LOG_LEVELS)}.")]
LogFormatOption = Annotated[
    str,
    typer.Option(help="Log lines as 'text' or 'json' (one object a line, with request ids)."),
]
WorkersOption = Annotated[
    int,
    typer.Option(
        help="MQTT ingress processes (default: one per core; one with --no-share), all in "
        "the --share-group. "
        "They decode and answer requests and pass tensors through shared memory to one "
        "executor process per model instance, which batches them all in one queue: more "
        "workers add throughput without splitting batches or loading the models twice.",
        show_default=False,
    ),
]
HttpWorkersOption = Annotated[
    int,
    typer.Option(
        help="HTTP ingress processes sharing --http-port (the kernel spreads connections). "
        "They are separate from the MQTT ones, so an HTTP flood cannot starve devices."
    ),
]
DeviceOption = Annotated[
    str | None,
    typer.Option(
        help="Where every model runs: cpu, cuda or cuda:N. Default: each model's "
        "config.json instance_group, else a GPU when there is one.",
        show_default=False,
    ),
]
MqttClientOption = Annotated[
    str,
    typer.Option(
        help=f"MQTT client of the ingress processes: {', '.join(MQTT_CLIENTS)}. auto uses "
        "awscrt's C client on MQTT 5 brokers (half the CPU per message of paho) and paho "
        "on MQTT 3.1.1 ones."
    ),
]
LegacyTopicsOption = Annotated[
    bool,
    typer.Option(
        "--legacy-topics/--no-legacy-topics",
        help="Also take requests on <prefix>/infer/<model> (devices of the first release), "
        "answered where the request says, so a device can redirect replies to another: "
        "only while migrating (a warning is logged). Devices now publish on their own "
        "<prefix>/dev/<device>/infer/<model> and are answered on their own reply topic.",
    ),
]
CdnOption = Annotated[
    str | None,
    typer.Option(
        "--cdn",
        help="Pull the --model(s) from this model CDN (https://cdn.example) into --repo: "
        "signed manifests verified against --trusted-key, digests checked, as a device "
        "does; new versions are swapped in as they appear (--cdn-poll-s).",
        show_default=False,
    ),
]
PullModelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="A model to pull from --cdn: NAME follows the latest version, NAME@VERSION "
        "pins one. Repeat for several.",
        show_default=False,
    ),
]
TrustedKeyOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--trusted-key",
        help="Publisher public key (tandem keys generate) whose signature a pulled "
        "manifest must carry. Repeat for several.",
        exists=True,
        dir_okay=False,
        show_default=False,
    ),
]
CdnTokenOption = Annotated[
    str | None,
    typer.Option(
        "--cdn-token",
        envvar="TANDEM_CDN_READ_TOKEN",
        help="The CDN's read token, when it needs one.",
        show_default=False,
    ),
]
CdnCaOption = Annotated[
    Path | None,
    typer.Option("--cdn-ca", help="PEM CA of an https:// CDN.", show_default=False),
]
CdnPollOption = Annotated[
    float, typer.Option("--cdn-poll-s", help="How often to ask --cdn for new versions.")
]
RepoPollOption = Annotated[
    float,
    typer.Option(
        "--repo-poll-s",
        help="How often to look for new model versions in --repo; a new one is loaded and "
        "warmed up, then swapped in without dropping requests (one that fails to load "
        "leaves the old one serving). 0: never.",
    ),
]
RedisOption = Annotated[
    str | None,
    typer.Option(
        "--redis",
        envvar="TANDEM_REDIS_URL",
        help="Redis URL (redis://host:6379/0): an API key's rate limit then holds across "
        "every HTTP process and hub replica; without it each process counts its own.",
        show_default=False,
    ),
]
MaxInflightOption = Annotated[
    int,
    typer.Option(
        "--max-inflight-mib",
        help="HTTP request bodies the hub holds at once, in MiB; past it requests get 503 "
        "(overloaded) at once instead of growing the hub's memory.",
    ),
]
RestartMaxOption = Annotated[
    float,
    typer.Option(
        "--restart-max-s",
        min=0.5,
        help="The longest wait before a crashed hub process is started again: the wait "
        "doubles from 0.5 s while the same process keeps dying within 30 s of its start.",
    ),
]

OtlpEndpointOption = Annotated[
    str | None,
    typer.Option(
        "--otlp-endpoint",
        help="Send OpenTelemetry spans of every answered request to this OTLP/HTTP receiver "
        "(a Collector, Jaeger, Tempo: http://host:4318). Without it the standard "
        "OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_TRACES_EXPORTER variables decide (docs/tracing.md).",
        show_default=False,
    ),
]


def hub(
    repo: RepoOption,
    broker: BrokerOption = "mqtt://127.0.0.1:1883",
    share_group: ShareGroupOption = "hubs",
    no_share: NoShareOption = False,
    prefix: PrefixOption = "tandem/v1",
    http_port: HttpPortOption = 8000,
    http_host: HttpHostOption = "127.0.0.1",
    grpc_port: GrpcPortOption = 0,
    api_keys: ApiKeysOption = None,
    tls_cert: HubTlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
    workers: WorkersOption = 0,
    http_workers: HttpWorkersOption = 1,
    device: DeviceOption = None,
    mqtt_client: MqttClientOption = "auto",
    legacy_topics: LegacyTopicsOption = False,
    max_inflight_mib: MaxInflightOption = 256,
    redis: RedisOption = None,
    repo_poll_s: RepoPollOption = 2.0,
    cdn: CdnOption = None,
    model: PullModelOption = None,
    trusted_key: TrustedKeyOption = None,
    cdn_token: CdnTokenOption = None,
    cdn_ca: CdnCaOption = None,
    cdn_poll_s: CdnPollOption = 30.0,
    restart_max_s: RestartMaxOption = 30.0,
    otlp_endpoint: OtlpEndpointOption = None,
) -> None:
    """Serve a model repository to edge devices over MQTT, batching on the GPU when present.

    Devices publish requests on <prefix>/dev/<device>/infer/<model>; the hub
    batches them per model and answers on the device's reply topic. The same
    models answer over HTTP on --http-port (POST /v2/models/<model>/infer, any
    KServe v2 / Triton client), batched together with the MQTT requests; GET
    /metrics (the whole hub) is for Prometheus. --grpc-port adds the KServe v2
    gRPC API (tritonclient.grpc) on the same processes.

    The hub runs as processes: --workers MQTT and --http-workers HTTP ingress
    processes in front of one executor process per model instance (config.json's
    instance_group), which holds the model's batching queue; a process that dies
    is restarted. Run several hubs with the same --share-group to scale across
    machines. Stop with Ctrl-C or SIGTERM: the hub stops taking requests,
    answers those in flight, and answers what is still queued "overloaded" so
    devices fall back at once.

    --tls-cert and --tls-key make the HTTP API HTTPS (--tls-client-ca: mutual
    TLS); --mqtt-ca, --mqtt-cert and --mqtt-key are for an mqtts:// broker.

    Example: tandem hub --repo ./models --broker mqtt://broker:1883 --http-port 8000
    """
    settings = _serve_settings(dict(locals()))  # first: locals() are the options only
    from cloud_hub.plane import serve
    from shared import TandemError

    try:
        serve(settings)
    except TandemError as e:
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(1) from e


# The options whose names differ from HubServeSettings' fields.
_RENAMED = {"redis": "redis_url", "model": "models", "trusted_key": "trusted_keys"}


def _serve_settings(options: dict[str, Any]) -> HubServeSettings:
    """``tandem hub``'s options as settings; a mistake in them exits 2 with one line."""
    fields = {_RENAMED.get(name, name): value for name, value in options.items()}
    fields["workers"] = fields["workers"] or (1 if fields["no_share"] else default_workers())
    fields["models"] = tuple(fields["models"] or ())
    fields["trusted_keys"] = tuple(fields["trusted_keys"] or ())
    fields["repo_poll_s"] = max(0.0, fields["repo_poll_s"])
    fields["cdn_poll_s"] = max(1.0, fields["cdn_poll_s"])
    if not fields["http_port"]:
        fields["api_keys"] = None  # no HTTP API: no keys to check
    settings = HubServeSettings(**fields)
    problem = settings.problem() or ensure_repo(settings.repo, settings.cdn)
    if problem is not None:
        raise typer.BadParameter(problem[1], param_hint=problem[0])
    _check_security(
        settings.api_keys,
        (settings.tls_cert, settings.tls_key, settings.tls_client_ca),
        (settings.mqtt_ca, settings.mqtt_cert, settings.mqtt_key),
    )
    if settings.api_keys is not None:
        return replace(settings, api_keys=settings.api_keys.resolve())
    return settings


def _check_security(
    api_keys: Path | None, https: tuple[Path | None, ...], mqtts: tuple[Path | None, ...]
) -> None:
    """The API key file and TLS files must work; a mistake in them exits 2 (one line)."""
    from cloud_hub.plane import https_settings
    from shared import TandemError, TlsSettings
    from shared.server import ApiKeyGuard

    try:  # a command-line mistake: one line and exit code 2, before anything starts
        https_settings(*https)
        TlsSettings.from_files(ca_certs=mqtts[0], certfile=mqtts[1], keyfile=mqtts[2])
    except ValueError as e:  # ConfigError is a ValueError
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(2) from e
    try:
        if api_keys is not None:
            ApiKeyGuard.from_file(api_keys)
    except TandemError as e:
        raise typer.BadParameter(str(e), param_hint="--api-keys") from e
