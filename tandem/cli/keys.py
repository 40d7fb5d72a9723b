"""``tandem keys``: signing key pairs, the root of trust, and API keys for the HTTP servers.

``generate`` writes a key pair (publisher.key, mode 0600, and publisher.pub);
``root init`` writes root version 1 (which keys hold the root, publisher
and assigner roles, and each role's threshold) and ``rotate`` the next root
(``model_cdn.trust_repo``; docs/key-ceremony.md); ``create``,
``list`` and ``revoke`` manage the API key file that ``tandem hub`` and
``tandem cdn serve`` read (``shared.ApiKeyFile``). Failures are one line on
stderr: exit 1 when the work failed, 2 when the command line was wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from shared import atomic_write_bytes

from ._common import clean_errors, fail

__all__ = ["keys_app"]

keys_app = typer.Typer(no_args_is_help=True, add_completion=False)


@keys_app.callback()
def _keys() -> None:
    """Signing keys (generate), the root of trust with roles and thresholds (root init,
    rotate), and API keys for the HTTP servers (create, list, revoke)."""


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by the owner only, atomically (never a world-readable moment)."""
    atomic_write_bytes(path, text.encode(), mode=0o600)


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
        atomic_write_bytes(public, (key.public_key.to_text() + "\n").encode())
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
            help="infer, generate, models:read, models:publish or rollout:admin "
            "(repeat for several).",
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
    from shared.server import API_KEY_SCOPES, ApiKeyFile, generate_api_key

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

    from shared.server import ApiKeyFile

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
    from shared.server import ApiKeyFile

    with clean_errors("keys revoke"):
        key = ApiKeyFile(keys_file).revoke(key_id)
    typer.echo(f"key {key.id} revoked at {key.revoked}")


# -- the root of trust: roles, thresholds, rotation ------------------------------------------

root_app = typer.Typer(no_args_is_help=True, add_completion=False)
keys_app.add_typer(root_app, name="root")

TrustDirOption = Annotated[
    Path,
    typer.Option(
        "--trust-dir",
        help="Directory of signed roots (<n>.root.json); 'tandem cdn serve --trust-dir' "
        "serves it to devices.",
        file_okay=False,
        show_default=False,
    ),
]
SignWithOption = Annotated[
    list[Path],
    typer.Option(
        "--sign-with",
        help="A private key that signs the root (repeat: a threshold of the old root keys "
        "and of the new ones must sign).",
        dir_okay=False,
        show_default=False,
    ),
]
ExpiresOption = Annotated[
    int, typer.Option("--expires-days", help="Days until devices refuse this root.", min=1)
]


def _public(texts: list[str] | None) -> list[Any]:
    from ._common import load_trusted_key

    return [load_trusted_key(t) for t in texts or []]


def _expiry(days: int) -> str:
    from datetime import UTC, datetime, timedelta

    from shared import format_time

    return format_time(datetime.now(UTC) + timedelta(days=days))


def _describe(root: Any, where: Path) -> None:
    typer.echo(f"root version {root.version} written to {where}/{root.version}.root.json")
    for name in ("root", "publisher", "assigner"):
        role = root.roles[name]
        ids = ", ".join(k[:12] for k in role.keyids)
        typer.echo(f"  {name:<9} {role.threshold} of {len(role.keyids)}: {ids}")
    typer.echo(f"  expires   {root.expires_at}")


@root_app.callback()
def _root() -> None:
    """The root of trust devices pin: which keys may publish models, assign them, or change
    the root, and how many of each must sign."""


@root_app.command("init")
def keys_root_init(
    trust_dir: TrustDirOption,
    root_key: Annotated[
        list[str], typer.Option("--root-key", help="A root key (.pub file or 'ed25519:…').")
    ],
    publisher_key: Annotated[
        list[str], typer.Option("--publisher-key", help="A key that signs manifests (offline).")
    ],
    assigner_key: Annotated[
        list[str],
        typer.Option("--assigner-key", help="A key that signs assignments (the rollout server)."),
    ],
    sign_with: SignWithOption,
    root_threshold: Annotated[int, typer.Option("--root-threshold", min=1)] = 1,
    publisher_threshold: Annotated[int, typer.Option("--publisher-threshold", min=1)] = 1,
    assigner_threshold: Annotated[int, typer.Option("--assigner-threshold", min=1)] = 1,
    expires_days: ExpiresOption = 365,
) -> None:
    """Write root version 1, signed by a threshold of its own root keys.

    Give 1.root.json to devices at provisioning (ModelUpdater(trusted_keys=
    TrustedRoot.bootstrap(...))); docs/key-ceremony.md walks through it.

    Example: tandem keys root init --trust-dir trust --root-key r1.pub --root-key r2.pub
    --root-threshold 2 --publisher-key publisher.pub --assigner-key rollout.pub
    --sign-with r1.key --sign-with r2.key
    """
    from model_cdn.trust_repo import TrustRepository
    from shared import SigningKey

    with clean_errors("keys root init"):
        roles = {
            "root": (_public(root_key), root_threshold),
            "publisher": (_public(publisher_key), publisher_threshold),
            "assigner": (_public(assigner_key), assigner_threshold),
        }
        signers = [SigningKey.load(p) for p in sign_with]
        root = TrustRepository(trust_dir).init(roles, signers, expires_at=_expiry(expires_days))
    _describe(root, trust_dir)


@keys_app.command("rotate")
def keys_rotate(
    role: Annotated[str, typer.Argument(help="root, publisher or assigner.", show_default=False)],
    trust_dir: TrustDirOption,
    sign_with: SignWithOption,
    add_key: Annotated[
        list[str] | None, typer.Option("--add-key", help="A key the role gains.")
    ] = None,
    remove_key: Annotated[
        list[str] | None,
        typer.Option("--remove-key", help="A key the role loses (.pub, 'ed25519:…' or key id)."),
    ] = None,
    threshold: Annotated[
        int | None, typer.Option("--threshold", help="The role's new threshold.", min=1)
    ] = None,
    expires_days: ExpiresOption = 365,
) -> None:
    """Write the next root with ROLE's keys or threshold changed.

    Checked as a device checks it before it is written: a threshold of the
    current root keys and of the new root's root keys must sign (--sign-with).
    Devices fetch it from the CDN before their next update; from then on a
    removed key's signatures do not count.

    Example: tandem keys rotate publisher --trust-dir trust --add-key new.pub
    --remove-key old.pub --sign-with r1.key --sign-with r2.key
    """
    from model_cdn.trust_repo import TrustRepository
    from shared import SigningKey

    command = "keys rotate"
    if role not in ("root", "publisher", "assigner"):
        fail(command, f"unknown role {role!r}: use root, publisher or assigner", 2)
    if not (add_key or remove_key or threshold):
        fail(command, "nothing to change: give --add-key, --remove-key or --threshold", 2)
    with clean_errors(command):
        removed = [
            t if len(t) == 64 and all(c in "0123456789abcdef" for c in t) else None
            for t in remove_key or []
        ]
        removed_ids = [
            keyid if keyid is not None else _public([text])[0].keyid
            for keyid, text in zip(removed, remove_key or [], strict=True)
        ]
        root = TrustRepository(trust_dir).rotate(
            role,
            [SigningKey.load(p) for p in sign_with],
            add=_public(add_key),
            remove=removed_ids,
            threshold=threshold,
            expires_at=_expiry(expires_days),
        )
    _describe(root, trust_dir)
