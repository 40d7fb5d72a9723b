"""Keeping the device's root of trust current: stored roots re-checked, newer ones fetched.

The I/O half of root rotation (``shared.TrustedRoot`` decides). At start,
``RootKeeper`` walks the roots the device accepted before
(``<store>/roots/<version>.root.json``) from the root it was given, checking
each step again, as TUF clients re-verify local metadata; ``refresh`` then
asks the CDN for ``version + 1`` until it has none (at most
``MAX_ROOT_ROTATIONS`` per call), keeping each root it accepts. A root that
is not trusted stops the walk, is logged, and leaves the current root in
force; so does an unreachable CDN (the current root keeps verifying
updates until it expires).
"""

from __future__ import annotations

import logging
from pathlib import Path

from shared import MAX_ROOT_ROTATIONS, ManifestError, atomic_write_bytes

from .._errors import DownloadError
from ._fetcher import CdnFetcher
from ._trust import Trust, as_root

__all__ = ["RootKeeper"]

log = logging.getLogger("tandem.edge.updater")


class RootKeeper:
    """The device's root (one ``TrustedRoot``, rotated in place) and where it is kept."""

    def __init__(self, trust: Trust, store_dir: str | Path, cdn: CdnFetcher | None = None) -> None:
        self.root = as_root(trust)
        self._dir = Path(store_dir) / "roots"
        self._cdn = cdn
        while True:  # ends at the first version the store does not hold
            path = self._dir / f"{self.root.version + 1}.root.json"
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                break
            try:
                self.root.update(raw)
            except ManifestError as e:
                log.warning("updater: stored root %s refused: %s", path.name, e)
                break

    def refresh(self) -> int:
        """Fetch and accept newer roots from the CDN; how many were accepted."""
        if self._cdn is None:
            return 0
        accepted = 0
        for _ in range(MAX_ROOT_ROTATIONS):
            version = self.root.version + 1
            try:
                raw = self._cdn.fetch_document(self._cdn.root_url(version))
            except DownloadError as e:
                log.warning("updater: cannot check for root %s: %s", version, e)
                break
            if raw is None:
                break
            try:
                self.root.update(raw)
            except ManifestError as e:
                log.warning("updater: root %s from the CDN refused: %s", version, e)
                break
            self._keep(version, raw)
            accepted += 1
            log.info("updater: now trusting root version %s", version)
        return accepted

    def _keep(self, version: int, raw: bytes) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self._dir / f"{version}.root.json", raw, mode=0o600)
