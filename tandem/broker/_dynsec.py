"""Broker-enforced identity: the Mosquitto dynamic-security plugin's state file for a fleet.

``render_dynsec_config`` renders, offline, the JSON file that Mosquitto's
dynamic-security plugin (``mosquitto_dynamic_security.so``, Mosquitto 2.0+)
loads at start (``plugin_opt_config_file``); ``provision_dynsec`` (what
``tandem fleet provision --dynsec-file`` calls) merges fresh passwords into
an existing file. Unlike the plain ``acl_file`` (``_acl``), the plugin
checks SUBSCRIBE (so a device cannot join the hubs' share group) and binds a
client id to its credentials (so a device cannot take another's id and have
the broker disconnect it)::

    client <device>   clientid = <device> (bound: the CONNECT must carry it)
      role tandem-device-<device>
        publishClientSend     {p}/dev/<device>/infer/+  generate/+  generate/+/+  cancel
                              verify/+  verify/+/+  status  telemetry   (generate/+/+,
                              verify/+/+: for one hub replica)
                              ({p}/infer/+ too with legacy_topics, for a migration)
        subscribePattern      {p}/dev/<device>/#        (its own subtree only)
        publishClientReceive  {p}/dev/<device>/reply    {p}/dev/<device>/text
                              {p}/dev/<device>/verified
                              {p}/dev/<device>/assign
    client <hub>      role tandem-hub
        subscribePattern      $share/<group>/{p}/dev/+/infer/+   {p}/dev/+/infer/+
                              $share/<group>/{p}/dev/+/generate/+   {p}/dev/+/generate/+
                              $share/<group>/{p}/dev/+/generate/+/+ {p}/dev/+/generate/+/+
                              $share/<group>/{p}/dev/+/verify/+ (and /+/+), and unshared
                              {p}/dev/+/cancel   (never shared: every replica hears a cancel)
                              $share/<group>/{p}/infer/+         {p}/infer/+   (legacy)
        publishClientReceive  {p}/dev/+/infer/+   {p}/dev/+/generate/+   {p}/dev/+/cancel
                              {p}/dev/+/generate/+/+   {p}/dev/+/verify/+   (and /+/+)
                              {p}/infer/+
        publishClientSend     {p}/dev/+/reply   {p}/dev/+/text   {p}/dev/+/verified
    client <cdn>      role tandem-cdn
        publishClientSend     {p}/dev/+/assign
        subscribePattern      {p}/dev/+/status   {p}/dev/+/telemetry
        publishClientReceive  {p}/dev/+/status   {p}/dev/+/telemetry
    defaultACLAccess: everything denied but unsubscribing

The plugin has no ``%u`` substitution (2.0.11 does not expand it), hence one
role per device. Services are not bound to a client id (a hub runs several
connections); their client ids start with ``tandem-`` (``SERVICE_CLIENT_ID_PREFIX``),
which no device id may, so no device's bound id can collide with a service's
connection and disconnect it.

Invariants:

- Only what this module manages is rewritten: clients holding a
  ``tandem-`` role, and ``tandem-`` roles. Other clients (an ``admin`` made
  by ``mosquitto_ctrl dynsec init``), roles, groups and the anonymous group
  are kept as they were, so the plugin's own control API and this command
  can share one file. So are site gateways' clients and roles
  (``tandem-gateway-<site>``, written by ``_bridge``).
- A client not named keeps its password hash; a named one gets a fresh
  random password (rotation), hashed as the plugin does (PBKDF2-SHA512,
  12-byte salt, base64), and shown once.
- The device set is every managed client already in the file plus those
  named; a device is never dropped by provisioning another.
- What Mosquitto 2.0's plugin cannot do: deny ``retain`` on a topic it lets
  a client publish to (its ACLs carry no retain condition). A device may
  still leave a retained request on its own request topic; hubs ignore
  retained requests (``cloud_hub``), and docs/mqtt-security.md says how to
  clear one and which brokers refuse it outright.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shared import ConfigError, Topics, validate_name

from ._acl import (
    DEFAULT_ITERATIONS,
    Provisioning,
    check_device_names,
    generate_password,
    write_private_file,
)

__all__ = [
    "DEVICE_ROLE_PREFIX",
    "DYNSEC_PLUGIN_NAME",
    "GATEWAY_ROLE_PREFIX",
    "SERVICE_CLIENT_ID_PREFIX",
    "device_role_name",
    "dynsec_client",
    "dynsec_password_matches",
    "provision_dynsec",
    "read_dynsec_file",
    "render_dynsec_config",
]

DYNSEC_PLUGIN_NAME = "mosquitto_dynamic_security.so"
SERVICE_CLIENT_ID_PREFIX = "tandem-"  # hubs' and the CDN's client ids; no device id may start so
_MANAGED = "tandem-"  # prefix of the roles this module owns
# Site gateways' clients and roles (``_bridge``): provisioning devices keeps them as they are.
GATEWAY_ROLE_PREFIX = "tandem-gateway-"
DEVICE_ROLE_PREFIX = "tandem-device-"  # + the device id: one role per device
_HUB_ROLE, _CDN_ROLE = "tandem-hub", "tandem-cdn"
_SALT_BYTES = 12


def device_role_name(device: str) -> str:
    return f"{DEVICE_ROLE_PREFIX}{validate_name(device, 'device id')}"


def _acl(kind: str, topic: str) -> dict[str, Any]:
    return {"acltype": kind, "topic": topic, "allow": True}


def _device_role(p: str, device: str, *, legacy_topics: bool) -> dict[str, Any]:
    own = f"{p}/dev/{device}"
    sends = [f"{own}/infer/+", f"{own}/generate/+", f"{own}/generate/+/+", f"{own}/cancel",
             f"{own}/verify/+", f"{own}/verify/+/+", f"{own}/status",
             f"{own}/telemetry"]  # fmt: skip
    if legacy_topics:
        sends.append(f"{p}/infer/+")
    reads = [f"{own}/reply", f"{own}/text", f"{own}/verified", f"{own}/assign"]
    return {
        "rolename": device_role_name(device),
        "acls": [_acl("publishClientSend", t) for t in sends]
        + [_acl("subscribePattern", f"{own}/#")]  # what arrives is limited just below
        + [_acl("publishClientReceive", t) for t in reads],
    }


def _service_roles(p: str, share_group: str) -> list[dict[str, Any]]:
    sticky = f"{p}/dev/+/generate/+/+"  # turns for one replica (its ingress processes share)
    verify = [f"{p}/dev/+/verify/+", f"{p}/dev/+/verify/+/+"]  # speculative rounds
    requests = [f"{p}/dev/+/infer/+", f"{p}/dev/+/generate/+", sticky, f"{p}/infer/+", *verify]
    cancels = f"{p}/dev/+/cancel"  # not shared: the replica running the turn must hear it
    subscriptions = [f"$share/{share_group}/{t}" for t in requests] + requests + [cancels]
    reports = [f"{p}/dev/+/status", f"{p}/dev/+/telemetry"]
    return [
        {
            "rolename": _HUB_ROLE,
            "acls": [_acl("subscribePattern", t) for t in subscriptions]
            + [_acl("publishClientReceive", t) for t in [*requests, cancels]]
            + [
                _acl("publishClientSend", t)
                for t in (f"{p}/dev/+/reply", f"{p}/dev/+/text", f"{p}/dev/+/verified")
            ],
        },
        {
            "rolename": _CDN_ROLE,
            "acls": [_acl("publishClientSend", f"{p}/dev/+/assign")]
            + [_acl("subscribePattern", t) for t in reports]
            + [_acl("publishClientReceive", t) for t in reports],
        },
    ]


def dynsec_client(
    username: str,
    password: str,
    *,
    roles: Iterable[str],
    clientid: str | None = None,
    salt: bytes | None = None,
    iterations: int = DEFAULT_ITERATIONS,
) -> dict[str, Any]:
    """One plugin client with ``password`` hashed the plugin's way."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, dklen=64)
    client: dict[str, Any] = {
        "username": validate_name(username, "MQTT username"),
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": iterations,
        "roles": [{"rolename": r} for r in roles],
    }
    if clientid is not None:
        client["clientid"] = clientid
    return client


def dynsec_password_matches(client: dict[str, Any], password: str) -> bool:
    """Whether ``password`` is the one ``client``'s hash was made from (as the plugin checks)."""
    try:
        salt = base64.b64decode(client["salt"], validate=True)
        expected = base64.b64decode(client["password"], validate=True)
        iterations = int(client["iterations"])
    except (KeyError, ValueError, TypeError):
        return False
    got = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, dklen=64)
    return got == expected


def _is_ours(rolename: object) -> bool:
    """A role this module renders again on every provisioning (a gateway's is not)."""
    name = str(rolename or "")
    return name.startswith(_MANAGED) and not name.startswith(GATEWAY_ROLE_PREFIX)


def _is_managed(client: dict[str, Any]) -> bool:
    roles = client.get("roles") or []
    return any(_is_ours(r.get("rolename")) for r in roles)


def _check_names(devices: list[str], hub_user: str, cdn_user: str, share_group: str) -> None:
    check_device_names(devices, hub_user=hub_user, cdn_user=cdn_user)
    validate_name(share_group, "share group")
    if hub_user == cdn_user:
        raise ConfigError("the hub and CDN users must be different")
    for device in devices:
        if device.startswith(SERVICE_CLIENT_ID_PREFIX):
            raise ConfigError(
                f"device id {device!r} starts with {SERVICE_CLIENT_ID_PREFIX!r}, which the "
                "services' client ids use: its bound client id could disconnect a hub"
            )


def render_dynsec_config(
    clients: dict[str, dict[str, Any]],
    *,
    prefix: str = "tandem/v1",
    hub_user: str = "hub",
    cdn_user: str = "cdn",
    share_group: str = "hubs",
    legacy_topics: bool = False,
    bind_client_ids: bool = True,
    existing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plugin's state for ``clients`` (username -> a ``dynsec_client`` with its hash).

    Roles and client ids are set here from the username (the hub, the CDN,
    or a device); ``existing`` contributes what this module does not manage.
    """
    p = Topics(prefix).prefix  # validates
    validate_name(hub_user, "hub user")
    validate_name(cdn_user, "CDN user")
    devices = sorted(u for u in clients if u not in (hub_user, cdn_user))
    _check_names(devices, hub_user, cdn_user, share_group)
    base = existing or {}
    kept_clients = [c for c in base.get("clients", []) if not _is_managed(c)]
    taken = {c.get("username") for c in kept_clients}
    clash = taken & set(clients)
    if clash:
        raise ConfigError(f"user {sorted(clash)[0]!r} exists in the file with roles not ours")
    managed: list[dict[str, Any]] = []
    for username in sorted(clients):
        client = {k: v for k, v in clients[username].items() if k not in ("roles", "clientid")}
        if username == hub_user:
            client["roles"] = [{"rolename": _HUB_ROLE}]
        elif username == cdn_user:
            client["roles"] = [{"rolename": _CDN_ROLE}]
        else:
            client["roles"] = [{"rolename": device_role_name(username)}]
            if bind_client_ids:
                client["clientid"] = username  # shared.device_client_id: the id is the name
        managed.append(client)
    roles = [r for r in base.get("roles", []) if not _is_ours(r.get("rolename"))]
    roles += _service_roles(p, share_group)
    roles += [_device_role(p, d, legacy_topics=legacy_topics) for d in devices]
    config: dict[str, Any] = {k: v for k, v in base.items() if k not in ("clients", "roles")}
    config.setdefault("groups", [])
    config["clients"] = kept_clients + managed
    config["roles"] = roles
    config["defaultACLAccess"] = {
        "publishClientSend": False,
        "publishClientReceive": False,
        "subscribe": False,
        "unsubscribe": True,
    }
    return config


def read_dynsec_file(path: Path) -> dict[str, Any]:
    """The plugin's state file as a dict (empty when absent); ``ConfigError`` if malformed."""
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise ConfigError(f"{path} is not a dynamic-security JSON file: {e}") from e
    if not isinstance(config, dict) or not isinstance(config.get("clients", []), list):
        raise ConfigError(f"{path} is not a dynamic-security JSON file (no client list)")
    return config


def provision_dynsec(
    users: Iterable[str],
    *,
    dynsec_file: Path,
    prefix: str = "tandem/v1",
    hub_user: str = "hub",
    cdn_user: str = "cdn",
    share_group: str = "hubs",
    legacy_topics: bool = False,
    bind_client_ids: bool = True,
    password_out: Path | None = None,
) -> Provisioning:
    """Give ``users`` fresh passwords in ``dynsec_file`` (every other client keeps its own)
    and rewrite the roles; with ``password_out`` the new passwords go there first.

    Nothing is written when a name is wrong (``ConfigError``).
    """
    names = list(users)
    if len(set(names)) != len(names):
        raise ConfigError("a name is given twice")
    existing = read_dynsec_file(dynsec_file)
    clients = {str(c.get("username")): c for c in existing.get("clients", []) if _is_managed(c)}
    passwords = {user: generate_password() for user in names}
    rotated = frozenset(u for u in names if u in clients)
    for user, password in passwords.items():
        clients[user] = dynsec_client(user, password, roles=())
    config = render_dynsec_config(
        clients,
        prefix=prefix,
        hub_user=hub_user,
        cdn_user=cdn_user,
        share_group=share_group,
        legacy_topics=legacy_topics,
        bind_client_ids=bind_client_ids,
        existing=existing,
    )
    done = Provisioning(passwords, rotated)
    if password_out is not None:
        write_private_file(password_out, done.secrets_text())
    write_private_file(dynsec_file, json.dumps(config, indent=2) + "\n")
    return done
