"""Site gateways: a Mosquitto broker on the premises, bridged to the cloud broker.

::

    devices ── LAN ── site broker (the gateway) ══ bridge, over the uplink ══ cloud broker
                      users and ACL of the site                              hubs, the CDN

Devices connect to the site broker with credentials of the site (rendered by
``_dynsec`` or ``_acl``, as for a cloud broker). The site broker
runs one bridge, a client of the cloud broker whose username and client id
are ``tandem-gateway-<site>``, and which forwards (``{p}`` the topic prefix,
``<d>`` each device of the site)::

    out  {p}/dev/+/infer/+     QoS 0   requests
    out  {p}/dev/+/generate/+  QoS 1   text turns           } a stream, in order:
    out  {p}/dev/+/generate/+/+  QoS 1  (sticky: one replica) } a lost chunk would
    out  {p}/dev/+/cancel      QoS 1   their cancels        } stall the turn
    in   {p}/dev/<d>/text      QoS 1   chunks and finals    }
    out  {p}/dev/+/verify/+ (/+)  QoS 1  speculative rounds  }
    in   {p}/dev/<d>/verified  QoS 1   their verdicts       }
    out  {p}/infer/+           QoS 0   requests of the first layout (``legacy_topics``)
    out  {p}/dev/+/status      QoS 2   update reports   } kept at the site while the
    out  {p}/dev/+/telemetry   QoS 2   heartbeats       } uplink is down, sent after
    in   {p}/dev/<d>/reply     QoS 0   replies
    in   {p}/dev/<d>/assign    QoS 1   assignments, retained at the site too

Why so:

- Requests and replies at QoS 0: an answer counts only within its request's
  deadline, and past it the device answers locally (the SDK's fallback).
  Queuing requests during an outage would only hand the hubs a burst of
  stale tensors when the uplink returns.
- Text at QoS 1: a turn's chunks are a stream, and a chunk lost on the
  uplink would leave a gap the device waits on until its stall timeout
  (then it finishes the turn itself); duplicates are harmless (the device
  orders by ``seq`` and drops them, the hub runs a turn once). A turn
  queued while the uplink is down reaches the hub late: one past its budget
  is refused, not run, and the cancel its device sent meanwhile follows it.
- Reports at QoS 2 over a persistent session (``cleansession false`` and
  ``local_cleansession false``; ``persistence true`` on the site broker): the
  gateway keeps them while the uplink is down, and across its own restarts,
  and the cloud broker takes each exactly once even when the uplink dies
  with some in flight (QoS 1 would send those again). Devices must publish
  them at QoS 1 (``TelemetryReporter(agent, qos=1)``): Mosquitto queues no
  QoS 0 message for a disconnected bridge.
- ``in`` topics per device: the cloud broker gives the gateway rights on
  its own site's devices only (role ``tandem-gateway-<site>``); with the
  dynamic-security plugin it checks SUBSCRIBE, so a wildcard would be
  refused, and it would make the cloud match every reply of the fleet
  against every gateway. ``out`` topics are wildcards: the site broker holds
  the site's devices only, and the cloud checks each publish anyway.
- The first layout (``legacy_topics``, off by default as everywhere; an
  opt-in while devices of the first release migrate): the site's devices
  may publish on ``{p}/infer/+``, the bridge forwards it, and the gateway may
  publish it on the cloud; the hub answers on the reply topic the frame names
  (redirectable). Re-provision the site without it once its devices use
  their own request topics.
- ``try_private`` (Mosquitto's bridge flag) keeps the retain flag of an
  assignment forwarded live, so the site broker keeps it retained and a
  device that (re)connects during an outage still gets it.
- ``notifications_local_only``: the bridge's connection state
  (``$SYS/broker/connection/tandem-gateway-<site>/state``, 1 or 0) is
  published on the site broker only; the gateway has no right to publish
  it on the cloud, whose broker would refuse the connection's will.

Invariants:

- A site is a ``validate_name`` name, and ``tandem-gateway-<site>`` one too,
  so the gateway's name fills one topic level and lies in the services'
  ``tandem-`` namespace, which no device id may enter: a device can never
  hold a gateway's rights, nor a gateway a device's client id.
- The cloud's files change only for this gateway: its client and role (the
  plugin's file), its password line and ACL block (the plain files);
  everything else is kept byte for byte (plugin file: as parsed JSON).
- The bridge file names every device of the site (the site's credential
  store after provisioning), so adding a device never drops another.
- Every file is written whole, mode 0600 (the bridge file holds the
  gateway's password): ``write_private_file``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import ConfigError, MqttSettings, Topics, validate_name

from ._acl import (
    ACL_BLOCK_BEGIN,
    ACL_BLOCK_END,
    Provisioning,
    generate_password,
    join_acl_blocks,
    merge_password_file,
    password_file_users,
    password_line,
    provision_users,
    render_acl_file,
    split_acl_blocks,
    write_private_file,
)
from ._conf import broker_limit_lines
from ._dynsec import (
    DEVICE_ROLE_PREFIX,
    GATEWAY_ROLE_PREFIX,
    dynsec_client,
    provision_dynsec,
    read_dynsec_file,
    render_dynsec_config,
)

__all__ = [
    "BridgeOptions",
    "BrokerFiles",
    "GatewayProvisioning",
    "gateway_acl_block",
    "gateway_dynsec_role",
    "gateway_user",
    "provision_gateway",
    "render_bridge_config",
]

_SYSTEM_CAPATH = "/etc/ssl/certs"  # Debian's hashed CA directory, for an mqtts:// cloud


def gateway_user(site: str) -> str:
    """The gateway's username and client id on the cloud broker: ``tandem-gateway-<site>``."""
    return validate_name(
        f"{GATEWAY_ROLE_PREFIX}{validate_name(site, 'site name')}", "gateway name (too long)"
    )


def _site_devices(devices: Iterable[str]) -> list[str]:
    names = sorted({validate_name(d, "device id") for d in devices})
    for name in names:
        if name.startswith("tandem-"):
            raise ConfigError(f"device id {name!r} is in the services' 'tandem-' namespace")
    if not names:
        raise ConfigError("a site gateway needs at least one device")
    return names


@dataclass(frozen=True, kw_only=True)
class BridgeOptions:
    """How the bridge behaves; the defaults suit a site on a real uplink."""

    keepalive_s: int = 30  # a dead uplink is noticed within about 1.5 x this
    restart_base_s: int = 5  # reconnect backoff: decorrelated jitter from here …
    restart_cap_s: int = 60  # … up to here
    request_qos: int = 0  # requests out, replies in (see the module docstring)
    report_qos: int = 2  # status and telemetry out
    assign_qos: int = 1  # assignments in
    text_qos: int = 1  # text turns and cancels out, chunks and finals in
    cafile: Path | None = None  # the cloud broker's CA (mqtts://); None: the system's CAs

    def __post_init__(self) -> None:
        if not 1 <= self.keepalive_s <= 65535:
            raise ConfigError(f"bridge keepalive must be 1-65535 s, got {self.keepalive_s}")
        if not 1 <= self.restart_base_s <= self.restart_cap_s:
            raise ConfigError("bridge restart backoff must satisfy 1 <= base <= cap (seconds)")
        for what in ("request_qos", "report_qos", "assign_qos", "text_qos"):
            if getattr(self, what) not in (0, 1, 2):
                raise ConfigError(f"{what} must be 0, 1 or 2")


def render_bridge_config(
    site: str,
    devices: Iterable[str],
    *,
    cloud_url: str,
    password: str,
    prefix: str = "tandem/v1",
    legacy_topics: bool = False,
    options: BridgeOptions | None = None,
) -> str:
    """The bridge section of the site broker's ``mosquitto.conf`` (a ``conf.d`` file)."""
    opts = options or BridgeOptions()
    p = Topics(prefix).prefix
    name = gateway_user(site)
    names = _site_devices(devices)
    cloud = MqttSettings.from_url(cloud_url)
    if cloud.username or cloud.password:
        raise ConfigError(
            "the cloud broker URL must not carry credentials: the gateway has its own"
        )
    if not password or any(c.isspace() or c == "#" for c in password):
        raise ConfigError("the gateway password must be non-empty, without spaces or '#'")
    lines = [
        f"# Site gateway {site}: generated by 'tandem fleet provision --gateway {site}'.",
        "# The site broker needs 'persistence true' (and a persistence_location) and a",
        "# max_queued_messages that holds every report of the longest outage to ride out",
        "# (docs/site-gateways.md). This file holds the gateway's password: keep it 0600.",
        "# Tandem's frame limit (global): a larger packet is refused before it is read.",
        *broker_limit_lines(),
        f"connection {name}",
        f"address {cloud.host}:{cloud.port}",
        f"remote_clientid {name}",
        f"remote_username {name}",
        f"remote_password {password}",
        f"local_clientid local.{name}",
        "bridge_protocol_version mqttv311",
        "try_private true",
        "cleansession false",
        "local_cleansession false",
        "start_type automatic",
        f"keepalive_interval {opts.keepalive_s}",
        f"restart_timeout {opts.restart_base_s} {opts.restart_cap_s}",
        "notifications true",
        "notifications_local_only true",
        "bridge_outgoing_retain true",
    ]
    if cloud.tls is not None:
        ca = f"bridge_cafile {opts.cafile}" if opts.cafile else f"bridge_capath {_SYSTEM_CAPATH}"
        lines += [ca, "bridge_insecure false", "bridge_tls_version tlsv1.2"]
    elif opts.cafile is not None:
        raise ConfigError("a CA file for a plain-text cloud broker: use an mqtts:// URL")
    lines += [
        "# Requests out, reports out (queued while the uplink is down).",
        f"topic {p}/dev/+/infer/+ out {opts.request_qos}",
        *([f"topic {p}/infer/+ out {opts.request_qos}"] if legacy_topics else []),
        f"topic {p}/dev/+/status out {opts.report_qos}",
        f"topic {p}/dev/+/telemetry out {opts.report_qos}",
        "# Text turns and their cancels out.",
        f"topic {p}/dev/+/generate/+ out {opts.text_qos}",
        f"topic {p}/dev/+/generate/+/+ out {opts.text_qos}",
        f"topic {p}/dev/+/cancel out {opts.text_qos}",
        f"topic {p}/dev/+/verify/+ out {opts.text_qos}",
        f"topic {p}/dev/+/verify/+/+ out {opts.text_qos}",
        "# Replies, text and assignments in, for this site's devices only.",
    ]
    for device in names:
        lines.append(f"topic {p}/dev/{device}/reply in {opts.request_qos}")
        lines.append(f"topic {p}/dev/{device}/text in {opts.text_qos}")
        lines.append(f"topic {p}/dev/{device}/verified in {opts.text_qos}")
        lines.append(f"topic {p}/dev/{device}/assign in {opts.assign_qos}")
    return "\n".join(lines) + "\n"


# -- the gateway's rights on the cloud broker ----------------------------------------


def _acl(kind: str, topic: str) -> dict[str, Any]:
    return {"acltype": kind, "topic": topic, "allow": True}


def gateway_dynsec_role(
    site: str, devices: Iterable[str], prefix: str, *, legacy_topics: bool = False
) -> dict[str, Any]:
    """The plugin role of one gateway: its site's devices' topics, nothing more (and the
    first layout's request topic with ``legacy_topics``)."""
    p = Topics(prefix).prefix
    acls = [_acl("publishClientSend", f"{p}/infer/+")] if legacy_topics else []
    for device in _site_devices(devices):
        own = f"{p}/dev/{device}"
        acls += [_acl("publishClientSend", f"{own}/{leaf}") for leaf in _OUT_LEAVES]
        for leaf in _IN_LEAVES:
            acls += [_acl("subscribePattern", f"{own}/{leaf}")]
            acls += [_acl("publishClientReceive", f"{own}/{leaf}")]
    return {"rolename": gateway_user(site), "acls": acls}


_OUT_LEAVES = ("infer/+", "generate/+", "generate/+/+", "cancel", "verify/+", "verify/+/+",
               "status", "telemetry")  # fmt: skip
_IN_LEAVES = ("reply", "text", "verified", "assign")


def gateway_acl_block(
    site: str, devices: Iterable[str], prefix: str, *, legacy_topics: bool = False
) -> str:
    """The gateway's block of a plain ``acl_file`` (kept by later provisioning)."""
    p = Topics(prefix).prefix
    name = gateway_user(site)
    lines = [
        f"{ACL_BLOCK_BEGIN}{name}",
        f"# Site gateway {site}: its devices' topics only.",
        f"user {name}",
    ]
    if legacy_topics:
        lines.append(f"topic write {p}/infer/+")
    for device in _site_devices(devices):
        own = f"{p}/dev/{device}"
        lines += [f"topic write {own}/{leaf}" for leaf in _OUT_LEAVES]
        lines += [f"topic read {own}/{leaf}" for leaf in _IN_LEAVES]
    lines.append(f"{ACL_BLOCK_END}{name}")
    return "\n".join(lines) + "\n"


# -- provisioning: the site broker, the cloud broker, the bridge ----------------------


@dataclass(frozen=True)
class BrokerFiles:
    """Where one broker keeps users: the plugin's file, or the plain password and ACL files."""

    dynsec_file: Path | None = None
    passwd_file: Path | None = None
    acl_file: Path | None = None

    def __post_init__(self) -> None:
        plain = (self.passwd_file, self.acl_file)
        if (self.dynsec_file is None) == (None in plain) or (None in plain and any(plain)):
            raise ConfigError("give a dynamic-security file, or a password file with an ACL file")

    @property
    def paths(self) -> list[Path]:
        return [p for p in (self.dynsec_file, self.passwd_file, self.acl_file) if p is not None]


@dataclass(frozen=True)
class GatewayProvisioning:
    """What ``provision_gateway`` did."""

    devices: Provisioning  # the site's devices provisioned now (passwords shown once)
    gateway: str  # the gateway's username and client id on the cloud broker
    site_devices: list[str]  # every device the bridge now serves


def _site_device_set(files: BrokerFiles, services: tuple[str, str]) -> set[str]:
    """Every device the site's credential store holds now (none when it does not exist)."""
    if files.dynsec_file is not None:
        config = read_dynsec_file(files.dynsec_file)
        found: set[str] = set()
        for client in config.get("clients", []):
            user = str(client.get("username")) if isinstance(client, dict) else ""
            roles = client.get("roles") if isinstance(client, dict) else None
            wanted = f"{DEVICE_ROLE_PREFIX}{user}"
            if user not in services and any(
                isinstance(r, dict) and r.get("rolename") == wanted for r in roles or []
            ):
                found.add(user)
        return found
    assert files.passwd_file is not None
    if not files.passwd_file.exists():
        return set()
    text = files.passwd_file.read_text(encoding="utf-8")
    return {u for u in password_file_users(text) if u not in services}


def _cloud_dynsec(
    path: Path, site: str, devices: list[str], password: str, base: dict[str, Any]
) -> str:
    """The cloud's plugin file with this gateway's client and role put in (others kept)."""
    name = gateway_user(site)
    config = dict(read_dynsec_file(path) or render_dynsec_config({}, **base))
    clients = [c for c in config.get("clients", []) if c.get("username") != name]
    roles = [r for r in config.get("roles", []) if r.get("rolename") != name]
    clients.append(dynsec_client(name, password, roles=[name], clientid=name))
    roles.append(
        gateway_dynsec_role(site, devices, base["prefix"], legacy_topics=base["legacy_topics"])
    )
    config["clients"], config["roles"] = clients, roles
    return json.dumps(config, indent=2) + "\n"


def _cloud_plain(
    files: BrokerFiles, site: str, devices: list[str], password: str, base: dict[str, Any]
) -> dict[Path, str]:
    """The cloud's password and ACL files with this gateway's line and block put in."""
    assert files.passwd_file is not None and files.acl_file is not None
    name = gateway_user(site)
    passwd = files.passwd_file.read_text("utf-8") if files.passwd_file.exists() else ""
    acl = files.acl_file.read_text("utf-8") if files.acl_file.exists() else ""
    rest, blocks = split_acl_blocks(acl or render_acl_file(**base))
    blocks[name] = gateway_acl_block(
        site, devices, base["prefix"], legacy_topics=base["legacy_topics"]
    )
    return {
        files.passwd_file: merge_password_file(passwd, [password_line(name, password)]),
        files.acl_file: join_acl_blocks(rest, blocks),
    }


def _cloud_files_text(
    files: BrokerFiles, site: str, devices: list[str], password: str, base: dict[str, Any]
) -> dict[Path, str]:
    if files.dynsec_file is not None:
        return {files.dynsec_file: _cloud_dynsec(files.dynsec_file, site, devices, password, base)}
    return _cloud_plain(files, site, devices, password, base)


def _provision_site(
    names: list[str], files: BrokerFiles, site_kw: dict[str, Any], bind_client_ids: bool
) -> Provisioning:
    if files.dynsec_file is not None:
        return provision_dynsec(
            names, dynsec_file=files.dynsec_file, bind_client_ids=bind_client_ids, **site_kw
        )
    assert files.passwd_file is not None and files.acl_file is not None
    return provision_users(names, passwd_file=files.passwd_file, acl_file=files.acl_file, **site_kw)


def _check_request(names: list[str], site: str, services: tuple[str, str]) -> None:
    if any(n in services for n in names):
        raise ConfigError(
            "a site broker holds devices only: provision the hub and CDN users on the "
            "cloud broker, without --gateway"
        )
    if len(set(names)) != len(names):
        raise ConfigError("a device id is named twice")
    _site_devices(names)
    gateway_user(site)


def provision_gateway(
    site: str,
    devices: Iterable[str],
    *,
    cloud_url: str,
    bridge_file: Path,
    site_files: BrokerFiles,
    cloud_files: BrokerFiles,
    prefix: str = "tandem/v1",
    hub_user: str = "hub",
    cdn_user: str = "cdn",
    bind_client_ids: bool = True,
    legacy_topics: bool = False,
    options: BridgeOptions | None = None,
    password_out: Path | None = None,
) -> GatewayProvisioning:
    """Provision ``devices`` on the site broker, the gateway on the cloud broker, the bridge.

    The named devices get fresh passwords in ``site_files`` (others keep
    theirs); the gateway gets a fresh password, its role or ACL block in
    ``cloud_files``, and the bridge section in ``bridge_file``, which names
    every device of the site. ``legacy_topics`` (the first request layout)
    applies to all three, and to a cloud file created here. Names, the URL and every
    existing file are read and checked before anything is written
    (``ConfigError``); then the site's files (passwords first, to
    ``password_out``), the cloud's, and the bridge file.
    """
    names = list(devices)
    services = (hub_user, cdn_user)
    _check_request(names, site, services)
    every = sorted(_site_device_set(site_files, services) | set(names))
    password = generate_password()
    base = dict(prefix=prefix, hub_user=hub_user, cdn_user=cdn_user, legacy_topics=legacy_topics)
    cloud = _cloud_files_text(cloud_files, site, every, password, base)
    bridge = render_bridge_config(
        site,
        every,
        cloud_url=cloud_url,
        password=password,
        prefix=prefix,
        legacy_topics=legacy_topics,
        options=options,
    )
    site_kw = dict(base, password_out=password_out)
    done = _provision_site(names, site_files, site_kw, bind_client_ids)
    for path, text in cloud.items():
        write_private_file(path, text)
    write_private_file(bridge_file, bridge)
    return GatewayProvisioning(done, gateway_user(site), every)
