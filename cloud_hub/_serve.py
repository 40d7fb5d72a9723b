"""Running a hub as a command does: ``tandem hub`` and ``python -m cloud_hub`` both call ``serve``.

``check_options`` is the pure check both command lines make first (it
names the option at fault); ``serve`` configures logging, loads the
repository, connects to the broker, starts the HTTP API (FastAPI and
uvicorn load only when it is on) and the extra worker processes, and runs
until SIGINT or SIGTERM. SIGINT and SIGTERM while it starts (loading
models, importing the HTTP stack) are a clean stop too. The hub stops
first, so late HTTP requests get 503; then HTTP, then the workers.

``https_settings`` turns the ``--tls-*`` files into the HTTP API's TLS
settings, or raises ``shared.ConfigError`` (a ``ValueError``) when they
cannot work. ``serve`` raises ``shared.TandemError`` (a bad broker URL or
repository, a broker that refuses).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared import ApiKeyGuard, TlsSettings

if TYPE_CHECKING:
    from ._server import Hub
    from ._workers import HubWorkers
    from .http import HttpServer

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "HubServeSettings",
    "check_options",
    "https_settings",
    "serve",
]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True, kw_only=True)
class HubServeSettings:
    """One hub command's settings, as typed (paths, URLs); see ``tandem hub --help``."""

    repo: Path
    broker: str = "mqtt://127.0.0.1:1883"  # credentials included
    share_group: str = "hubs"
    no_share: bool = False  # subscribe plainly (one hub, or brokers without $share)
    prefix: str = "tandem/v1"
    http_port: int = 8000  # 0: no HTTP API
    http_host: str = "127.0.0.1"
    api_keys: ApiKeyGuard | None = None
    http_tls: TlsSettings | None = None
    mqtt_ca: Path | None = None
    mqtt_cert: Path | None = None
    mqtt_key: Path | None = None
    log_level: str = "info"
    log_format: str = "text"
    workers: int = 1  # hub processes, this one included


def check_options(
    *, log_level: str, http_port: int, log_format: str, workers: int, no_share: bool
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
    if workers > 1 and no_share:
        return (
            "--workers",
            "several workers need a shared subscription to split the requests; drop --no-share",
        )
    return None


def https_settings(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> TlsSettings | None:
    """The HTTP API's TLS from the ``--tls-*`` files; ``ConfigError`` when they cannot work."""
    if client_ca is not None and cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
    return TlsSettings.from_files(ca_certs=client_ca, certfile=cert, keyfile=key)


def serve(settings: HubServeSettings) -> None:
    """Run one hub (and ``workers - 1`` more processes) until SIGINT or SIGTERM."""
    from shared import Limits, MqttSettings, Topics
    from shared._logging import configure_logging

    from ._server import Hub

    s = settings
    configure_logging(s.log_level.lower(), json=s.log_format.lower() == "json", stream=sys.stderr)
    server = Hub(
        s.repo,
        mqtt=MqttSettings.from_url(s.broker).with_tls(
            ca_certs=s.mqtt_ca, certfile=s.mqtt_cert, keyfile=s.mqtt_key
        ),
        topics=Topics(s.prefix),
        share_group=None if s.no_share else s.share_group,
        limits=Limits(),
        connect_timeout_s=None,  # a hub started before its broker waits for it
    )
    with _stop_on_signals(server), server:  # the hub first: HTTP's first request finds it
        http = _start_http(server, s)
        pool = _start_workers(s)  # the others, once this one serves: the models load
        try:
            server.run_forever()  # the hub stops first: late HTTP requests get 503
        finally:
            if http is not None:
                http.stop()
            if pool is not None:
                pool.stop()


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


def _start_http(server: Hub, s: HubServeSettings) -> HttpServer | None:
    if not s.http_port:
        return None
    from .http import HttpServer, create_app  # FastAPI and uvicorn only when HTTP is on

    app = create_app(server, api_keys=s.api_keys)
    return HttpServer(app, host=s.http_host, port=s.http_port, tls=s.http_tls).start()


def _start_workers(s: HubServeSettings) -> HubWorkers | None:
    if s.workers <= 1:
        return None
    from ._workers import HubWorkers, WorkerSpec

    spec = WorkerSpec(
        repo=str(s.repo),
        broker=s.broker,
        share_group=s.share_group,
        prefix=s.prefix,
        mqtt_ca=None if s.mqtt_ca is None else str(s.mqtt_ca),
        mqtt_cert=None if s.mqtt_cert is None else str(s.mqtt_cert),
        mqtt_key=None if s.mqtt_key is None else str(s.mqtt_key),
        log_level=s.log_level.lower(),
        log_format=s.log_format.lower(),
    )
    return HubWorkers(s.workers - 1, spec).start()
