"""What a device trusts about model updates: pure checks, no network, no disk.

The python-tuf split: this module decides, ``_updater`` does the I/O and
``_store`` persists what this module returns.

Invariants:

- The device trusts a root (``shared.TrustedRoot``, given at construction
  and rotated by ``_updater`` from the CDN): an assignment counts only when
  a threshold of the root's *assigner* keys signed it, a manifest only when
  a threshold of its *publisher* keys did, so the online assigning key alone
  cannot make the device install a model the publisher did not sign. An
  unsigned document, one signed by other keys or too few, or one altered
  after signing is refused (``UntrustedUpdateError``), as is every update
  while the root in force has expired. Keys pinned the old way (a list of
  ``PublicKey``) are a root of version 0 in which they hold every role.
- An assignment is accepted only when it is unexpired, names this device and
  this model, and either its version is at least the highest version the
  device ever committed (``highest_accepted``) or it says ``rollback: true``
  (which is signed, so only the publisher can order a downgrade). An
  assignment issued before the last committed one is a replay and is refused
  even when it says rollback (``DowngradeError``).
- A manifest is accepted only when it is signed, unexpired (a freeze attack
  serves stale metadata forever) and names exactly the model and version the
  accepted assignment asked for (an old signed manifest served in place of a
  new one is refused).
- ``highest_accepted`` and ``last_issued_at`` only grow; they move when an
  update is committed (``after_commit``), never on mere receipt, so a failed
  install does not lock the device out of its running version.
- A manifest stored beside an installed model is re-checked against the
  publisher role when the device restarts (``verify_installed_manifest``),
  but not for expiry: a model that was valid when installed keeps serving.
  A publisher key removed from the root no longer vouches for it (keep the
  old key in the role until the fleet runs a version the new one signed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared import (
    Assignment,
    ManifestError,
    ModelManifest,
    PublicKey,
    TrustedRoot,
    parse_time,
    validate_name,
    verify_signed,
)

from .._errors import DowngradeError, UntrustedUpdateError

__all__ = ["Trust", "TrustRecord", "UpdateTrust", "as_root", "verify_installed_manifest"]

Trust = Sequence[PublicKey] | TrustedRoot
"""What a device trusts: a root, or publisher keys pinned the old way."""


def as_root(trust: Trust) -> TrustedRoot:
    """``trust`` as a root (pinned keys: root version 0, every role, threshold 1)."""
    if isinstance(trust, TrustedRoot):
        return trust
    if not trust:
        raise ValueError("pin at least one publisher key: a device trusting none updates never")
    return TrustedRoot.pinned(trust)


@dataclass(frozen=True)
class TrustRecord:
    """What the device persists between runs about the updates it accepted."""

    highest_accepted: int = 0  # the highest version ever committed; 0 before the first
    last_issued_at: str | None = None  # issued_at of the last committed assignment

    def to_dict(self) -> dict[str, Any]:
        return {"highest_accepted": self.highest_accepted, "last_issued_at": self.last_issued_at}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrustRecord:
        highest = d.get("highest_accepted", 0)
        issued = d.get("last_issued_at")
        if not isinstance(highest, int) or isinstance(highest, bool) or highest < 0:
            raise ValueError(f"highest_accepted must be an integer >= 0, got {highest!r:.40}")
        if issued is not None:
            parse_time(issued, "last_issued_at")
        return cls(highest, issued)


class UpdateTrust:
    """The trusted root and the device's update history, and the checks they make."""

    def __init__(
        self,
        trusted_keys: Trust,
        *,
        device_id: str,
        model: str,
        record: TrustRecord | None = None,
    ) -> None:
        self.root = as_root(trusted_keys)
        self.device_id = validate_name(device_id, "device id")
        self.model = validate_name(model, "model name")
        self.record = record or TrustRecord()

    def accept_assignment(self, raw: bytes | str, *, now: datetime | None = None) -> Assignment:
        """The assignment in ``raw`` if this device may act on it; else raise."""
        try:
            self.root.check_fresh(now)
            assignment = self.root.verify_assignment(raw, now=now)
        except ManifestError as e:  # SignatureError and ExpiredError included
            raise UntrustedUpdateError(f"assignment refused: {e}") from e
        if assignment.device != self.device_id:
            raise UntrustedUpdateError(
                f"assignment refused: it is for device {assignment.device!r}, "
                f"not {self.device_id!r}"
            )
        if assignment.model != self.model:
            raise UntrustedUpdateError(
                f"assignment refused: it is for model {assignment.model!r}, not {self.model!r}"
            )
        highest = self.record.highest_accepted
        if assignment.version < highest and not assignment.rollback:
            raise DowngradeError(
                f"assignment refused: version {assignment.version} is below the highest "
                f"accepted {highest} and the publisher did not sign a rollback"
            )
        last = self.record.last_issued_at
        if last is not None and parse_time(assignment.issued_at, "issued_at") < parse_time(
            last, "last_issued_at"
        ):
            raise DowngradeError(
                f"assignment refused: issued at {assignment.issued_at}, before the last "
                f"accepted one ({last}): a replay"
            )
        return assignment

    def accept_manifest(
        self, raw: bytes | str, assignment: Assignment, *, now: datetime | None = None
    ) -> ModelManifest:
        """The manifest in ``raw`` if it is the signed, current one for ``assignment``."""
        try:
            manifest = self.root.verify_manifest(raw, now=now)
        except ManifestError as e:
            raise UntrustedUpdateError(f"manifest refused: {e}") from e
        if manifest.name != assignment.model or manifest.version != assignment.version:
            raise UntrustedUpdateError(
                f"manifest refused: it describes {manifest.name}@{manifest.version}, "
                f"the assignment asks for {assignment.model}@{assignment.version}"
            )
        return manifest

    def after_commit(self, assignment: Assignment) -> TrustRecord:
        """The record once ``assignment`` is installed; the caller persists it, then sets it."""
        last = self.record.last_issued_at
        if last is None or parse_time(assignment.issued_at, "issued_at") > parse_time(
            last, "last_issued_at"
        ):
            last = assignment.issued_at
        return TrustRecord(max(self.record.highest_accepted, assignment.version), last)


def verify_installed_manifest(
    raw: bytes | str, trusted_keys: Trust, *, model: str, version: int
) -> ModelManifest:
    """A stored manifest, re-checked against the publisher role; expiry is not checked."""
    root = as_root(trusted_keys).root
    try:
        document = json.loads(raw)
        manifest = ModelManifest.from_dict(
            verify_signed(
                document,
                root.role_keys("publisher"),
                threshold=root.roles["publisher"].threshold,
            )
        )
    except (ValueError, RecursionError) as e:  # ManifestError is a ValueError
        raise UntrustedUpdateError(f"stored manifest of {model}@{version} refused: {e}") from e
    if manifest.name != model or manifest.version != version:
        raise UntrustedUpdateError(
            f"stored manifest describes {manifest.name}@{manifest.version}, "
            f"found where {model}@{version} belongs"
        )
    return manifest
