"""The ``tandem hub`` command (also ``python -m cloud_hub``).

``hub`` is a plain function with typer annotations so the ``tandem`` CLI
root can register it as a subcommand; typer is imported only here, so the
library never needs it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

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
    log_level: Annotated[str, typer.Option(help=f"Logging level: {', '.join(_LEVELS)}.")] = "info",
) -> None:
    """Serve a model repository to edge devices over MQTT, batching on the GPU when present.

    Devices publish requests on <prefix>/infer/<model>; the hub batches them per
    model and answers on each request's reply topic. Run several hubs with the
    same --share-group to scale out. Stop with Ctrl-C or SIGTERM: queued requests
    are answered "overloaded" so devices fall back at once.

    Example: tandem hub --repo ./models --broker mqtt://broker:1883
    """
    if log_level.lower() not in _LEVELS:
        raise typer.BadParameter(f"use one of {', '.join(_LEVELS)}", param_hint="--log-level")
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from shared import Limits, MqttSettings, TandemError, Topics

    from ._server import Hub

    try:
        server = Hub(
            repo,
            mqtt=MqttSettings.from_url(broker),
            topics=Topics(prefix),
            share_group=None if no_share else share_group,
            limits=Limits(),
            connect_timeout_s=None,  # a hub started before its broker waits for it
        )
        server.run_forever()
    except TandemError as e:
        typer.echo(f"tandem hub: {e}", err=True)
        raise typer.Exit(1) from e


def main() -> None:
    """``python -m cloud_hub``: the same command, standing alone."""
    app = typer.Typer(add_completion=False)
    app.command()(hub)
    app(prog_name="python -m cloud_hub")
