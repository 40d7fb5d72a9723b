"""The ``tandem hub`` command (also ``python -m cloud_hub``).

``hub`` is a plain function with typer annotations so the ``tandem`` CLI
root can register it as a subcommand; typer is imported only here, so the
library never needs it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from shared import ApiKeyGuard, TlsSettings

    from ._server import Hub
    from .http import HttpServer

__all__ = ["hub", "main"]

_LEVELS = ("debug", "info", "warning", "error")


def hub(
    repo: Annotated[
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
    ],
    broker: Annotated[
        str,
        typer.Option(
            help="MQTT broker URL: mqtt://[user[:pass]@]host[:port]; mqtts:// turns on TLS."
        ),
    ] = "mqtt://127.0.0.1:1883",
    share_group: Annotated[
        str,
        typer.Option(
            help="Shared-subscription group: hub replicas in the same group split the "
            "requests, each answered once."
        ),
    ] = "hubs",
    no_share: Annotated[
        bool,
        typer.Option(
            "--no-share",
            help="Subscribe without a shared subscription (one hub only, or brokers "
            "without $share such as the embedded amqtt).",
        ),
    ] = False,
    prefix: Annotated[
        str, typer.Option(help="Topic prefix; must match the devices' prefix.")
    ] = "tandem/v1",
    http_port: Annotated[
        int,
        typer.Option(
            help="Port of the HTTP API (Open Inference Protocol v2, as Triton and KServe "
            "speak it, plus /metrics for Prometheus); 0 turns it off.",
        ),
    ] = 8000,
    http_host: Annotated[
        str,
        typer.Option(
            help="Address the HTTP API listens on; 0.0.0.0 for every interface. Without "
            "--api-keys it has no authentication: expose it behind a proxy that adds it."
        ),
    ] = "127.0.0.1",
    api_keys: Annotated[
        Path | None,
        typer.Option(
            "--api-keys",
            help="API key file ('tandem keys create'): /v2 model routes then need a key "
            "with scope infer (or models:read for metadata), within its rate. Health "
            "probes and /metrics stay open. Re-read when it changes.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            help="PEM certificate (chain) of the HTTP API: it then serves HTTPS. Needs --tls-key.",
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option("--tls-key", help="PEM private key of --tls-cert.", show_default=False),
    ] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(
            "--tls-client-ca",
            help="PEM CA: HTTPS clients must then present a certificate it signed (mutual TLS).",
            show_default=False,
        ),
    ] = None,
    mqtt_ca: Annotated[
        Path | None,
        typer.Option(
            "--mqtt-ca",
            help="PEM CA that signed the broker's certificate (mqtts:// only); default: the "
            "system's.",
            show_default=False,
        ),
    ] = None,
    mqtt_cert: Annotated[
        Path | None,
        typer.Option(
            "--mqtt-cert",
            help="PEM client certificate for the broker (mutual TLS). Needs --mqtt-key.",
            show_default=False,
        ),
    ] = None,
    mqtt_key: Annotated[
        Path | None,
        typer.Option("--mqtt-key", help="PEM private key of --mqtt-cert.", show_default=False),
    ] = None,
    log_level: Annotated[str, typer.Option(help=f"Logging level: {', '.join(_LEVELS)}.")] = "info",
    log_format: Annotated[
        str,
        typer.Option(help="Log lines as 'text' or 'json' (one object a line, with request ids)."),
    ] = "text",
    workers: Annotated[
        int,
        typer.Option(
            help="Hub processes to run, all in the --share-group: one hub answers MQTT on "
            "one core at most (Python's GIL), so on a machine with cores to spare N "
            "processes answer more. Each loads the models (N times the memory; on a GPU, "
            "N contexts); only the first serves HTTP, and /metrics counts its requests only.",
        ),
    ] = 1,
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
    if log_level.lower() not in _LEVELS:
        raise typer.BadParameter(f"use one of {', '.join(_LEVELS)}", param_hint="--log-level")
    if not 0 <= http_port <= 65535:
        raise typer.BadParameter(
            "use a port from 1 to 65535, or 0 for none", param_hint="--http-port"
        )
    if log_format.lower() not in ("text", "json"):
        raise typer.BadParameter("use text or json", param_hint="--log-format")
    if workers < 1:
        raise typer.BadParameter("use 1 or more", param_hint="--workers")
    if workers > 1 and no_share:
        raise typer.BadParameter(
            "several workers need a shared subscription to split the requests; drop --no-share",
            param_hint="--workers",
        )
    from shared._logging import configure_logging

    configure_logging(log_level, json=log_format.lower() == "json", stream=sys.stderr)
    from shared import ApiKeyGuard, Limits, MqttSettings, TandemError, TlsSettings, Topics

    from ._server import Hub
    from ._workers import HubWorkers, WorkerSpec

    try:  # a command-line mistake: one line and exit code 2, before anything starts
        if tls_client_ca is not None and tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
        http_tls = TlsSettings.from_files(
            ca_certs=tls_client_ca, certfile=tls_cert, keyfile=tls_key
        )
        TlsSettings.from_files(ca_certs=mqtt_ca, certfile=mqtt_cert, keyfile=mqtt_key)
    except ValueError as e:  # ConfigError is a ValueError
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(2) from e

    try:
        guard = None if api_keys is None or not http_port else ApiKeyGuard.from_file(api_keys)
    except TandemError as e:
        raise typer.BadParameter(str(e), param_hint="--api-keys") from e
    try:
        server = Hub(
            repo,
            mqtt=MqttSettings.from_url(broker).with_tls(
                ca_certs=mqtt_ca, certfile=mqtt_cert, keyfile=mqtt_key
            ),
            topics=Topics(prefix),
            share_group=None if no_share else share_group,
            limits=Limits(),
            connect_timeout_s=None,  # a hub started before its broker waits for it
        )
        # SIGTERM while starting (loading models, importing the HTTP stack) is a clean stop.
        with _stop_on_signals(server), server:  # the hub first: HTTP's first request finds it
            http = _start_http(server, http_host, http_port, guard, http_tls)
            pool = None
            if workers > 1:  # the others, once this one serves: the models load
                pool = HubWorkers(
                    workers - 1,
                    WorkerSpec(
                        repo=str(repo),
                        broker=broker,
                        share_group=share_group,
                        prefix=prefix,
                        mqtt_ca=None if mqtt_ca is None else str(mqtt_ca),
                        mqtt_cert=None if mqtt_cert is None else str(mqtt_cert),
                        mqtt_key=None if mqtt_key is None else str(mqtt_key),
                        log_level=log_level.lower(),
                        log_format=log_format.lower(),
                    ),
                ).start()
            try:
                server.run_forever()  # the hub stops first: late HTTP requests get 503
            finally:
                if http is not None:
                    http.stop()
                if pool is not None:
                    pool.stop()
    except TandemError as e:
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(1) from e


@contextlib.contextmanager
def _stop_on_signals(server: Hub) -> Iterator[None]:
    """Until ``run_forever`` installs its own handlers, SIGINT/SIGTERM ask it to stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: server.request_stop()) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_http(
    server: Hub, host: str, port: int, api_keys: ApiKeyGuard | None, tls: TlsSettings | None
) -> HttpServer | None:
    if not port:
        return None
    from .http import HttpServer, create_app  # FastAPI and uvicorn only when HTTP is on

    app = create_app(server, api_keys=api_keys)
    return HttpServer(app, host=host, port=port, tls=tls).start()


def main() -> None:
    """``python -m cloud_hub``: the same command, standing alone."""
    app = typer.Typer(add_completion=False)
    app.command()(hub)
    app(prog_name="python -m cloud_hub")
