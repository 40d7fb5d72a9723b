"""The root of trust: which keys may sign what, with thresholds, rotatable (TUF / Uptane).

Root metadata travels signed (``_signing``) like every Tandem document::

    {"type": "root", "spec_version": "1.0", "version": 2, "expires_at": "…",
     "keys":  {"<keyid>": "ed25519:<base64>", …},
     "roles": {"root":      {"keyids": [...], "threshold": 2},
               "publisher": {"keyids": [...], "threshold": 1},
               "assigner":  {"keyids": [...], "threshold": 1}}}

Roles, as Uptane splits them: ``publisher`` keys (offline, on the publishing
machine: TUF's *targets* / Uptane's image repository) sign model manifests;
``assigner`` keys (online, on the rollout server: Uptane's director) sign
assignments only; ``root`` keys sign root metadata. A device installs a
model only when the assigner role signed the assignment **and** the
publisher role signed the manifest, so the online key alone cannot make a
device install a model the publisher did not sign. Every role has a
threshold: that many distinct keys of the role must sign.

``TrustedRoot`` is the device's side, TUF's root update (specification
section 5.3) step for step: root ``N+1`` is accepted only when a threshold of
root ``N``'s root keys **and** a threshold of its own root keys signed it,
and its version is exactly ``N+1`` (no skipping, no rollback); the root in
force at the end of an update must not be expired (a freeze attack). A
device that pinned keys before roots existed (``TrustedRoot.pinned``) holds
a root of version 0 in which those keys hold every role at threshold 1, so
it keeps working unchanged and moves to root 1 when root 1 is signed by its
pinned key as well as by root 1's own root keys (the migration).

Why hand-written and not python-tuf's metadata API: python-tuf's ``Root``
fixes TUF's four top-level roles (root, targets, snapshot, timestamp) and
their repository semantics (snapshots of many targets files), which have no
counterpart here (a device fetches one assignment and one manifest); its
key ids (SHA-256 of the canonical key dict, hex signatures) differ from the
ones devices in the field already pin (SHA-256 of the raw key, base64
signatures); and it would add python-tuf and securesystemslib to
``tandem[edge]``. The algorithm it implements is followed here instead,
in ~250 lines with no dependency beyond ``cryptography``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ._errors import ExpiredError, ManifestError, SignatureError
from ._limits import MAX_DOCUMENT_BYTES
from ._manifest import (
    SPEC_VERSION,
    Assignment,
    ModelManifest,
    format_time,
    parse_time,
    verify_assignment,
    verify_manifest,
)
from ._signing import PublicKey, SigningKey, sign_document, verify_signed

__all__ = [
    "MAX_ROOT_ROTATIONS",
    "ROLES",
    "RoleKeys",
    "RootMetadata",
    "TrustedRoot",
    "sign_root",
]

ROLES = ("root", "publisher", "assigner")
MAX_ROOT_ROTATIONS = 32  # roots one update may walk through (TUF's max_root_rotations)
_FAR_FUTURE = (
    "9999-12-31T23:59:59Z"  # a pinned-key root never expires (there is no one to renew it)
)


@dataclass(frozen=True)
class RoleKeys:
    """The key ids of one role and how many of them must sign."""

    keyids: tuple[str, ...]
    threshold: int

    def to_dict(self) -> dict[str, Any]:
        return {"keyids": list(self.keyids), "threshold": self.threshold}


@dataclass(frozen=True, kw_only=True)
class RootMetadata:
    """One version of the root: keys, and for each role its key ids and threshold."""

    version: int
    expires_at: str
    keys: Mapping[str, PublicKey]
    roles: Mapping[str, RoleKeys]
    spec_version: str = SPEC_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            raise ManifestError(f"root version must be an integer >= 0, got {self.version!r:.40}")
        parse_time(self.expires_at, "expires_at")
        for keyid, key in self.keys.items():
            if key.keyid != keyid:
                raise ManifestError(f"root key {keyid[:16]}… is listed under another key's id")
        if set(self.roles) != set(ROLES):
            raise ManifestError(f"a root names exactly the roles {', '.join(ROLES)}")
        for name, role in self.roles.items():
            if not isinstance(role.threshold, int) or role.threshold < 1:
                raise ManifestError(f"role {name}: threshold must be an integer >= 1")
            if len(set(role.keyids)) != len(role.keyids):
                raise ManifestError(f"role {name} names a key twice")
            if len(role.keyids) < role.threshold:
                raise ManifestError(
                    f"role {name}: threshold {role.threshold} but only {len(role.keyids)} keys"
                )
            unknown = [k for k in role.keyids if k not in self.keys]
            if unknown:
                raise ManifestError(f"role {name} names unknown key {unknown[0][:16]}…")

    def role_keys(self, role: str) -> dict[str, PublicKey]:
        return {k: self.keys[k] for k in self.roles[role].keyids}

    def verify(self, document: object, role: str) -> dict[str, Any]:
        """The ``signed`` part when a threshold of ``role``'s keys signed it; else raise."""
        try:
            return verify_signed(
                document, self.role_keys(role), threshold=self.roles[role].threshold
            )
        except SignatureError as e:
            raise SignatureError(f"{e} (the {role} role)") from e

    def expired(self, now: datetime | None = None) -> bool:
        return (now or datetime.now(UTC)) >= parse_time(self.expires_at, "expires_at")

    @classmethod
    def new(
        cls,
        *,
        version: int,
        roles: Mapping[str, tuple[Sequence[PublicKey], int]],
        expires_at: str | None = None,
    ) -> RootMetadata:
        """A root from public keys per role: ``{"root": ([k1, k2], 2), …}``."""
        keys = {k.keyid: k for ks, _ in roles.values() for k in ks}
        return cls(
            version=version,
            expires_at=expires_at or format_time(datetime.now(UTC) + timedelta(days=365)),
            keys=keys,
            roles={n: RoleKeys(tuple(k.keyid for k in ks), t) for n, (ks, t) in roles.items()},
        )

    @classmethod
    def from_dict(cls, d: object) -> RootMetadata:
        if not isinstance(d, dict) or d.get("type") != "root":
            raise ManifestError("root metadata is an object with type 'root'")
        spec = d.get("spec_version")
        if not isinstance(spec, str) or spec.split(".")[0] != SPEC_VERSION.split(".")[0]:
            raise ManifestError(f"root spec_version {spec!r:.20} is not {SPEC_VERSION}-compatible")
        keys, roles = d.get("keys"), d.get("roles")
        if not isinstance(keys, dict) or not isinstance(roles, dict):
            raise ManifestError("root metadata needs 'keys' and 'roles' objects")
        parsed_roles: dict[str, RoleKeys] = {}
        for name, role in roles.items():
            keyids, threshold = (
                (role.get("keyids"), role.get("threshold"))
                if isinstance(role, dict)
                else (None, None)
            )
            if not isinstance(keyids, list) or not all(isinstance(k, str) for k in keyids):
                raise ManifestError(f"role {name!r:.40}: keyids must be a list of strings")
            if not isinstance(threshold, int) or isinstance(threshold, bool):
                raise ManifestError(f"role {name!r:.40}: threshold must be an integer")
            parsed_roles[str(name)] = RoleKeys(tuple(keyids), threshold)
        if not all(isinstance(v, str) for v in keys.values()):
            raise ManifestError("root keys must be 'ed25519:<base64>' strings")
        known = {"type", "spec_version", "version", "expires_at", "keys", "roles"}
        return cls(
            version=d.get("version"),  # type: ignore[arg-type]  # validated
            expires_at=d.get("expires_at"),  # type: ignore[arg-type]
            keys={str(k): PublicKey.from_text(v) for k, v in keys.items()},
            roles=parsed_roles,
            spec_version=spec,
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            type="root",
            spec_version=self.spec_version,
            version=self.version,
            expires_at=self.expires_at,
            keys={k: v.to_text() for k, v in sorted(self.keys.items())},
            roles={n: self.roles[n].to_dict() for n in ROLES},
        )
        return d


def sign_root(root: RootMetadata, *keys: SigningKey) -> dict[str, Any]:
    """Root metadata signed by ``keys`` (the old root's and the new root's root keys)."""
    return sign_document(root.to_dict(), *keys)


def _load(raw: bytes | str | Mapping[str, Any]) -> object:
    if isinstance(raw, Mapping):
        return dict(raw)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ManifestError(f"root metadata of {len(raw)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"root metadata is not JSON: {e}") from e


class TrustedRoot:
    """The root a device trusts now, and the checks it makes (pure: no network, no disk)."""

    def __init__(self, root: RootMetadata, document: dict[str, Any] | None = None) -> None:
        self.root = root
        self.document = document  # the signed root as received (None for pinned keys)

    @classmethod
    def pinned(cls, keys: Iterable[PublicKey]) -> TrustedRoot:
        """Root version 0 for keys pinned the old way: each key holds every role, threshold 1."""
        pinned = list(keys)
        if not pinned:
            raise ManifestError("pin at least one key")
        return cls(
            RootMetadata.new(
                version=0,
                roles={role: (pinned, 1) for role in ROLES},
                expires_at=_FAR_FUTURE,
            )
        )

    @classmethod
    def bootstrap(cls, raw: bytes | str | Mapping[str, Any]) -> TrustedRoot:
        """The root shipped with the device (trusted on first use): it must sign itself."""
        document = _load(raw)
        if not isinstance(document, dict):
            raise ManifestError("root metadata must be a JSON object")
        unverified = RootMetadata.from_dict(document.get("signed"))
        unverified.verify(document, "root")
        return cls(unverified, document)

    @property
    def version(self) -> int:
        return self.root.version

    def update(self, raw: bytes | str | Mapping[str, Any]) -> RootMetadata:
        """Move to the next root (TUF 5.3.4-5.3.8); raise and stay put if it is not trusted."""
        document = _load(raw)
        self.root.verify(document, "root")  # a threshold of the keys trusted until now
        assert isinstance(document, dict)
        new = RootMetadata.from_dict(document["signed"])
        if new.version != self.root.version + 1:
            raise ManifestError(
                f"root version {new.version} does not follow the trusted {self.root.version}"
            )
        new.verify(document, "root")  # and a threshold of its own root keys
        self.root, self.document = new, document
        return new

    def check_fresh(self, now: datetime | None = None) -> None:
        """Raise ``ExpiredError`` if the root in force has expired (TUF 5.3.10)."""
        if self.root.expired(now):
            raise ExpiredError(
                f"root version {self.root.version} expired at {self.root.expires_at}"
            )

    def verify_manifest(
        self, raw: bytes | str | Mapping[str, Any], *, now: datetime | None = None
    ) -> ModelManifest:
        """A manifest that a threshold of the publisher role signed, unexpired."""
        role = self.root.roles["publisher"]
        try:
            return verify_manifest(
                raw, self.root.role_keys("publisher"), now=now, threshold=role.threshold
            )
        except SignatureError as e:
            raise SignatureError(f"{e} (the publisher role)") from e

    def verify_assignment(
        self, raw: bytes | str | Mapping[str, Any], *, now: datetime | None = None
    ) -> Assignment:
        """An assignment that a threshold of the assigner role signed, unexpired."""
        role = self.root.roles["assigner"]
        try:
            return verify_assignment(
                raw, self.root.role_keys("assigner"), now=now, threshold=role.threshold
            )
        except SignatureError as e:
            raise SignatureError(f"{e} (the assigner role)") from e
