"""``tandem hub``: serve a model repository over MQTT and HTTP (``cloud_hub``'s ``serve``).

The options are checked here, then ``cloud_hub._serve.serve`` runs the hub;
this module loads only when ``tandem hub`` is asked for, and torch only when
a model needs it. ``python -m cloud_hub`` is the same command without typer,
for machines that install the hub alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cloud_hub._serve import LOG_LEVELS  # light: the hub's heavy parts load when it serves

from ._common import MqttCaOption, MqttCertOption, MqttKeyOption, TlsClientCaOption, TlsKeyOption

if TYPE_CHECKING:
    from shared import ApiKeyGuard, TlsSettings

__all__ = ["hub"]


RepoOption = Annotated[
    Path,
    typer.Option(
        "--repo",
        "-r",
        help="Model repository: <repo>/<model>/<version>/model.onnx (or model.pt), "
        "plus an optional <repo>/<model>/config.json.",
        exists=True,
        file_okay=False,
        dir_okay=True,
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
        help="Hub processes to run, all in the --share-group: one hub answers MQTT on "
        "one core at most (Python's GIL), so on a machine with cores to spare N "
        "processes answer more. Each loads the models (N times the memory; on a GPU, "
        "N contexts); only the first serves HTTP, and /metrics counts its requests only.",
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
    api_keys: ApiKeysOption = None,
    tls_cert: HubTlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
    workers: WorkersOption = 1,
) -> None:
    """Serve a model repository to edge devices over MQTT, batching on the GPU when present.

    Devices publish requests on <prefix>/infer/<model>; the hub batches them per
    model and answers on each request's reply topic. The same models answer over
    HTTP on --http-port (POST /v2/models/<model>/infer, any KServe v2 / Triton
    client), batched together with the MQTT requests; GET /metrics is for
    Prometheus. Run several hubs with the same --share-group to scale out (across
    machines, or on one with --workers N). Stop
    with Ctrl-C or SIGTERM: queued requests are answered "overloaded" so devices
    fall back at once.

    --tls-cert and --tls-key make the HTTP API HTTPS (--tls-client-ca: mutual
    TLS); --mqtt-ca, --mqtt-cert and --mqtt-key are for an mqtts:// broker.

    Example: tandem hub --repo ./models --broker mqtt://broker:1883 --http-port 8000
    """
    from cloud_hub._serve import HubServeSettings, check_options, serve
    from shared import TandemError

    problem = check_options(
        log_level=log_level,
        http_port=http_port,
        log_format=log_format,
        workers=workers,
        no_share=no_share,
    )
    if problem is not None:
        raise typer.BadParameter(problem[1], param_hint=problem[0])
    guard, http_tls = _http_security(
        api_keys if http_port else None,
        (tls_cert, tls_key, tls_client_ca),
        (mqtt_ca, mqtt_cert, mqtt_key),
    )
    settings = HubServeSettings(
        repo=repo,
        broker=broker,
        share_group=share_group,
        no_share=no_share,
        prefix=prefix,
        http_port=http_port,
        http_host=http_host,
        api_keys=guard,
        http_tls=http_tls,
        mqtt_ca=mqtt_ca,
        mqtt_cert=mqtt_cert,
        mqtt_key=mqtt_key,
        log_level=log_level,
        log_format=log_format,
        workers=workers,
    )
    try:
        serve(settings)
    except TandemError as e:
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(1) from e


def _http_security(
    api_keys: Path | None, https: tuple[Path | None, ...], mqtts: tuple[Path | None, ...]
) -> tuple[ApiKeyGuard | None, TlsSettings | None]:
    """The API key guard and the HTTP API's TLS; a mistake in them exits 2 (one line)."""
    from cloud_hub._serve import https_settings
    from shared import ApiKeyGuard, TandemError, TlsSettings

    try:  # a command-line mistake: one line and exit code 2, before anything starts
        http_tls = https_settings(*https)
        TlsSettings.from_files(ca_certs=mqtts[0], certfile=mqtts[1], keyfile=mqtts[2])
    except ValueError as e:  # ConfigError is a ValueError
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(2) from e
    try:
        guard = None if api_keys is None else ApiKeyGuard.from_file(api_keys)
    except TandemError as e:
        raise typer.BadParameter(str(e), param_hint="--api-keys") from e
    return guard, http_tls
