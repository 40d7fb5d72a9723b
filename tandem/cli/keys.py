"""``tandem keys``: the publisher's signing key pair, and API keys for the HTTP servers.

``generate`` writes publisher.key (mode 0600) and publisher.pub; ``create``,
``list`` and ``revoke`` manage the API key file that ``tandem hub`` and
``tandem cdn serve`` read (``shared.ApiKeyFile``). Failures are one line on
stderr: exit 1 when the work failed, 2 when the command line was wrong.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from ._common import clean_errors, fail

__all__ = ["keys_app"]

keys_app = typer.Typer(no_args_is_help=True, add_completion=False)


@keys_app.callback()
def _keys() -> None:
    """The publisher's signing key (generate), and API keys for the HTTP servers (create,
    list, revoke)."""


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
