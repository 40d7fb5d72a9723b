"""``tandem fleet provision`` without ``--gateway``: one broker's users and access rules.

The options of the broker's files and of the names in its rules, declared
once here, and ``provision_broker``, which checks them, writes the files
(``tandem.broker._dynsec`` or ``tandem.broker._acl`` do the work) and
says what it did: passwords on stdout (or in ``--password-out``), one line
per user and what to reload on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ._common import clean_errors, fail

if TYPE_CHECKING:
    from tandem.broker import Provisioning

__all__ = [
    "LEGACY_TOPICS_WARNING",
    "AclFileOption",
    "BindClientIdsOption",
    "BrokerConfOption",
    "BrokerFiles",
    "CdnUserOption",
    "DynsecFileOption",
    "HubUserOption",
    "LegacyTopicsOption",
    "PasswdFileOption",
    "PasswordOutOption",
    "PrefixOption",
    "RuleNames",
    "ShareGroupOption",
    "check_broker_files",
    "provision_broker",
    "write_broker_conf",
]

LEGACY_TOPICS_WARNING = (
    "warning: --legacy-topics lets devices publish requests on <prefix>/infer/<model>, whose "
    "reply address can name another device; re-provision without it once every device "
    "publishes on its own topic"
)

DynsecFileOption = Annotated[
    Path | None,
    typer.Option(
        "--dynsec-file",
        help="Mosquitto dynamic-security plugin state (JSON): created, or merged into. "
        "The stronger configuration: SUBSCRIBE checked, client ids bound.",
        show_default=False,
    ),
]
PasswdFileOption = Annotated[
    Path | None,
    typer.Option(
        "--passwd-file",
        help="Mosquitto password_file (without the plugin): created, or merged into.",
        show_default=False,
    ),
]
AclFileOption = Annotated[
    Path | None,
    typer.Option(
        "--acl-file",
        help="Mosquitto acl_file (with --passwd-file): rewritten.",
        show_default=False,
    ),
]
PrefixOption = Annotated[str, typer.Option("--prefix", help="Topic prefix.")]
HubUserOption = Annotated[str, typer.Option("--hub-user", help="The hubs' MQTT username.")]
CdnUserOption = Annotated[
    str, typer.Option("--cdn-user", help="The CDN / rollout controller's MQTT username.")
]
ShareGroupOption = Annotated[
    str, typer.Option("--share-group", help="The hubs' shared-subscription group.")
]
LegacyTopicsOption = Annotated[
    bool,
    typer.Option(
        "--legacy-topics/--no-legacy-topics",
        help="Also let devices publish requests on <prefix>/infer/<model> (the first "
        "layout, whose reply address a device can point at another device): only while "
        "migrating devices of the first release, with 'tandem hub --legacy-topics'.",
    ),
]
BindClientIdsOption = Annotated[
    bool,
    typer.Option(
        "--bind-client-ids/--no-bind-client-ids",
        help="With --dynsec-file: each device may connect only with its id as client id.",
    ),
]
BrokerConfOption = Annotated[
    Path | None,
    typer.Option(
        "--broker-conf",
        help="Also write the broker's size limit here, a Mosquitto conf.d file "
        "(max_packet_size: Tandem's frame limit): a client sending more is disconnected "
        "before the broker reads it. Include it from mosquitto.conf (include_dir).",
        show_default=False,
    ),
]
PasswordOutOption = Annotated[
    Path | None,
    typer.Option(
        "--password-out",
        help="Write 'USER PASSWORD' lines here (mode 0600) instead of printing them.",
        show_default=False,
    ),
]


@dataclass(frozen=True)
class BrokerFiles:
    """The broker's files to write: the plugin's, or the plain password and ACL files."""

    dynsec_file: Path | None
    passwd_file: Path | None
    acl_file: Path | None
    password_out: Path | None


@dataclass(frozen=True)
class RuleNames:
    """The names the access rules are written for."""

    prefix: str
    hub_user: str
    cdn_user: str
    share_group: str
    legacy_topics: bool
    bind_client_ids: bool


def check_broker_files(command: str, files: BrokerFiles) -> None:
    """Exit 2 unless exactly one configuration is given and no two files are the same."""
    plain = files.passwd_file is not None or files.acl_file is not None
    if (files.dynsec_file is None) == (not plain) or (
        plain and None in (files.passwd_file, files.acl_file)
    ):
        fail(command, "give --dynsec-file, or --passwd-file with --acl-file", 2)
    written = [p for p in (files.dynsec_file, files.passwd_file, files.acl_file) if p]
    targets = {p.resolve() for p in written}
    out = files.password_out
    if len(targets) != len(written) or (out is not None and out.resolve() in targets):
        fail(command, "--passwd-file, --acl-file and --password-out must differ", 2)


def provision_broker(
    command: str, devices: list[str], files: BrokerFiles, names: RuleNames
) -> None:
    """Write the broker's files for ``devices`` and report what changed."""
    done = _write_broker_files(command, devices, files, names)
    if files.password_out is None:
        typer.echo(done.secrets_text(), nl=False)
    for user in devices:
        role = " (hub)" if user == names.hub_user else " (cdn)" if user == names.cdn_user else ""
        typer.echo(f"{'rotated' if user in done.rotated else 'added'} {user}{role}", err=True)
    if files.dynsec_file is not None:
        typer.echo(f"wrote {files.dynsec_file}; restart Mosquitto to load it", err=True)
    else:
        typer.echo(
            f"wrote {files.passwd_file} and {files.acl_file}; reload Mosquitto: kill -HUP <pid>",
            err=True,
        )


def write_broker_conf(command: str, path: Path | None) -> None:
    """Write the broker's size limit to ``path`` (``--broker-conf``), or say how to."""
    if path is None:
        typer.echo(
            "hint: --broker-conf FILE writes the broker's size limit (max_packet_size), "
            "which keeps a device's oversize message out of the broker and the hubs",
            err=True,
        )
        return
    from tandem.broker import write_broker_limits

    with clean_errors(command):
        write_broker_limits(path)
    typer.echo(f"wrote {path} (the size limit); restart Mosquitto to apply it", err=True)


def _write_broker_files(
    command: str, devices: list[str], files: BrokerFiles, names: RuleNames
) -> Provisioning:
    from shared import ConfigError
    from tandem.broker import provision_dynsec, provision_users, provisioning_acl

    with clean_errors(command):
        try:
            provisioning_acl(  # checks every name before anything is written
                devices,
                prefix=names.prefix,
                hub_user=names.hub_user,
                cdn_user=names.cdn_user,
                legacy_topics=names.legacy_topics,
            )
            if files.dynsec_file is not None:
                return provision_dynsec(
                    devices,
                    dynsec_file=files.dynsec_file,
                    share_group=names.share_group,
                    bind_client_ids=names.bind_client_ids,
                    password_out=files.password_out,
                    prefix=names.prefix,
                    hub_user=names.hub_user,
                    cdn_user=names.cdn_user,
                    legacy_topics=names.legacy_topics,
                )
        except ConfigError as e:
            fail(command, str(e), 2)
        assert files.passwd_file is not None and files.acl_file is not None
        return provision_users(
            devices,
            passwd_file=files.passwd_file,
            acl_file=files.acl_file,
            password_out=files.password_out,
            prefix=names.prefix,
            hub_user=names.hub_user,
            cdn_user=names.cdn_user,
            legacy_topics=names.legacy_topics,
        )
