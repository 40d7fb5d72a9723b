"""Which signatures the CDN asks of an uploaded manifest or assignment.

Devices verify every document again; the CDN's check only stops a mistake
(or a stolen online key) before a device sees it. Two sources, the stronger
first:

- the roots in ``--trust-dir`` (``tandem keys root``): a manifest needs a
  threshold of the *publisher* role, an assignment a threshold of the
  *assigner* role, as devices check them, so the rollout server's online
  (assigner) key alone cannot upload a model; the newest root is read again
  whenever the directory gains a version (a rotation needs no restart);
- otherwise the flat ``--trusted-key`` list: any one of them;
- neither: structure only.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from shared import PublicKey, TrustedRoot

from .trust_repo import TrustRepository

__all__ = ["UploadTrust"]

Trusted = Sequence[PublicKey] | TrustedRoot | None


class UploadTrust:
    """``current()``: the keys or root that uploads are verified against now."""

    def __init__(
        self, keys: Sequence[PublicKey] | None = None, trust_dir: Path | None = None
    ) -> None:
        self.keys = list(keys) if keys else None
        self.repository = None if trust_dir is None else TrustRepository(trust_dir)
        self._root: tuple[int, TrustedRoot] | None = None
        self._lock = threading.Lock()

    def current(self) -> Trusted:
        """The root's roles when ``trust_dir`` holds a root, else the flat keys (or None)."""
        if self.repository is None:
            return self.keys
        versions = self.repository.versions()
        if not versions:
            return self.keys
        with self._lock:
            if self._root is None or self._root[0] != versions[-1]:
                self._root = (versions[-1], self.repository.trusted())
            return self._root[1]
