"""``tandem fleet``: per-device MQTT credentials and the topic ACL, for Mosquitto.

``provision`` gives each named device (or the hub / CDN service user) a fresh
random password in the Mosquitto password file, keeping every other user,
and rewrites the ACL file. Passwords are shown once: on stdout, or in
``--password-out`` (mode 0600). Failures are one line on stderr and exit 1
(the work failed) or 2 (the command line was wrong).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._cli_common import clean_errors, fail

__all__ = ["fleet_app"]

fleet_app = typer.Typer(no_args_is_help=True, add_completion=False)


@fleet_app.callback()
def _fleet() -> None:
    """Device credentials and topic ACLs for the MQTT broker."""


@fleet_app.command("provision")
def fleet_provision(
    devices: Annotated[
        list[str],
        typer.Argument(
            help="Device ids (the MQTT username of each), or the --hub-user / --cdn-user names.",
            show_default=False,
        ),
    ],
    passwd_file: Annotated[
        Path,
        typer.Option(
            "--passwd-file",
            help="Mosquitto password_file: created, or merged into.",
            show_default=False,
        ),
    ],
    acl_file: Annotated[
        Path,
        typer.Option("--acl-file", help="Mosquitto acl_file: rewritten.", show_default=False),
    ],
    prefix: Annotated[str, typer.Option("--prefix", help="Topic prefix.")] = "tandem/v1",
    hub_user: Annotated[str, typer.Option("--hub-user", help="The hubs' MQTT username.")] = "hub",
    cdn_user: Annotated[
        str, typer.Option("--cdn-user", help="The CDN / rollout controller's MQTT username.")
    ] = "cdn",
    password_out: Annotated[
        Path | None,
        typer.Option(
            "--password-out",
            help="Write 'USER PASSWORD' lines here (mode 0600) instead of printing them.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Give devices (new or existing) a fresh password and rewrite the topic ACL.

    A device named again gets a new password (rotation); users not named keep
    theirs. Each device may publish requests, its own status and telemetry,
    and read only its own replies and assignments. Provision the hub and CDN
    users by naming them like devices.

    Example:

        tandem fleet provision hub cdn cam-01 cam-02 \\
            --passwd-file /etc/mosquitto/tandem.passwd \\
            --acl-file /etc/mosquitto/tandem.acl --password-out new-passwords.txt

    Mosquitto reads both files at start; make it read them again with
    'kill -HUP <mosquitto pid>' (or 'systemctl reload mosquitto'). Both files
    must be readable by the user Mosquitto runs as: chown them once, ownership
    is kept on later rewrites.
    """
    from shared import ConfigError

    from ._mqtt_acl import (
        check_device_names,
        generate_password,
        merge_password_file,
        password_file_users,
        password_line,
        render_acl_file,
        write_private_file,
    )

    with clean_errors("fleet provision"):
        try:
            acl_text = render_acl_file(prefix, hub_user=hub_user, cdn_user=cdn_user)
            services = {hub_user, cdn_user}
            check_device_names(
                [d for d in devices if d not in services], hub_user=hub_user, cdn_user=cdn_user
            )
            if len(set(devices)) != len(devices):
                raise ConfigError("a name is given twice")
        except ConfigError as e:
            fail("fleet provision", str(e), 2)
        targets = {passwd_file.resolve(), acl_file.resolve()}
        if len(targets) != 2 or (password_out is not None and password_out.resolve() in targets):
            fail("fleet provision", "--passwd-file, --acl-file and --password-out must differ", 2)

        existing = passwd_file.read_text(encoding="utf-8") if passwd_file.exists() else ""
        known = set(password_file_users(existing))
        passwords = {user: generate_password() for user in devices}
        merged = merge_password_file(
            existing, (password_line(user, pw) for user, pw in passwords.items())
        )
        secrets_text = "".join(f"{user} {pw}\n" for user, pw in passwords.items())
        # Passwords first: if that fails, nothing is changed and nothing is lost.
        if password_out is not None:
            write_private_file(password_out, secrets_text)
        write_private_file(passwd_file, merged)
        write_private_file(acl_file, acl_text)

    if password_out is None:
        typer.echo(secrets_text, nl=False)
    for user in devices:
        role = " (hub)" if user == hub_user else " (cdn)" if user == cdn_user else ""
        action = "rotated" if user in known else "added"
        typer.echo(f"{action} {user}{role}", err=True)
    typer.echo(f"wrote {passwd_file} and {acl_file}; reload Mosquitto: kill -HUP <pid>", err=True)
