"""The rollout status object the admin API returns (pure; see the spec in the README)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ._machine import DeviceStatus, Rollout

__all__ = ["TERMINAL_STATES", "status_view"]

TERMINAL_STATES = frozenset({"completed", "aborted", "rolled_back"})

_WAVE_KEYS = ("installed", "failed", "timed_out", "assigned", "queued")


def status_view(
    rollout_id: str,
    rollout: Rollout,
    *,
    created_at: float,
    updated_at: float,
    now: float | None = None,
) -> dict[str, Any]:
    """JSON-able summary: state, reason, per-status counts, per-wave counts, the health
    gates (every judgement with its interval and sample sizes, and their history),
    and ``waiting``: why the current wave has not ended yet."""
    spec = rollout.spec
    counts = Counter(d.status.value for d in rollout.devices.values())
    waves: list[dict[str, Any]] = []
    lo = 0
    for k, hi in enumerate(rollout.wave_ends):
        members = Counter(d.status.value for d in rollout.devices.values() if d.wave == k)
        wave: dict[str, Any] = {
            "index": k,
            "planned": hi - lo,
            "devices": sum(members.values()),
        }
        wave.update({key: members.get(key, 0) for key in _WAVE_KEYS})
        waves.append(wave)
        lo = hi
    return {
        "id": rollout_id,
        "model": spec.model,
        "version": spec.version,
        "previous_version": spec.previous_version,
        # what a rollback sends devices to: {version: devices}, each its own previous
        "previous_versions": {str(v): n for v, n in rollout.previous_versions().items()},
        "state": rollout.state.value,
        "reason": rollout.reason,
        "wave": rollout.wave,
        "waves_total": len(rollout.wave_ends) or len(spec.waves),
        "created_at": created_at,
        "updated_at": updated_at,
        "target": dict(spec.target),
        "spec": spec.to_dict(),
        "failure_rate": rollout.failure_rate,
        "counts": {
            "total": len(rollout.devices),
            **{s.value: counts.get(s.value, 0) for s in DeviceStatus},
        },
        "waves": waves,
        "gates": rollout.health.view(),
        "waiting": rollout.waiting(time.time() if now is None else now),
        "history": list(rollout.history),  # operator actions: at, action, wave, by, reason
    }
