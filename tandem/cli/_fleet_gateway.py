"""``tandem fleet provision --gateway SITE``: a site broker bridged to the cloud broker.

The options and what they write (``tandem.broker._bridge`` does the work):

- the site broker's users and rules for the named devices: ``--dynsec-file``,
  or ``--passwd-file`` with ``--acl-file`` (as without ``--gateway``);
- the gateway's credentials and rights on the cloud broker:
  ``--cloud-dynsec-file``, or ``--cloud-passwd-file`` with ``--cloud-acl-file``;
- the bridge section of the site broker's configuration: ``--bridge-file``,
  to ``--cloud-broker`` (``mqtts://`` with ``--bridge-cafile``, or the
  system's CAs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from ._common import clean_errors, fail

__all__ = [
    "BridgeCafileOption",
    "BridgeFileOption",
    "CloudAclOption",
    "CloudBrokerOption",
    "CloudDynsecOption",
    "CloudPasswdOption",
    "GatewayOption",
    "GatewayRequest",
    "provision_site_gateway",
]

_PANEL = "Site gateway (a site broker bridged to the cloud broker)"

GatewayOption = Annotated[
    str | None,
    typer.Option(
        "--gateway",
        metavar="SITE",
        help="The devices connect to SITE's own broker, bridged to the cloud broker: "
        "--dynsec-file (or --passwd-file and --acl-file) are that broker's; the bridge and "
        "the gateway's credentials on the cloud broker are written too "
        "(docs/site-gateways.md).",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
CloudBrokerOption = Annotated[
    str | None,
    typer.Option(
        "--cloud-broker",
        metavar="URL",
        help="The cloud broker the bridge connects to: mqtt://host:port or mqtts://host:port.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
BridgeFileOption = Annotated[
    Path | None,
    typer.Option(
        "--bridge-file",
        help="Write the bridge section here (mode 0600: it holds the gateway's password), "
        "e.g. /etc/mosquitto/conf.d/tandem-bridge.conf on the gateway.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
BridgeCafileOption = Annotated[
    Path | None,
    typer.Option(
        "--bridge-cafile",
        help="PEM CA of an mqtts:// cloud broker, as the gateway will find it "
        "(default: the system's CAs).",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
CloudDynsecOption = Annotated[
    Path | None,
    typer.Option(
        "--cloud-dynsec-file",
        help="The cloud broker's dynamic-security file: the gateway's client and role are "
        "put in (created if absent).",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
CloudPasswdOption = Annotated[
    Path | None,
    typer.Option(
        "--cloud-passwd-file",
        help="The cloud broker's password_file (without the plugin): the gateway's line.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
CloudAclOption = Annotated[
    Path | None,
    typer.Option(
        "--cloud-acl-file",
        help="The cloud broker's acl_file (with --cloud-passwd-file): the gateway's block.",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]


@dataclass(frozen=True)
class GatewayRequest:
    """The ``--gateway`` options of one ``fleet provision`` command line."""

    site: str | None
    cloud_broker: str | None
    bridge_file: Path | None
    bridge_cafile: Path | None
    cloud_dynsec_file: Path | None
    cloud_passwd_file: Path | None
    cloud_acl_file: Path | None

    @property
    def given(self) -> bool:
        """Whether any gateway option is on the command line."""
        return any(v is not None for v in vars(self).values())

    @property
    def cloud_paths(self) -> list[Path]:
        files = (self.cloud_dynsec_file, self.cloud_passwd_file, self.cloud_acl_file)
        return [p for p in files if p is not None]


def _check(command: str, request: GatewayRequest, site_paths: list[Path]) -> None:
    if request.site is None:
        fail(command, "--cloud-broker, --bridge-file and the --cloud-… files need --gateway", 2)
    if request.cloud_broker is None or request.bridge_file is None:
        fail(command, "--gateway needs --cloud-broker and --bridge-file", 2)
    plain = (request.cloud_passwd_file, request.cloud_acl_file)
    if (request.cloud_dynsec_file is None) == (None in plain) or (None in plain and any(plain)):
        fail(
            command,
            "--gateway needs --cloud-dynsec-file, or --cloud-passwd-file with --cloud-acl-file",
            2,
        )
    written = [*site_paths, *request.cloud_paths, request.bridge_file]
    if len({p.resolve() for p in written}) != len(written):
        fail(command, "the site files, the cloud files and --bridge-file must all differ", 2)


def provision_site_gateway(
    command: str,
    devices: list[str],
    request: GatewayRequest,
    *,
    site_files: tuple[Path | None, Path | None, Path | None],
    password_out: Path | None,
    prefix: str,
    hub_user: str,
    cdn_user: str,
    bind_client_ids: bool,
    legacy_topics: bool,
) -> None:
    """Run ``fleet provision --gateway``: print the site's new passwords, say what was written."""
    from shared import ConfigError
    from tandem.broker import BridgeOptions, BrokerFiles, provision_gateway

    dynsec_file, passwd_file, acl_file = site_files
    _check(command, request, [p for p in site_files if p is not None])
    assert request.site is not None and request.cloud_broker is not None
    assert request.bridge_file is not None
    with clean_errors(command):
        try:
            done = provision_gateway(
                request.site,
                devices,
                cloud_url=request.cloud_broker,
                bridge_file=request.bridge_file,
                site_files=BrokerFiles(dynsec_file, passwd_file, acl_file),
                cloud_files=BrokerFiles(
                    request.cloud_dynsec_file, request.cloud_passwd_file, request.cloud_acl_file
                ),
                prefix=prefix,
                hub_user=hub_user,
                cdn_user=cdn_user,
                bind_client_ids=bind_client_ids,
                legacy_topics=legacy_topics,
                options=BridgeOptions(cafile=request.bridge_cafile),
                password_out=password_out,
            )
        except ConfigError as e:
            fail(command, str(e), 2)
    if password_out is None:
        typer.echo(done.devices.secrets_text(), nl=False)
    for user in devices:
        typer.echo(f"{'rotated' if user in done.devices.rotated else 'added'} {user}", err=True)
    site_written = " and ".join(str(p) for p in site_files if p is not None)
    cloud_written = " and ".join(str(p) for p in request.cloud_paths)
    typer.echo(
        f"site {request.site}: {len(done.site_devices)} devices; wrote {site_written} "
        f"and {request.bridge_file} for the site broker (restart it), {cloud_written} for "
        f"the cloud broker ({done.gateway}, a fresh password; reload or restart it first)",
        err=True,
    )
