"""Assignments: which model version a device should run, signed.

``make_assignment`` builds and signs the document (pure apart from the
clock). Delivering it (stored in the registry, published retained on the
device's ``…/dev/{device}/assign`` topic at QoS 1) is
``AssignmentSender``'s job (``_assignment_sender``), through
``assign_version`` (``_versions``) or the rollout controller.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from shared import (
    Assignment,
    SigningKey,
    format_time,
    sign_document,
)

from ._errors import CdnError

__all__ = ["make_assignment"]


def make_assignment(
    key: SigningKey,
    *,
    device: str,
    model: str,
    version: int,
    rollback: bool = False,
    rollout: str | None = None,
    ttl_days: float = 30,
) -> dict[str, Any]:
    """A signed assignment, valid from now for ``ttl_days`` (days).

    ``rollback=True`` lets the device go below the highest version it has
    accepted; without it a device refuses a lower version.
    """
    if not isinstance(ttl_days, int | float) or isinstance(ttl_days, bool) or not ttl_days > 0:
        raise CdnError(f"ttl_days must be a positive number of days, got {ttl_days!r}")
    now = datetime.now(UTC).replace(microsecond=0)
    assignment = Assignment(
        device=device,
        model=model,
        version=version,
        rollback=rollback,
        rollout=rollout,
        issued_at=format_time(now),
        expires_at=format_time(now + timedelta(days=ttl_days)),
    )
    return sign_document(assignment.to_dict(), key)
