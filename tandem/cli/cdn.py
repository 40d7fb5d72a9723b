"""``tandem cdn serve``: the model CDN's HTTP server (``model_cdn.CdnServer``) from options.

The server's parts (FastAPI, uvicorn, the rollout service) load only when
the command runs. Failures are one line on stderr, ``tandem cdn serve:
<why>``: exit 1 when the work failed, 2 when the command line was wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ._common import (
    DEFAULT_REGISTRY,
    DEFAULT_STORE,
    MqttCaOption,
    MqttCertOption,
    MqttKeyOption,
    PrefixOption,
    RegistryOption,
    StoreOption,
    TlsCertOption,
    TlsClientCaOption,
    TlsKeyOption,
    clean_errors,
    fail,
    load_key,
    load_trusted_key,
    mqtt_settings,
)

if TYPE_CHECKING:
    from model_cdn.server import CdnServeSettings
    from shared import SigningKey, TlsSettings

__all__ = ["cdn_app"]

cdn_app = typer.Typer(no_args_is_help=True, add_completion=False)


@cdn_app.callback()
def _cdn() -> None:
    """Serve models, manifests and assignments over HTTP."""


HostOption = Annotated[str, typer.Option("--host", help="Address to listen on.")]
PortOption = Annotated[int, typer.Option("--port", help="TCP port.", min=1, max=65535)]
AdminTokenOption = Annotated[
    str | None,
    typer.Option(
        "--admin-token",
        envvar="TANDEM_CDN_ADMIN_TOKEN",
        help="Bearer token for uploads and assignments; without it the admin API is off.",
        show_default=False,
    ),
]
ReadTokenOption = Annotated[
    str | None,
    typer.Option(
        "--read-token",
        envvar="TANDEM_CDN_READ_TOKEN",
        help="Bearer token for reads too; without it reads are open.",
        show_default=False,
    ),
]
ApiKeysOption = Annotated[
    Path | None,
    typer.Option(
        "--api-keys",
        help="API key file ('tandem keys create'): keys with models:read may read "
        "(reads then need a key or token), models:publish upload, rollout:admin assign.",
        dir_okay=False,
        show_default=False,
    ),
]
TrustedKeyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-key",
        help="publisher.pub file or 'ed25519:…' text; uploads must be signed by one.",
        show_default=False,
    ),
]
BrokerOption = Annotated[
    str | None,
    typer.Option(
        "--broker",
        envvar="TANDEM_BROKER",
        help="MQTT broker URL: assignments are also published there, retained.",
    ),
]
RolloutKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--sign-key",
        envvar="TANDEM_SIGN_KEY",
        help="Private key that signs the assignments of rollouts (devices must trust "
        "its public key). With --broker it turns on the rollout controller and the "
        "fleet registry ('tandem rollout', 'tandem fleet list').",
        dir_okay=False,
        show_default=False,
    ),
]
LogLevelOption = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")]
TrustDirOption = Annotated[
    Path | None,
    typer.Option(
        "--trust-dir",
        help="Directory of signed roots ('tandem keys root init', 'tandem keys rotate'), "
        "served at /v1/roots/<n>.root.json for devices to rotate their keys.",
        file_okay=False,
        show_default=False,
    ),
]


RedisOption = Annotated[
    str | None,
    typer.Option(
        "--redis",
        envvar="TANDEM_REDIS_URL",
        help="Redis URL (redis://host:6379/0): API keys' rate limits are then shared by "
        "every replica; without it each process counts its own.",
        show_default=False,
    ),
]
LeaderLeaseOption = Annotated[
    float,
    typer.Option(
        "--leader-lease-s",
        help="How long the rollout leader's lease lasts without renewal; a replica takes "
        "over within about this long after the leader dies. 0 turns election off (one "
        "server alone).",
    ),
]


@cdn_app.command("serve")
def cdn_serve(
    host: HostOption = "127.0.0.1",
    port: PortOption = 8700,
    registry: RegistryOption = DEFAULT_REGISTRY,
    store: StoreOption = DEFAULT_STORE,
    admin_token: AdminTokenOption = None,
    read_token: ReadTokenOption = None,
    api_keys: ApiKeysOption = None,
    trusted_key: TrustedKeyOption = None,
    broker: BrokerOption = None,
    prefix: PrefixOption = "tandem/v1",
    sign_key: RolloutKeyOption = None,
    log_level: LogLevelOption = "info",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
    trust_dir: TrustDirOption = None,
    redis: RedisOption = None,
    leader_lease_s: LeaderLeaseOption = 10.0,
) -> None:
    """Serve models, signed manifests, blobs (ranges, immutable caching) and assignments.

    Devices download from here (or from a CDN in front of it); publishers and
    'tandem models assign' write through the admin API. With --broker and
    --sign-key the server also hears the fleet's heartbeats and update reports
    and runs staged rollouts ('tandem rollout start'), keeping their state in
    the registry so a restart resumes them. Several replicas on one PostgreSQL
    registry elect one rollout leader (a lease renewed every --leader-lease-s / 3);
    the others forward rollout commands to it. --redis shares API keys' rate
    limits across replicas. --tls-cert and
    --tls-key serve HTTPS (--tls-client-ca: mutual TLS); --mqtt-ca,
    --mqtt-cert and --mqtt-key are for an mqtts:// broker.

    Example: TANDEM_CDN_ADMIN_TOKEN=s3cret tandem cdn serve --host 0.0.0.0
    --trusted-key ~/.tandem/publisher.pub --broker mqtt://broker:1883
    """
    from model_cdn.server import LOG_LEVELS, CdnServer, CdnServeSettings
    from shared import Topics

    command = "cdn serve"
    if log_level not in LOG_LEVELS:
        fail(command, f"--log-level must be debug, info, warning or error, got {log_level!r}", 2)
    with clean_errors(command):
        try:
            settings = CdnServeSettings(
                registry=registry,
                store=store,
                host=host,
                port=port,
                admin_token=admin_token,
                read_token=read_token,
                api_keys=api_keys,
                trusted_keys=tuple(load_trusted_key(k) for k in trusted_key or []),
                mqtt=mqtt_settings(broker, mqtt_ca, mqtt_cert, mqtt_key),
                topics=Topics(prefix),
                log_level=log_level,
                tls=_https(tls_cert, tls_key, tls_client_ca),
                trust_dir=trust_dir,
                redis_url=redis,
                leader_lease_s=leader_lease_s or None,
            )
            if sign_key is not None and settings.mqtt is None:
                raise ValueError("--sign-key runs rollouts, which need --broker")
            if sign_key is not None:
                settings = _with_signer(settings, load_key(sign_key, command))
        except ValueError as e:
            fail(command, str(e), 2)
        with CdnServer(settings) as server:
            for note in _notes(settings):
                typer.echo(f"note: {note}", err=True)
            server.run()


def _https(cert: Path | None, key: Path | None, client_ca: Path | None) -> TlsSettings | None:
    from shared import TlsSettings

    if client_ca is not None and cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
    return TlsSettings.from_files(ca_certs=client_ca, certfile=cert, keyfile=key)


def _with_signer(settings: CdnServeSettings, signer: SigningKey) -> CdnServeSettings:
    import dataclasses

    return dataclasses.replace(settings, signer=signer)


def _notes(settings: CdnServeSettings) -> list[str]:
    """What the operator may not have meant: a part left off by a missing option."""
    notes = []
    if settings.mqtt is not None and settings.signer is None:
        notes.append("no --sign-key, so rollouts are off")
    if settings.admin_token is None and settings.api_keys is None:
        notes.append("no --admin-token, so the admin API is off (read-only)")
    elif not settings.trusted_keys:
        notes.append("no --trusted-key, so uploads are not checked for signatures")
    return notes
