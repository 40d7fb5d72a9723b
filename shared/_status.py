"""Update status reports that devices publish on ``…/dev/{device}/status``.

JSON, one object per report::

    {"type": "update-status", "device": "cam-7", "model": "mnist", "version": 3,
     "state": "installed", "reason": "", "at": "2026-11-30T09:00:00Z",
     "running_version": 3}

``state`` is one of ``UpdateState``. ``running_version`` is what serves
requests once the report is sent (the old version after a failure).
Unknown fields are kept; decoding a report never trusts its sizes: the
payload is bounded before it is parsed.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from ._errors import ManifestError
from ._topics import NAME_PATTERN

__all__ = ["UpdateState", "UpdateStatus"]

_MAX_BYTES = 16 * 1024


class UpdateState(enum.StrEnum):
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    INSTALLED = "installed"
    FAILED = "failed"
    ROLLED_BACK = "rolled-back"


@dataclass(frozen=True, kw_only=True)
class UpdateStatus:
    device: str
    model: str
    version: int
    state: UpdateState
    at: str
    reason: str = ""
    running_version: int | None = None
    rollout: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            type="update-status",
            device=self.device,
            model=self.model,
            version=self.version,
            state=self.state.value,
            reason=self.reason[:500],
            at=self.at,
            running_version=self.running_version,
        )
        if self.rollout is not None:
            d["rollout"] = self.rollout
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> UpdateStatus:
        if len(raw) > _MAX_BYTES:
            raise ManifestError(f"status report of {len(raw)} bytes; the limit is {_MAX_BYTES}")
        try:
            d = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ManifestError(f"status report is not JSON: {e}") from e
        if not isinstance(d, dict) or d.get("type") != "update-status":
            raise ManifestError("a status report is an object with type 'update-status'")
        device, model, version = d.get("device"), d.get("model"), d.get("version")
        if not isinstance(device, str) or not NAME_PATTERN.fullmatch(device):
            raise ManifestError(f"status report: bad device {device!r:.60}")
        if not isinstance(model, str) or not NAME_PATTERN.fullmatch(model):
            raise ManifestError(f"status report: bad model {model!r:.60}")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ManifestError(f"status report: bad version {version!r:.40}")
        try:
            state = UpdateState(str(d.get("state")))
        except ValueError as e:
            raise ManifestError(f"status report: unknown state {d.get('state')!r:.40}") from e
        running = d.get("running_version")
        if running is not None and (not isinstance(running, int) or isinstance(running, bool)):
            raise ManifestError("status report: running_version must be an integer")
        rollout = d.get("rollout")
        known = {
            "type",
            "device",
            "model",
            "version",
            "state",
            "reason",
            "at",
            "running_version",
            "rollout",
        }
        return cls(
            device=device,
            model=model,
            version=version,
            state=state,
            at=str(d.get("at", "")),
            reason=str(d.get("reason", ""))[:500],
            running_version=running,
            rollout=rollout if isinstance(rollout, str) else None,
            extra={k: v for k, v in d.items() if k not in known},
        )
