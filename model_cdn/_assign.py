"""Assignments: which model version a device should run, signed.

``make_assignment`` builds and signs the document (pure apart from the
clock). Delivering it (stored in the registry, published retained on the
device's ``…/dev/{device}/assign`` topic at QoS 1) is
``AssignmentPublisher``'s job (``_publisher``), through
``assign_version`` (``_operations``) or the rollout controller.

``publish_assignment`` is the deprecated short-lived way to publish one
document; it now opens an ``AssignmentPublisher`` for the one call.
"""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

from shared import (
    Assignment,
    MqttSettings,
    SigningKey,
    Topics,
    format_time,
    sign_document,
)

from ._errors import CdnError

__all__ = ["make_assignment", "publish_assignment"]

_PUBLISH_TIMEOUT_S = 10.0


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


def publish_assignment(
    settings: MqttSettings,
    topics: Topics,
    device: str,
    signed_doc: dict[str, Any],
    *,
    timeout_s: float = _PUBLISH_TIMEOUT_S,
) -> None:
    """Deprecated: use ``AssignmentPublisher`` (or ``assign_version``, which also stores it).

    Publishes ``signed_doc`` retained at QoS 1 on ``topics.assign(device)``
    over a connection of its own and waits for PUBACK; raises ``BrokerError``
    (a ``CdnError``) with one clear line when the broker cannot be reached,
    refuses the connection or the message, or does not acknowledge in time.
    """
    warnings.warn(
        "publish_assignment is deprecated: use model_cdn.AssignmentPublisher (one connection"
        " for many assignments) or model_cdn.assign_version (which also stores it)",
        DeprecationWarning,
        stacklevel=2,
    )
    from ._publisher import AssignmentPublisher

    with AssignmentPublisher.connect(settings, topics, ack_timeout_s=timeout_s) as publisher:
        publisher.publish(device, signed_doc)
