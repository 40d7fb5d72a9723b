"""What the commands share: one-line errors, the registry/store/key/TLS options.

Every failure of a command is one line on stderr, ``tandem <command>: <why>``,
and a non-zero exit: 1 when the work failed, 2 when the command line was wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from model_cdn import Registry
    from shared import MqttSettings, PublicKey

__all__ = [
    "DEFAULT_REGISTRY",
    "DEFAULT_STORE",
    "AssignerKeyOption",
    "MqttCaOption",
    "MqttCertOption",
    "MqttKeyOption",
    "PrefixOption",
    "RegistryOption",
    "SignKeyOption",
    "SignedCommand",
    "StoreOption",
    "TlsCertOption",
    "TlsClientCaOption",
    "TlsKeyOption",
    "TrustedKeysOption",
    "clean_errors",
    "fail",
    "load_key",
    "load_trusted_key",
    "mqtt_settings",
    "open_registry_for",
    "ratio_text",
    "required_in_help",
    "size_text",
]

DEFAULT_REGISTRY = "sqlite:///./tandem-cdn/registry.db"
DEFAULT_STORE = "./tandem-cdn/blobs"


def fail(command: str, message: str, code: int = 1) -> NoReturn:
    first = " ".join(str(message).split())  # one line, whatever the message held
    typer.echo(f"tandem {command}: {first}", err=True)
    raise typer.Exit(code)


@contextmanager
def clean_errors(command: str) -> Iterator[None]:
    """Our errors, file errors and bad values become one line and exit code 1."""
    from shared import TandemError

    try:
        yield
    except typer.Exit:
        raise
    except (TandemError, OSError, ValueError) as e:
        if isinstance(e, OSError) and e.filename is not None:
            message = f"{e.strerror or e}: {e.filename}"
        else:
            message = str(e) or type(e).__name__
        fail(command, message)


def open_registry_for(url: str, *, create: bool) -> Registry:
    """The registry; with ``create=False`` a missing SQLite file is an error with a hint."""
    from model_cdn import RegistryError, open_registry

    try:
        return open_registry(url, create=create)
    except RegistryError as e:
        if create or not str(e).startswith("no registry at"):
            raise
        raise RegistryError(
            f"{e} (nothing published there yet?); pass --registry or set TANDEM_REGISTRY"
        ) from e


# -- options shared by several commands ------------------------------------

RegistryOption = Annotated[
    str,
    typer.Option(
        "--registry",
        envvar="TANDEM_REGISTRY",
        help="Registry: sqlite:///path.db, a plain path, or postgresql://user@host/db.",
    ),
]
StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="TANDEM_STORE",
        help="Blob store: a directory, file:///dir or s3://bucket/prefix?endpoint_url=….",
    ),
]
PrefixOption = Annotated[str, typer.Option("--prefix", help="MQTT topic prefix.")]
TrustedKeysOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-key",
        help="The publisher's public key that must have signed the manifest: a publisher.pub "
        "file or 'ed25519:…' text (repeatable).",
        show_default=False,
    ),
]
SignKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--sign-key",
        envvar="TANDEM_SIGN_KEY",
        help="The publisher's private key file (from 'tandem keys generate').",
        show_default=False,
    ),
]
AssignerKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--sign-key",
        envvar="TANDEM_SIGN_KEY",
        help="The assigner's private key file, which signs assignments (with a root of "
        "trust, a key of its assigner role, as 'tandem cdn serve --sign-key'; with a "
        "pinned publisher key, that key).",
        show_default=False,
    ),
]


def required_in_help(*names: str) -> type[TyperCommand]:
    """A command class whose help marks the options ``names`` required (``*``,
    ``[required]``) while the command checks them itself, so a missing one is a line of
    ours (naming its environment variable, say) instead of click's usage box."""

    class RequiredInHelp(TyperCommand):
        def format_help(self, ctx: Any, formatter: Any) -> None:
            shown = [p for p in self.params if p.name in names and not p.required]
            for param in shown:
                param.required = True
            try:
                super().format_help(ctx, formatter)
            finally:
                for param in shown:
                    param.required = False

    return RequiredInHelp


SignedCommand = required_in_help("sign_key")  # for commands that sign: publish, assign


# TLS: PEM files, checked by shared's TlsSettings.from_files (one line, exit code 2).
MqttCaOption = Annotated[
    Path | None,
    typer.Option(
        "--mqtt-ca",
        help="PEM CA that signed the broker's certificate (mqtts:// only); default: the system's.",
        show_default=False,
    ),
]
MqttCertOption = Annotated[
    Path | None,
    typer.Option(
        "--mqtt-cert",
        help="PEM client certificate for the broker (mutual TLS). Needs --mqtt-key.",
        show_default=False,
    ),
]
MqttKeyOption = Annotated[
    Path | None,
    typer.Option("--mqtt-key", help="PEM private key of --mqtt-cert.", show_default=False),
]
TlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        help="PEM certificate (chain) to serve HTTPS with. Needs --tls-key.",
        show_default=False,
    ),
]
TlsKeyOption = Annotated[
    Path | None,
    typer.Option("--tls-key", help="PEM private key of --tls-cert.", show_default=False),
]
TlsClientCaOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-client-ca",
        help="PEM CA: HTTPS clients must then present a certificate it signed (mutual TLS).",
        show_default=False,
    ),
]


def load_key(path: Path | None, command: str) -> Any:
    from shared import SigningKey

    if path is None:
        fail(command, "no signing key: pass --sign-key FILE or set TANDEM_SIGN_KEY", 2)
    return SigningKey.load(path)


def load_trusted_key(text: str) -> PublicKey:
    """A ``--trusted-key``: a publisher.pub file, or the key itself as ``ed25519:…`` text."""
    from shared import PublicKey

    return PublicKey.from_text(text) if text.startswith("ed25519:") else PublicKey.load(Path(text))


def mqtt_settings(
    broker: str | None, ca: Path | None, cert: Path | None, key: Path | None
) -> MqttSettings | None:
    """``MqttSettings`` for ``--broker`` and the ``--mqtt-*`` files, or None without a broker."""
    from shared import MqttSettings, TlsSettings

    if not broker:
        TlsSettings.from_files(ca_certs=ca, certfile=cert, keyfile=key)  # still say what is wrong
        return None
    return MqttSettings.from_url(broker).with_tls(ca_certs=ca, certfile=cert, keyfile=key)


def size_text(value: object) -> str:
    """Bytes for a person: ``13600`` -> ``13.3 KiB``."""
    if not isinstance(value, int) or isinstance(value, bool):
        return "—"
    if value < 1024:
        return f"{value} B"
    amount = float(value)
    for unit in ("KiB", "MiB", "GiB"):
        amount /= 1024
        if amount < 1024 or unit == "GiB":
            break
    return f"{amount:.1f} {unit} ({value} B)"


def ratio_text(value: object) -> str:
    return f"{value:.2%}" if isinstance(value, int | float) else "—"
