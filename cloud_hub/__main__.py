"""``python -m cloud_hub --repo DIR --broker mqtt://HOST:PORT``: run one hub, without typer.

The same command as ``tandem hub`` (same options, same ``cloud_hub.plane._launch``
underneath) for machines that install the hub alone; ``tandem hub --help``
explains each option at length. A command-line mistake exits 2, a failure
to serve exits 1, each with one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from shared import TandemError, TlsSettings
from shared.server import ApiKeyGuard

from .plane._launch import (
    LOG_FORMATS,
    LOG_LEVELS,
    MQTT_CLIENTS,
    HubServeSettings,
    check_options,
    default_workers,
    ensure_repo,
    https_settings,
    serve,
)

PROG = "python -m cloud_hub"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, not the usage block: the mistake, and where the options are listed."""
        print(f"{PROG}: {' '.join(message.split())} (--help lists the options)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Serve a model repository to edge devices over MQTT (and the Open "
        "Inference Protocol over HTTP), batching on the GPU when present. "
        "'tandem hub --help' explains each option.",
    )
    add = parser.add_argument
    add("--repo", "-r", type=Path, required=True, help="<repo>/<model>/<version>/model.onnx")
    add("--broker", default="mqtt://127.0.0.1:1883", help="mqtt://[user[:pass]@]host[:port]")
    add("--share-group", default="hubs", help="shared-subscription group")
    add("--no-share", action="store_true", help="subscribe without a shared subscription")
    add("--prefix", default="tandem/v1", help="topic prefix")
    add("--http-port", type=int, default=8000, help="HTTP API port; 0 turns it off")
    add("--http-host", default="127.0.0.1", help="address the HTTP API listens on")
    add("--grpc-port", type=int, default=0, help="KServe v2 gRPC port (8001: Triton's); 0: off")
    add("--api-keys", type=Path, help="API key file ('tandem keys create')")
    for name, what in (
        ("--tls-cert", "PEM certificate of the HTTP API (HTTPS)"),
        ("--tls-key", "PEM private key of --tls-cert"),
        ("--tls-client-ca", "PEM CA that HTTPS clients' certificates need"),
        ("--mqtt-ca", "PEM CA of an mqtts:// broker"),
        ("--mqtt-cert", "PEM client certificate for the broker"),
        ("--mqtt-key", "PEM private key of --mqtt-cert"),
    ):
        add(name, type=Path, help=what)
    add("--log-level", default="info", help=", ".join(LOG_LEVELS))
    add("--log-format", default="text", help=" or ".join(LOG_FORMATS))
    add("--workers", type=int, help="MQTT ingress processes (default: one per core)")
    add("--http-workers", type=int, default=1, help="HTTP ingress processes")
    add("--device", help="cpu, cuda or cuda:N for every model (default: each config's)")
    add("--mqtt-client", default="auto", help=", ".join(MQTT_CLIENTS))
    add(
        "--legacy-topics",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also take <prefix>/infer/<model> (first-release devices; migration only, unsafe)",
    )
    add("--max-inflight-mib", type=int, default=256, help="HTTP request bytes held at once")
    add("--redis", default=os.environ.get("TANDEM_REDIS_URL"), help="Redis URL: shared rate limits")
    add("--repo-poll-s", type=float, default=2.0, help="look for new versions this often; 0: never")
    add("--cdn", help="pull the --model(s) from this CDN into --repo")
    add("--model", action="append", default=[], help="NAME or NAME@VERSION to pull (repeat)")
    add("--trusted-key", action="append", type=Path, default=[], help="publisher public key")
    add("--cdn-token", default=os.environ.get("TANDEM_CDN_READ_TOKEN"), help="CDN read token")
    add("--cdn-ca", type=Path, help="PEM CA of an https:// CDN")
    add("--cdn-poll-s", type=float, default=30.0, help="ask the CDN for new versions this often")
    add("--otlp-endpoint", help="OTLP/HTTP receiver for spans (default: the OTEL_* environment)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    a = parser.parse_args(argv)
    if a.workers is None:  # one per core, or one alone without a shared subscription
        a.workers = 1 if a.no_share else default_workers()
    problem = check_options(
        log_level=a.log_level,
        http_port=a.http_port,
        grpc_port=a.grpc_port,
        log_format=a.log_format,
        workers=a.workers,
        no_share=a.no_share,
        http_workers=a.http_workers,
        mqtt_client=a.mqtt_client,
        device=a.device,
        max_inflight_mib=a.max_inflight_mib,
        cdn=a.cdn,
        models=tuple(a.model),
        trusted_keys=tuple(a.trusted_key),
        otlp_endpoint=a.otlp_endpoint,
    )
    if problem is not None:
        parser.error(f"argument {problem[0]}: {problem[1]}")
    problem = ensure_repo(a.repo, a.cdn)
    if problem is not None:
        parser.error(f"argument {problem[0]}: {problem[1]}")
    try:
        https_settings(a.tls_cert, a.tls_key, a.tls_client_ca)
        TlsSettings.from_files(ca_certs=a.mqtt_ca, certfile=a.mqtt_cert, keyfile=a.mqtt_key)
        if a.api_keys and a.http_port:
            ApiKeyGuard.from_file(a.api_keys)  # a bad file is a command-line mistake
        settings = HubServeSettings(
            repo=a.repo.resolve(),
            broker=a.broker,
            share_group=a.share_group,
            no_share=a.no_share,
            prefix=a.prefix,
            http_port=a.http_port,
            http_host=a.http_host,
            grpc_port=a.grpc_port,
            api_keys=a.api_keys.resolve() if a.api_keys and a.http_port else None,
            tls_cert=a.tls_cert,
            tls_key=a.tls_key,
            tls_client_ca=a.tls_client_ca,
            mqtt_ca=a.mqtt_ca,
            mqtt_cert=a.mqtt_cert,
            mqtt_key=a.mqtt_key,
            log_level=a.log_level,
            log_format=a.log_format,
            workers=a.workers,
            http_workers=a.http_workers,
            device=a.device,
            mqtt_client=a.mqtt_client,
            legacy_topics=a.legacy_topics,
            max_inflight_mib=a.max_inflight_mib,
            redis_url=a.redis,
            repo_poll_s=max(0.0, a.repo_poll_s),
            cdn=a.cdn,
            models=tuple(a.model),
            trusted_keys=tuple(a.trusted_key),
            cdn_token=a.cdn_token,
            cdn_ca=a.cdn_ca,
            cdn_poll_s=max(1.0, a.cdn_poll_s),
            otlp_endpoint=a.otlp_endpoint,
        )
    except (ValueError, TandemError) as e:  # ConfigError is a ValueError
        parser.error(str(e))
    try:
        serve(settings)
    except TandemError as e:
        print(f"{PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
