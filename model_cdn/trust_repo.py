"""The root metadata a fleet trusts, kept as files: ``<dir>/<version>.root.json``.

What ``tandem keys root init`` and ``tandem keys rotate`` write, and what the
CDN serves at ``/v1/roots/<version>.root.json`` (``shared.CdnPaths.root``)
for devices to walk. ``add`` accepts a root only as a device would: version
1 must sign itself (a threshold of its own root keys); version ``N+1`` must
be signed by a threshold of version ``N``'s root keys and of its own
(``shared.TrustedRoot``), so a root this repository holds is one every
device will accept. Files are written whole and never replaced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared import (
    ManifestError,
    PublicKey,
    RoleKeys,
    RootMetadata,
    SigningKey,
    TrustedRoot,
    atomic_write_bytes,
    canonical_json,
    sign_root,
)

from ._errors import CdnError

__all__ = ["TrustRepository"]

_ROOT_FILE = re.compile(r"([1-9][0-9]{0,8})\.root\.json")


class TrustRepository:
    """The chain of signed roots in one directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def versions(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        found = (_ROOT_FILE.fullmatch(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def read(self, version: int) -> bytes | None:
        """The signed root ``version`` as stored, or None."""
        try:
            return (self.directory / f"{int(version)}.root.json").read_bytes()
        except FileNotFoundError:
            return None

    def latest(self) -> tuple[RootMetadata, dict[str, Any]] | None:
        """The newest root (parsed, and the signed document), or None before ``root init``."""
        versions = self.versions()
        if not versions:
            return None
        raw = self.read(versions[-1])
        assert raw is not None
        document = json.loads(raw)
        return RootMetadata.from_dict(document.get("signed")), document

    def trusted(self) -> TrustedRoot:
        """The chain walked as a device walks it, from version 1; ``CdnError`` if it breaks."""
        versions = self.versions()
        if not versions:
            raise CdnError(f"no root in {self.directory}: run 'tandem keys root init' first")
        try:
            first = self.read(1)
            if first is None:
                raise CdnError(f"{self.directory} has no 1.root.json")
            root = TrustedRoot.bootstrap(first)
            for version in range(2, versions[-1] + 1):
                raw = self.read(version)
                if raw is None:
                    raise CdnError(f"{self.directory} lacks root {version}")
                root.update(raw)
        except ManifestError as e:
            raise CdnError(f"the roots in {self.directory} do not chain: {e}") from e
        return root

    def init(
        self,
        roles: Mapping[str, tuple[Sequence[PublicKey], int]],
        signers: Iterable[SigningKey],
        *,
        expires_at: str | None = None,
    ) -> RootMetadata:
        """Write root version 1: ``roles`` maps each role to (keys, threshold); ``signers``
        must include a threshold of the root keys (it signs itself)."""
        if self.versions():
            raise CdnError(f"{self.directory} already holds roots: rotate instead")
        root = RootMetadata.new(version=1, roles=roles, expires_at=expires_at)
        return self.add(sign_root(root, *signers))

    def rotate(
        self,
        role: str,
        signers: Iterable[SigningKey],
        *,
        add: Iterable[PublicKey] = (),
        remove: Iterable[str] = (),
        threshold: int | None = None,
        expires_at: str | None = None,
    ) -> RootMetadata:
        """Write the next root with ``role``'s keys changed (``remove``: key ids); ``signers``
        must include a threshold of the current root keys and of the new ones."""
        latest = self.latest()
        if latest is None:
            raise CdnError(f"no root in {self.directory}: run 'tandem keys root init' first")
        current = latest[0]
        if role not in current.roles:
            raise CdnError(f"unknown role {role!r}: use root, publisher or assigner")
        removing = set(remove)
        unknown = removing - set(current.roles[role].keyids)
        if unknown:
            raise CdnError(f"key {sorted(unknown)[0][:16]}… is not a {role} key")
        added = [k for k in add if k.keyid not in current.roles[role].keyids]
        keyids = [k for k in current.roles[role].keyids if k not in removing]
        keyids += [k.keyid for k in added]
        roles = dict(current.roles)
        roles[role] = RoleKeys(tuple(keyids), threshold or current.roles[role].threshold)
        used = {k for r in roles.values() for k in r.keyids}
        keys = {**current.keys, **{k.keyid: k for k in added}}
        new = RootMetadata.new(
            version=current.version + 1,
            roles={n: ([keys[k] for k in r.keyids], r.threshold) for n, r in roles.items()},
            expires_at=expires_at,
        )
        assert set(new.keys) == used
        return self.add(sign_root(new, *signers))

    def add(self, document: dict[str, Any]) -> RootMetadata:
        """Check ``document`` as the next root, then write it; ``ManifestError`` if refused."""
        canonical_json(document)
        if self.versions():
            root = self.trusted()
            new = root.update(document)
        else:
            new = TrustedRoot.bootstrap(document).root
            if new.version != 1:
                raise ManifestError(f"the first root is version 1, not {new.version}")
        path = self.directory / f"{new.version}.root.json"
        if path.exists():
            raise CdnError(f"{path} exists")
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(document, indent=2, sort_keys=True) + "\n"
        # public: devices and the CDN read it
        atomic_write_bytes(path, text.encode("utf-8"), mode=0o644)
        return new
