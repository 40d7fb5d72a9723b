"""``tandem fleet``: per-device MQTT credentials and the topic ACL; the fleet the CDN sees.

``list`` and ``show`` ask the CDN's admin API (``--cdn``, ``--token``, as
``tandem rollout``) which devices reported telemetry, with their labels,
models and health; ``label`` records the operator's labels of devices (what
rollouts target: a device's own claims never are). ``simulate`` runs a fleet of simulated devices
(``_fleet_simulate``). ``provision`` gives each named device (or the hub / CDN
service user) a fresh random password, keeping every other user, in the
Mosquitto dynamic-security plugin's file (``--dynsec-file``: roles, bound
client ids) or in the plain password and ACL files. Passwords are shown
once: on stdout, or in ``--password-out`` (mode 0600). Failures are one line
on stderr and exit 1 (the work failed) or 2 (the command line was wrong).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ._admin import (
    DEFAULT_CDN,
    CaOption,
    CdnOption,
    JsonOption,
    TokenOption,
    admin_call,
    admin_client,
    ago_text,
    parse_labels,
    plain_console,
    print_json,
)
from ._common import fail, ratio_text
from ._fleet_gateway import (
    BridgeCafileOption,
    BridgeFileOption,
    CloudAclOption,
    CloudBrokerOption,
    CloudDynsecOption,
    CloudPasswdOption,
    GatewayOption,
    GatewayRequest,
    provision_site_gateway,
)
from ._fleet_provision import (
    LEGACY_TOPICS_WARNING,
    AclFileOption,
    BindClientIdsOption,
    BrokerConfOption,
    BrokerFiles,
    CdnUserOption,
    DynsecFileOption,
    HubUserOption,
    LegacyTopicsOption,
    PasswdFileOption,
    PasswordOutOption,
    PrefixOption,
    RuleNames,
    ShareGroupOption,
    check_broker_files,
    provision_broker,
    write_broker_conf,
)
from ._fleet_simulate import fleet_simulate
from ._rollout_view import console

__all__ = ["fleet_app"]

fleet_app = typer.Typer(no_args_is_help=True, add_completion=False)


@fleet_app.callback()
def _fleet() -> None:
    """Device credentials and topic ACLs for the MQTT broker; the devices the CDN has seen."""


@fleet_app.command("provision")
def fleet_provision(
    devices: Annotated[
        list[str],
        typer.Argument(
            help="Device ids (the MQTT username of each), or the --hub-user / --cdn-user names.",
            show_default=False,
        ),
    ],
    dynsec_file: DynsecFileOption = None,
    passwd_file: PasswdFileOption = None,
    acl_file: AclFileOption = None,
    prefix: PrefixOption = "tandem/v1",
    hub_user: HubUserOption = "hub",
    cdn_user: CdnUserOption = "cdn",
    share_group: ShareGroupOption = "hubs",
    legacy_topics: LegacyTopicsOption = False,
    bind_client_ids: BindClientIdsOption = True,
    password_out: PasswordOutOption = None,
    broker_conf: BrokerConfOption = None,
    gateway: GatewayOption = None,
    cloud_broker: CloudBrokerOption = None,
    bridge_file: BridgeFileOption = None,
    bridge_cafile: BridgeCafileOption = None,
    cloud_dynsec_file: CloudDynsecOption = None,
    cloud_passwd_file: CloudPasswdOption = None,
    cloud_acl_file: CloudAclOption = None,
) -> None:
    """Give devices (new or existing) a fresh password and rewrite the broker's access rules.

    A device named again gets a new password (rotation); users not named keep
    theirs. Each device may publish its own requests, status and telemetry,
    and read only its own replies and assignments. Provision the hub and CDN
    users by naming them like devices.

    With the dynamic-security plugin (Mosquitto 2.0+), preferred:

        tandem fleet provision hub cdn cam-01 cam-02 \\
            --dynsec-file /etc/mosquitto/tandem-dynsec.json --password-out new-passwords.txt \\
            --broker-conf /etc/mosquitto/conf.d/tandem-limits.conf

    The plugin reads its file at start: restart Mosquitto after provisioning.
    Without the plugin, the plain files:

        tandem fleet provision hub cdn cam-01 cam-02 \\
            --passwd-file /etc/mosquitto/tandem.passwd \\
            --acl-file /etc/mosquitto/tandem.acl --password-out new-passwords.txt

    Mosquitto reads these again on 'kill -HUP <mosquitto pid>' (or
    'systemctl reload mosquitto'). Every file must be readable by the user
    Mosquitto runs as: chown it once, ownership is kept on later rewrites.
    docs/mqtt-security.md lists what each configuration stops.

    Devices behind a site gateway (a broker on the premises, bridged to the
    cloud broker): the site files are the site broker's, and the bridge and
    the gateway's credentials on the cloud broker are written too:

        tandem fleet provision cam-01 cam-02 --gateway plant-a \\
            --dynsec-file plant-a/dynsec.json --bridge-file plant-a/bridge.conf \\
            --cloud-broker mqtts://cloud.example:8883 \\
            --cloud-dynsec-file /etc/mosquitto/tandem-dynsec.json

    docs/site-gateways.md describes the topology and the site broker's configuration.
    """
    command = "fleet provision"
    files = BrokerFiles(dynsec_file, passwd_file, acl_file, password_out)
    check_broker_files(command, files)
    if legacy_topics:
        typer.echo(LEGACY_TOPICS_WARNING, err=True)
    site = GatewayRequest(
        gateway,
        cloud_broker,
        bridge_file,
        bridge_cafile,
        cloud_dynsec_file,
        cloud_passwd_file,
        cloud_acl_file,
    )
    if not site.given:
        names = RuleNames(prefix, hub_user, cdn_user, share_group, legacy_topics, bind_client_ids)
        provision_broker(command, devices, files, names)
        write_broker_conf(command, broker_conf)
        return
    provision_site_gateway(
        command,
        devices,
        site,
        site_files=(dynsec_file, passwd_file, acl_file),
        password_out=password_out,
        prefix=prefix,
        hub_user=hub_user,
        cdn_user=cdn_user,
        bind_client_ids=bind_client_ids,
        legacy_topics=legacy_topics,
    )
    write_broker_conf(command, broker_conf)


# -- the fleet as the CDN sees it ---------------------------------------------


def _share(part: object, whole: object) -> str:
    """``part / whole`` as a percentage, or — when there is nothing to divide."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (part, whole)):
        return "—"
    assert isinstance(part, int) and isinstance(whole, int)
    return ratio_text(part / whole) if whole > 0 else "—"


def _pairs(mapping: object, sep: str = "=") -> str:
    if not isinstance(mapping, dict) or not mapping:
        return "—"
    return ",".join(f"{k}{sep}{v}" for k, v in sorted(mapping.items()))


def _telemetry(device: dict[str, Any]) -> dict[str, Any] | None:
    telemetry = device.get("telemetry")
    return telemetry if isinstance(telemetry, dict) else None


def _online(device: dict[str, Any]) -> str:
    online = device.get("online")
    return "yes" if online is True else "no" if online is False else "—"


@fleet_app.command("list")
def fleet_list(
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="LABEL=VALUE a device must have (repeat: all must match).",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Only devices running this model.", show_default=False),
    ] = None,
    version: Annotated[
        int | None,
        typer.Option(
            "--version", help="Only devices running this version of --model.", show_default=False
        ),
    ] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Never cut the table.")] = False,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the devices the CDN has heard from: labels, models, last seen, offloads, agreement.

    Offload rate and agreement are over the device's current model version
    (its telemetry counters reset when it swaps models).

    Example: tandem fleet list --label site=factory-a --model mnist --version 3
    """
    from shared import NAME_PATTERN

    command = "fleet list"
    labels = parse_labels(label or [], "--label", command)
    if model is not None and not NAME_PATTERN.fullmatch(model):
        fail(command, f"invalid model name {model!r:.80}", 2)
    if version is not None and (model is None or version < 1):
        fail(command, "--version needs --model and a version ≥ 1", 2)
    client = admin_client(command, cdn, token, ca)
    devices = admin_call(command, client.list_devices, labels, model, version)
    if as_json:
        print_json({"devices": devices})
        return
    if not devices:
        typer.echo("no devices match" if labels or model else "no devices have reported yet")
        return
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in ("device", "labels", "models", "last seen", "online", "offloads", "agreement"):
        table.add_column(column, no_wrap=True)
    for d in devices:
        t = _telemetry(d) or {}
        claims = " (claims differ)" if d.get("labels_differ") is True else ""
        table.add_row(
            str(d.get("device", "?")),
            _pairs(d.get("labels")) + claims,
            _pairs(d.get("models"), "@"),
            ago_text(d.get("last_seen")),
            _online(d),
            _share(t.get("offloads"), t.get("requests")),
            _share(t.get("agreed"), t.get("agreement_samples")),
        )
    console(wide=wide).print(table)


@fleet_app.command("show")
def fleet_show(
    device: Annotated[
        str, typer.Argument(metavar="DEVICE", help="The device id.", show_default=False)
    ],
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one device: labels, capabilities, models, and its last telemetry report.

    Example: tandem fleet show cam-01 --cdn http://cdn:8700
    """
    from shared import NAME_PATTERN

    command = "fleet show"
    if not NAME_PATTERN.fullmatch(device):
        fail(command, f"invalid device id {device!r:.80}", 2)
    client = admin_client(command, cdn, token, ca)
    d = admin_call(command, client.get_device, device)
    if as_json:
        print_json(d)
        return
    from rich.table import Table

    t = _telemetry(d)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    rows = [
        ("device", str(d.get("device", device))),
        ("labels", _pairs(d.get("labels"))),
        ("claimed labels", _pairs(d.get("claimed_labels"))),
        ("capabilities", _pairs(d.get("capabilities"))),
        ("models", _pairs(d.get("models"), "@")),
        ("online", _online(d)),
        ("first seen", ago_text(d.get("first_seen"))),
        ("last seen", ago_text(d.get("last_seen"))),
    ]
    if t is None:
        rows.append(("telemetry", "none yet"))
    else:
        serving = f"{t.get('model')}@{t.get('version')}" if t.get("model") else "—"
        p50, p99 = t.get("p50_ms"), t.get("p99_ms")
        rows += [
            ("serving", serving),
            ("requests", str(t.get("requests", "—"))),
            ("errors", f"{t.get('errors', '—')} ({_share(t.get('errors'), t.get('requests'))})"),
            (
                "offloads",
                f"{t.get('offloads', '—')} ({_share(t.get('offloads'), t.get('requests'))})",
            ),
            (
                "agreement",
                f"{_share(t.get('agreed'), t.get('agreement_samples'))} of "
                f"{t.get('agreement_samples', '—')} samples",
            ),
            (
                "latency",
                " ".join(
                    f"{name} {v:.1f} ms"
                    for name, v in (("p50", p50), ("p99", p99))
                    if isinstance(v, int | float)
                )
                or "—",
            ),
            ("reported", ago_text(t.get("at"))),
        ]
    for name, value in rows:
        grid.add_row(name, value)
    plain_console().print(grid)


@fleet_app.command("label")
def fleet_label(
    devices: Annotated[
        list[str] | None,
        typer.Argument(metavar="[DEVICE]...", help="Device ids to label.", show_default=False),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--set", help="LABEL=VALUE (repeat); replaces the device's labels."),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help='JSON inventory {"<device>": {"<label>": "<value>"}} (instead of DEVICE --set).',
            show_default=False,
        ),
    ] = None,
    cdn: CdnOption = DEFAULT_CDN,
    token: TokenOption = None,
    ca: CaOption = None,
) -> None:
    """Record the operator's labels of devices at the CDN (what rollouts target).

    A device's telemetry may claim labels too; they are shown next to these
    (fleet show), never used to pick devices.

    Example: tandem fleet label cam-01 cam-02 --set site=factory-a --set hw=npu
    """
    import json

    from shared import NAME_PATTERN

    command = "fleet label"
    if from_file is not None:
        if devices or label:
            fail(command, "--file replaces DEVICE... --set: give one or the other", 2)
        try:
            inventory = json.loads(from_file.read_text())
        except (OSError, ValueError) as e:
            fail(command, f"cannot read {from_file}: {e}", 2)
    else:
        if not devices or not label:
            fail(command, "name devices and at least one --set LABEL=VALUE (or --file)", 2)
        labels = parse_labels(label, "--set", command)
        inventory = dict.fromkeys(devices, labels)
    if not isinstance(inventory, dict) or not all(
        isinstance(d, str) and NAME_PATTERN.fullmatch(d) for d in inventory
    ):
        fail(command, "the inventory maps device ids to label objects", 2)
    client = admin_client(command, cdn, token, ca)
    done = admin_call(command, client.set_labels, inventory)
    typer.echo(f"labelled {len(done)} device(s)")


fleet_app.command("simulate")(fleet_simulate)
