"""Mosquitto credentials and topic ACLs for a Tandem fleet: the plain-file fallback.

Where Mosquitto's dynamic-security plugin is available, ``_dynsec``
writes the stronger configuration (SUBSCRIBE checked, client ids bound);
these two files, ``password_file`` and ``acl_file``, are for brokers without
it. Pure functions render them; ``write_private_file`` is the one function
that touches disk, and ``provision_users`` (what ``tandem fleet provision
--passwd-file … --acl-file …`` calls) puts them together: fresh passwords for
some users, the others kept, the ACL rewritten.

Who may do what (``{p}`` is the topic prefix, ``%u`` the connecting username)::

    every user (pattern)  write {p}/dev/%u/infer/+   {p}/dev/%u/status   {p}/dev/%u/telemetry
                                {p}/dev/%u/generate/+   {p}/dev/%u/generate/+/+ (sticky)
                                {p}/dev/%u/cancel
                                {p}/dev/%u/verify/+   {p}/dev/%u/verify/+/+ (speculative)
                          ({p}/infer/+ too with legacy_topics, for a migration)
                          read  {p}/dev/%u/reply   {p}/dev/%u/assign   {p}/dev/%u/text
                                {p}/dev/%u/verified
    user <hub>            read  {p}/dev/+/infer/+   {p}/infer/+
                                {p}/dev/+/generate/+   {p}/dev/+/generate/+/+
                                {p}/dev/+/cancel
                                {p}/dev/+/verify/+   {p}/dev/+/verify/+/+
                          write {p}/dev/+/reply   {p}/dev/+/text   {p}/dev/+/verified
    user <cdn>            write {p}/dev/+/assign
                          read  {p}/dev/+/status   {p}/dev/+/telemetry

Invariants:

- A device's username is its device id, a ``shared.validate_name`` name, so
  ``%u`` fills exactly one topic level and can never be a wildcard.
- The hub and CDN users are distinct names; a device may not take either
  (``check_device_names``), or it would inherit the service's rights.
- ``merge_password_file`` keeps every line it does not replace, in order:
  adding or rotating one user never drops another, and merging the same
  update twice gives the same users.
- No ``$share/…`` line: Mosquitto 2's acl_file does not check SUBSCRIBE at
  all; it checks ``read`` per message against the published topic, so the
  hub's ``$share/{group}/{p}/dev/+/infer/+`` is served by ``read
  {p}/dev/+/infer/+``. The flip side: a device may join the hubs' share
  group and, picked in turn, have requests dropped (denied delivery), and
  nothing binds a client id to a username (a device can take another's id);
  see docs/mqtt-security.md for what stops these (the plugin, or
  ``use_username_as_clientid``).
- Files are written whole (``shared.atomic_writer``: temporary file, ``fsync``,
  rename, ``fsync`` of the directory) with mode 0600.
- The ACL file is generated whole, except its kept blocks: the lines from
  ``# BEGIN <name>`` to ``# END <name>`` (a site gateway's rights, written by
  ``_bridge``) survive every rewrite, in order (``split_acl_blocks``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shared import ConfigError, Topics, atomic_writer, validate_name

__all__ = [
    "ACL_BLOCK_BEGIN",
    "ACL_BLOCK_END",
    "DEFAULT_ITERATIONS",
    "Provisioning",
    "check_device_names",
    "generate_password",
    "join_acl_blocks",
    "merge_password_file",
    "mosquitto_password_hash",
    "password_file_users",
    "password_line",
    "provision_users",
    "provisioning_acl",
    "render_acl_file",
    "split_acl_blocks",
    "verify_mosquitto_password",
    "write_private_file",
]

# Mosquitto 2's own default (mosquitto_passwd). Our passwords carry 256 random
# bits, which no iteration count needs to stretch, and a cheap hash keeps a
# fleet-wide reconnect storm from pinning the broker's CPU.
DEFAULT_ITERATIONS = 101
_SALT_BYTES = 12  # what mosquitto_passwd uses
ACL_BLOCK_BEGIN = "# BEGIN "  # + a name: the first line of a block kept across rewrites
ACL_BLOCK_END = "# END "  # + the same name: its last line
_PASSWORD_BYTES = 32


def mosquitto_password_hash(
    password: str, *, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
) -> str:
    """A Mosquitto 2 password hash: ``$7$<iterations>$<b64 salt>$<b64 PBKDF2-SHA512>``."""
    if iterations < 1:
        raise ConfigError(f"iterations must be >= 1, got {iterations}")
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, dklen=64)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def verify_mosquitto_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` matches a ``$7$`` hash (as Mosquitto would decide)."""
    parts = password_hash.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != "7" or not parts[2].isdigit():
        return False
    try:
        salt = base64.b64decode(parts[3], validate=True)
        expected = base64.b64decode(parts[4], validate=True)
    except binascii.Error:
        return False
    got = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(parts[2]), dklen=64)
    return hmac.compare_digest(got, expected)


def generate_password() -> str:
    """A fresh random password: 256 bits, URL-safe (no ``:``, spaces or ``%``)."""
    return secrets.token_urlsafe(_PASSWORD_BYTES)


def password_line(
    user: str, password: str, *, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
) -> str:
    """One ``password_file`` line, newline included."""
    validate_name(user, "MQTT username")
    return f"{user}:{mosquitto_password_hash(password, salt=salt, iterations=iterations)}\n"


def password_file_users(text: str) -> list[str]:
    """The usernames of a password file, in file order; ``ConfigError`` if malformed."""
    return [user for user, _ in _parse_password_file(text) if user is not None]


def merge_password_file(text: str, lines: Iterable[str]) -> str:
    """``text`` with each ``user:hash`` line of ``lines`` added or put in place of that user's.

    Other users, blank lines and ``#`` comments stay where they were; new users
    go at the end. A user named twice in ``lines`` keeps the last line.
    """
    updates: dict[str, str] = {}
    for line in lines:
        for user, raw in _parse_password_file(line):
            if user is None:
                raise ConfigError(f"not a password file line: {line!r:.80}")
            updates[user] = raw
    out: list[str] = []
    for user, raw in _parse_password_file(text):
        if user is not None and user in updates:
            out.append(updates.pop(user))
        else:
            out.append(raw)
    out.extend(updates.values())
    return "".join(out)


def _parse_password_file(text: str) -> list[tuple[str | None, str]]:
    """(username or None for blank/comment lines, the line with a newline)."""
    entries: list[tuple[str | None, str]] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        raw = line + "\n"
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            entries.append((None, raw))
            continue
        user, sep, password_hash = line.partition(":")
        if not sep or not user or not password_hash:
            raise ConfigError(f"password file line {number} is not user:hash")
        if user in seen:
            raise ConfigError(f"password file names user {user!r:.80} twice (line {number})")
        seen.add(user)
        entries.append((user, raw))
    return entries


def check_device_names(devices: Iterable[str], *, hub_user: str, cdn_user: str) -> list[str]:
    """The device ids, validated; ``ConfigError`` if one is a service user's name or repeats."""
    names = list(devices)
    for name in names:
        validate_name(name, "device id")
        if name in (hub_user, cdn_user):
            raise ConfigError(
                f"device id {name!r} is the {'hub' if name == hub_user else 'CDN'} user's name; "
                "a device by that name would get the service's rights"
            )
    if len(set(names)) != len(names):
        raise ConfigError("a device id is named twice")
    return names


def render_acl_file(
    prefix: str = "tandem/v1",
    *,
    hub_user: str = "hub",
    cdn_user: str = "cdn",
    legacy_topics: bool = False,
) -> str:
    """The ``acl_file`` text for one deployment (see the module docstring)."""
    p = Topics(prefix).prefix  # validates: no wildcards, no empty levels
    validate_name(hub_user, "hub user")
    validate_name(cdn_user, "CDN user")
    if hub_user == cdn_user:
        raise ConfigError("the hub and CDN users must be different")
    legacy = (
        "# Migration: devices of the first topic layout (drop with --no-legacy-topics).\n"
        f"pattern write {p}/infer/+\n"
        if legacy_topics
        else ""
    )
    return (
        "# Generated by 'tandem fleet provision'; edits here are overwritten\n"
        "# (but for the blocks from '# BEGIN <name>' to '# END <name>', which are kept).\n"
        "# Reload with: kill -HUP <mosquitto pid>\n"
        "\n"
        "# Devices (username = device id): own requests out, own replies and assignments in.\n"
        f"pattern write {p}/dev/%u/infer/+\n"
        f"pattern write {p}/dev/%u/generate/+\n"
        f"pattern write {p}/dev/%u/generate/+/+\n"
        f"pattern write {p}/dev/%u/cancel\n"
        f"pattern write {p}/dev/%u/verify/+\n"
        f"pattern write {p}/dev/%u/verify/+/+\n"
        f"pattern write {p}/dev/%u/status\n"
        f"pattern write {p}/dev/%u/telemetry\n"
        f"pattern read {p}/dev/%u/reply\n"
        f"pattern read {p}/dev/%u/text\n"
        f"pattern read {p}/dev/%u/verified\n"
        f"pattern read {p}/dev/%u/assign\n"
        f"{legacy}"
        "\n"
        "# Hubs: take requests (shared subscription or not), answer any device.\n"
        f"user {hub_user}\n"
        f"topic read {p}/dev/+/infer/+\n"
        f"topic read {p}/infer/+\n"
        f"topic read {p}/dev/+/generate/+\n"
        f"topic read {p}/dev/+/generate/+/+\n"
        f"topic read {p}/dev/+/cancel\n"
        f"topic read {p}/dev/+/verify/+\n"
        f"topic read {p}/dev/+/verify/+/+\n"
        f"topic write {p}/dev/+/reply\n"
        f"topic write {p}/dev/+/text\n"
        f"topic write {p}/dev/+/verified\n"
        "\n"
        "# The CDN / rollout controller: assign versions, read what devices report.\n"
        f"user {cdn_user}\n"
        f"topic write {p}/dev/+/assign\n"
        f"topic read {p}/dev/+/status\n"
        f"topic read {p}/dev/+/telemetry\n"
    )


def split_acl_blocks(text: str) -> tuple[str, dict[str, str]]:
    """``text`` without its kept blocks, and the blocks by name (lines, markers included).

    ``ConfigError`` for a block without its end, a nested one, or a name used twice.
    """
    rest: list[str] = []
    blocks: dict[str, str] = {}
    name: str | None = None
    current: list[str] = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        stripped = line.rstrip("\r\n")
        if stripped.startswith(ACL_BLOCK_BEGIN):
            if name is not None:
                raise ConfigError(f"ACL line {number}: a block begins inside block {name!r}")
            name = validate_name(stripped[len(ACL_BLOCK_BEGIN) :].strip(), "ACL block name")
            if name in blocks:
                raise ConfigError(f"ACL line {number}: block {name!r} appears twice")
            current = [line]
        elif name is not None:
            current.append(line)
            if stripped == f"{ACL_BLOCK_END}{name}":
                blocks[name] = "".join(current) + ("" if line.endswith("\n") else "\n")
                name = None
        else:
            rest.append(line)
    if name is not None:
        raise ConfigError(f"ACL block {name!r} has no '{ACL_BLOCK_END}{name}' line")
    return "".join(rest), blocks


def join_acl_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` (without blocks) followed by ``blocks``, each after one blank line."""
    body = text if not text or text.endswith("\n") else text + "\n"
    return body + "".join(f"\n{block}" for block in blocks.values())


def write_private_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, mode 0600, keeping an existing file's owner.

    Keeping the owner matters: Mosquitto reads these files after dropping to
    its own user, so an operator who ``chown``-ed them once should not have to
    again after every provisioning.
    """
    path = Path(path)
    try:
        owner = path.stat()
    except FileNotFoundError:
        owner = None
    with atomic_writer(path, mode=0o600) as f:
        if owner is not None and (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
            # Not ours to give away without privileges; the operator chowns it again.
            with contextlib.suppress(PermissionError):
                os.fchown(f.fileno(), owner.st_uid, owner.st_gid)
        f.write(text.encode("utf-8"))


@dataclass(frozen=True)
class Provisioning:
    """What ``provision_users`` did."""

    passwords: dict[str, str]  # user -> the new password, shown once
    rotated: frozenset[str]  # the users who had a password before

    def secrets_text(self) -> str:
        """``user password`` lines, as ``--password-out`` holds them."""
        return "".join(f"{user} {password}\n" for user, password in self.passwords.items())


def provisioning_acl(
    users: Iterable[str],
    *,
    prefix: str = "tandem/v1",
    hub_user: str = "hub",
    cdn_user: str = "cdn",
    legacy_topics: bool = False,
) -> str:
    """The ACL file for a fleet, after checking the users to provision (devices, or the
    hub and CDN users by name); ``ConfigError`` for a bad name or one given twice."""
    names = list(users)
    acl = render_acl_file(prefix, hub_user=hub_user, cdn_user=cdn_user, legacy_topics=legacy_topics)
    services = {hub_user, cdn_user}
    check_device_names(
        [n for n in names if n not in services], hub_user=hub_user, cdn_user=cdn_user
    )
    if len(set(names)) != len(names):
        raise ConfigError("a name is given twice")
    return acl


def provision_users(
    users: Iterable[str],
    *,
    passwd_file: Path,
    acl_file: Path,
    prefix: str = "tandem/v1",
    hub_user: str = "hub",
    cdn_user: str = "cdn",
    password_out: Path | None = None,
    legacy_topics: bool = False,
) -> Provisioning:
    """Give ``users`` fresh passwords in ``passwd_file`` (every other user keeps theirs)
    and rewrite ``acl_file``; with ``password_out`` the new passwords go there first.

    Nothing is written when a name is wrong (``ConfigError``); the passwords are
    written before the password file, so a failure never loses one.
    """
    names = list(users)
    acl = provisioning_acl(
        names, prefix=prefix, hub_user=hub_user, cdn_user=cdn_user, legacy_topics=legacy_topics
    )
    existing = passwd_file.read_text(encoding="utf-8") if passwd_file.exists() else ""
    known = set(password_file_users(existing))
    if acl_file.exists():  # a site gateway's rights, written by _bridge, stay
        acl = join_acl_blocks(acl, split_acl_blocks(acl_file.read_text(encoding="utf-8"))[1])
    done = Provisioning(
        {user: generate_password() for user in names}, frozenset(n for n in names if n in known)
    )
    merged = merge_password_file(
        existing, (password_line(user, pw) for user, pw in done.passwords.items())
    )
    if password_out is not None:
        write_private_file(password_out, done.secrets_text())
    write_private_file(passwd_file, merged)
    write_private_file(acl_file, acl)
    return done
