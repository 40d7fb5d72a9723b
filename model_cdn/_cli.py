"""The CDN's commands: ``tandem keys``, ``tandem models`` and ``tandem cdn``.

Three typer apps that the ``tandem`` root registers lazily. Only typer and
rich load with this module; the publish pipeline (onnx), the server
(FastAPI, uvicorn) and PostgreSQL support load inside the command that needs
them. Every failure is one line on stderr, ``tandem <command>: <why>``, and
a non-zero exit: 1 when the work failed, 2 when the command line was wrong.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from ._cli_common import (
    DEFAULT_REGISTRY,
    DEFAULT_STORE,
    MqttCaOption,
    MqttCertOption,
    MqttKeyOption,
    RegistryOption,
    SignKeyOption,
    StoreOption,
    TlsCertOption,
    TlsClientCaOption,
    TlsKeyOption,
    clean_errors,
    fail,
    load_key,
    open_registry_for,
    ratio_text,
)
from ._cli_publish import models_publish

__all__ = ["cdn_app", "keys_app", "models_app"]

_MODEL_AT_VERSION = re.compile(r"([^@]+)@([1-9][0-9]{0,17})")

keys_app = typer.Typer(no_args_is_help=True, add_completion=False)
models_app = typer.Typer(no_args_is_help=True, add_completion=False)
cdn_app = typer.Typer(no_args_is_help=True, add_completion=False)


@keys_app.callback()
def _keys() -> None:
    """The publisher's signing key (generate), and API keys for the HTTP servers (create,
    list, revoke)."""


@models_app.callback()
def _models() -> None:
    """Publish model versions, list them, assign them to devices."""


@cdn_app.callback()
def _cdn() -> None:
    """Serve models, manifests and assignments over HTTP."""


models_app.command("publish")(models_publish)


# -- tandem keys ------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by the owner only, atomically (never a world-readable moment)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@keys_app.command("generate")
def keys_generate(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Directory for publisher.key and publisher.pub.", show_default=False
        ),
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key pair.")] = False,
) -> None:
    """Create a publisher key pair: publisher.key (private, mode 0600) and publisher.pub.

    Keep publisher.key on the publishing machine; give publisher.pub to
    devices and to 'tandem cdn serve --trusted-key'. Replacing the key makes
    devices that pinned the old one refuse new models, hence --force.

    Example: tandem keys generate --out ~/.tandem
    """
    from shared import SigningKey

    with clean_errors("keys generate"):
        private, public = out / "publisher.key", out / "publisher.pub"
        existing = [p for p in (private, public) if p.exists()]
        if existing and not force:
            fail("keys generate", f"{existing[0]} exists; pass --force to replace the key pair")
        out.mkdir(parents=True, exist_ok=True)
        key = SigningKey.generate()
        _write_private(private, key.to_text() + "\n")
        public.write_text(key.public_key.to_text() + "\n")
        typer.echo(f"private key: {private}  (keep it secret)")
        typer.echo(f"public key:  {public}  ({key.public_key.to_text()})")
        typer.echo(f"key id:      {key.public_key.keyid}")


KeysFileOption = Annotated[
    Path,
    typer.Option(
        "--keys-file",
        help="The API key file that 'tandem hub --api-keys' and 'tandem cdn serve "
        "--api-keys' read (secrets are not in it, only their SHA-256).",
        dir_okay=False,
        show_default=False,
    ),
]


@keys_app.command("create")
def keys_create(
    scope: Annotated[
        list[str],
        typer.Option(
            "--scope",
            help="infer, models:read, models:publish or rollout:admin (repeat for several).",
            show_default=False,
        ),
    ],
    keys_file: KeysFileOption,
    name: Annotated[str, typer.Option("--name", help="What the key is for.")] = "",
    rate: Annotated[
        float, typer.Option("--rate", help="Requests per second, sustained.", min=0.001)
    ] = 20.0,
    burst: Annotated[int, typer.Option("--burst", help="Requests at once.", min=1)] = 40,
) -> None:
    """Create an API key; print it once (only its SHA-256 is kept in --keys-file).

    Example: tandem keys create --scope infer --name cam-fleet --keys-file ./api-keys.json
    """
    from shared import API_KEY_SCOPES, ApiKeyFile, generate_api_key

    command = "keys create"
    unknown = sorted(set(scope) - API_KEY_SCOPES)
    if unknown:
        fail(command, f"unknown scope {unknown[0]!r}: use {', '.join(sorted(API_KEY_SCOPES))}", 2)
    with clean_errors(command):
        text, key = generate_api_key(scope, name=name, rate=rate, burst=burst)
        ApiKeyFile(keys_file).add(key)
    typer.echo(text)
    typer.echo(
        f"key {key.id} ({', '.join(sorted(key.scopes))}; {key.rate:g}/s, burst {key.burst}) "
        f"added to {keys_file}; the key is shown only this once",
        err=True,
    )


@keys_app.command("list")
def keys_list(keys_file: KeysFileOption) -> None:
    """List the API keys of --keys-file (ids, names, scopes, limits; never secrets).

    Example: tandem keys list --keys-file ./api-keys.json
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from shared import ApiKeyFile

    with clean_errors("keys list"):
        keys = ApiKeyFile(keys_file).load()
    if not keys:
        typer.echo("no API keys yet")
        return
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in ("id", "name", "scopes", "rate/s", "burst", "created", "status"):
        table.add_column(column, no_wrap=True)
    for key in keys.values():
        table.add_row(
            key.id,
            key.name,
            ",".join(sorted(key.scopes)),
            f"{key.rate:g}",
            str(key.burst),
            key.created,
            "active" if key.revoked is None else f"revoked {key.revoked}",
        )
    Console().print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[
        str, typer.Argument(metavar="ID", help="The key's id (8 hex digits).", show_default=False)
    ],
    keys_file: KeysFileOption,
) -> None:
    """Revoke an API key: servers reading --keys-file refuse it from their next request.

    Example: tandem keys revoke 1a2b3c4d --keys-file ./api-keys.json
    """
    from shared import ApiKeyFile

    with clean_errors("keys revoke"):
        key = ApiKeyFile(keys_file).revoke(key_id)
    typer.echo(f"key {key.id} revoked at {key.revoked}")


# -- tandem models ----------------------------------------------------------


@models_app.command("list")
def models_list(
    name: Annotated[
        str | None, typer.Argument(help="Show this model's versions.", show_default=False)
    ] = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
) -> None:
    """List models with their latest version, or one model's versions.

    Example: tandem models list mnist --registry sqlite:///./tandem-cdn/registry.db
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    command = "models list"
    with clean_errors(command):
        reg = open_registry_for(registry, create=False)
        try:
            if name is None:
                table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
                for column in ("model", "latest", "versions", "published"):
                    table.add_column(column, no_wrap=True)
                table.add_column("blob", overflow="ellipsis")  # gives way when narrow
                models = reg.list_models()
                for model in models:
                    records = reg.list_versions(model)
                    last = records[-1]
                    table.add_row(
                        model,
                        str(last.version),
                        str(len(records)),
                        last.published_at,
                        last.blob_digest.removeprefix("sha256:")[:12],
                    )
                empty = not models
            else:
                table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
                for column in ("version", "published", "method", "agreement", "accuracy"):
                    table.add_column(column, no_wrap=True)
                table.add_column("blob", overflow="ellipsis")
                records = reg.list_versions(name)
                for record in records:
                    q = record.manifest.get("signed", {}).get("quantization", {})
                    table.add_row(
                        str(record.version),
                        record.published_at,
                        str(q.get("method", "—")),
                        ratio_text(q.get("agreement")),
                        ratio_text(q.get("accuracy")),
                        record.blob_digest.removeprefix("sha256:")[:12],
                    )
                empty = not records
        finally:
            reg.close()
    if empty:
        typer.echo("no models yet" if name is None else f"{name} has no versions")
    else:
        Console().print(table)


@models_app.command("assign")
def models_assign(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODEL@VERSION", help="What to run, e.g. mnist@3.", show_default=False
        ),
    ],
    device: Annotated[
        list[str],
        typer.Option("--device", help="Device id (repeat for several).", show_default=False),
    ],
    sign_key: SignKeyOption = None,  # required; checked so the message names the env variable
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            envvar="TANDEM_BROKER",
            help="MQTT broker URL; without it the assignment is only stored (devices poll).",
        ),
    ] = None,
    rollback: Annotated[
        bool, typer.Option("--rollback", help="Allow going below the device's highest version.")
    ] = False,
    rollout: Annotated[str | None, typer.Option("--rollout", help="Rollout id to record.")] = None,
    ttl_days: Annotated[
        float, typer.Option("--ttl-days", help="Days until devices ignore this assignment.")
    ] = 30.0,
    prefix: Annotated[str, typer.Option("--prefix", help="MQTT topic prefix.")] = "tandem/v1",
    registry: RegistryOption = DEFAULT_REGISTRY,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
) -> None:
    """Tell devices which version to run: sign, store, and publish retained on MQTT.

    Example: tandem models assign mnist@3 --device cam-1 --device cam-2
    --sign-key ~/.tandem/publisher.key --broker mqtt://broker:1883
    """
    from shared import Topics, validate_name

    from ._assign import make_assignment, publish_assignment
    from ._errors import CdnError

    command = "models assign"
    match = _MODEL_AT_VERSION.fullmatch(target)
    if match is None:
        fail(command, f"write the target as MODEL@VERSION (e.g. mnist@3), got {target!r}", 2)
    model, version = match.group(1), int(match.group(2))
    with clean_errors(command):
        try:
            validate_name(model, "model name")
            for d in device:
                validate_name(d, "device id")
            settings = _mqtt_settings(broker, mqtt_ca, mqtt_cert, mqtt_key)
            topics = Topics(prefix)
        except ValueError as e:
            fail(command, str(e), 2)
        key = load_key(sign_key, command)
        reg = open_registry_for(registry, create=False)
        try:
            reg.get_version(model, version)
            for d in device:
                doc = make_assignment(
                    key,
                    device=d,
                    model=model,
                    version=version,
                    rollback=rollback,
                    rollout=rollout,
                    ttl_days=ttl_days,
                )
                reg.put_assignment(d, model, doc)
                if settings is not None:
                    try:
                        publish_assignment(settings, topics, d, doc)
                    except CdnError as e:
                        raise CdnError(f"{d}: assignment stored, but not published: {e}") from e
                    typer.echo(f"{d}: {model}@{version} stored and published to {settings.url}")
                else:
                    typer.echo(f"{d}: {model}@{version} stored (no --broker: devices poll the CDN)")
        finally:
            reg.close()


# -- tandem cdn ---------------------------------------------------------------


def _mqtt_settings(broker: str | None, ca: Path | None, cert: Path | None, key: Path | None) -> Any:
    """``MqttSettings`` for ``--broker`` and the ``--mqtt-*`` files, or None without a broker."""
    from shared import MqttSettings, TlsSettings

    if not broker:
        TlsSettings.from_files(ca_certs=ca, certfile=cert, keyfile=key)  # still say what is wrong
        return None
    return MqttSettings.from_url(broker).with_tls(ca_certs=ca, certfile=cert, keyfile=key)


def _ssl_options(tls: Any) -> dict[str, Any]:
    """uvicorn's arguments for ``TlsSettings`` (None: plain HTTP)."""
    import ssl

    if tls is None:
        return {}
    return {
        "ssl_certfile": tls.certfile,
        "ssl_keyfile": tls.keyfile,
        "ssl_ca_certs": tls.ca_certs,
        "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.ca_certs else ssl.CERT_NONE,
    }


def _trusted_key(text: str) -> Any:
    from shared import PublicKey

    return PublicKey.from_text(text) if text.startswith("ed25519:") else PublicKey.load(text)


@cdn_app.command("serve")
def cdn_serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.", min=1, max=65535)] = 8700,
    registry: RegistryOption = DEFAULT_REGISTRY,
    store: StoreOption = DEFAULT_STORE,
    admin_token: Annotated[
        str | None,
        typer.Option(
            "--admin-token",
            envvar="TANDEM_CDN_ADMIN_TOKEN",
            help="Bearer token for uploads and assignments; without it the admin API is off.",
            show_default=False,
        ),
    ] = None,
    read_token: Annotated[
        str | None,
        typer.Option(
            "--read-token",
            envvar="TANDEM_CDN_READ_TOKEN",
            help="Bearer token for reads too; without it reads are open.",
            show_default=False,
        ),
    ] = None,
    api_keys: Annotated[
        Path | None,
        typer.Option(
            "--api-keys",
            help="API key file ('tandem keys create'): keys with models:read may read "
            "(reads then need a key or token), models:publish upload, rollout:admin assign.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    trusted_key: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-key",
            help="publisher.pub file or 'ed25519:…' text; uploads must be signed by one.",
            show_default=False,
        ),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            envvar="TANDEM_BROKER",
            help="MQTT broker URL: assignments are also published there, retained.",
        ),
    ] = None,
    prefix: Annotated[str, typer.Option("--prefix", help="MQTT topic prefix.")] = "tandem/v1",
    sign_key: Annotated[
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
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error.")
    ] = "info",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
) -> None:
    """Serve models, signed manifests, blobs (ranges, immutable caching) and assignments.

    Devices download from here (or from a CDN in front of it); publishers and
    'tandem models assign' write through the admin API. With --broker and
    --sign-key the server also hears the fleet's heartbeats and update reports
    and runs staged rollouts ('tandem rollout start'), keeping their state in
    the registry so a restart resumes them. --tls-cert and
    --tls-key serve HTTPS (--tls-client-ca: mutual TLS); --mqtt-ca,
    --mqtt-cert and --mqtt-key are for an mqtts:// broker.

    Example: TANDEM_CDN_ADMIN_TOKEN=s3cret tandem cdn serve --host 0.0.0.0
    --trusted-key ~/.tandem/publisher.pub --broker mqtt://broker:1883
    """
    from shared import ApiKeyGuard, TlsSettings, Topics

    command = "cdn serve"
    if log_level not in ("debug", "info", "warning", "error"):
        fail(command, f"--log-level must be debug, info, warning or error, got {log_level!r}", 2)
    signer = None
    with clean_errors(command):
        try:
            keys = [_trusted_key(k) for k in trusted_key or []]
            settings = _mqtt_settings(broker, mqtt_ca, mqtt_cert, mqtt_key)
            if tls_client_ca is not None and tls_cert is None:
                raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
            tls = TlsSettings.from_files(ca_certs=tls_client_ca, certfile=tls_cert, keyfile=tls_key)
            topics = Topics(prefix)
            if sign_key is not None and settings is None:
                raise ValueError("--sign-key runs rollouts, which need --broker")
            signer = None if sign_key is None else load_key(sign_key, command)
        except ValueError as e:
            fail(command, str(e), 2)
        try:
            import uvicorn

            from ._server import create_app
        except ImportError as e:
            fail(command, f"serving needs {e.name!r}: install tandem[cdn]")
        from .store import open_store

        guard = None if api_keys is None else ApiKeyGuard.from_file(api_keys)
        reg = open_registry_for(registry, create=True)
        service = None
        try:
            if signer is not None:
                from .rollout._service import FleetService

                service = FleetService(reg, signer, settings, topics).start()
            elif settings is not None:
                typer.echo("note: no --sign-key, so rollouts are off", err=True)
            app = create_app(
                registry=reg,
                store=open_store(store),
                admin_token=admin_token or None,
                read_token=read_token or None,
                trusted_keys=keys or None,
                mqtt=settings,
                topics=topics,
                api_keys=guard,
                controller=None if service is None else service.controller,
            )
            if admin_token is None and guard is None:
                typer.echo("note: no --admin-token, so the admin API is off (read-only)", err=True)
            elif not keys:
                typer.echo(
                    "note: no --trusted-key, so uploads are not checked for signatures", err=True
                )
            uvicorn.run(app, host=host, port=port, log_level=log_level, **_ssl_options(tls))
        finally:
            if service is not None:
                service.stop()
            reg.close()
