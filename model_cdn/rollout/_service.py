"""The rollout service of ``tandem cdn serve``: one fleet link feeding one controller.

The link is the CDN's one MQTT connection: it hears the fleet's reports and
carries every assignment out, through ``sender`` (an
``AssignmentSender`` with the assigning key), which the controller and
the admin API's assignment PUT share (``create_app`` takes it from
``controller.sender``).

Several ``cdn serve`` replicas on one registry elect one rollout leader
(``_leader``): each service holds a ``LeaderLease`` of ``leader_lease_s``
seconds (``None``: no election, for a single server that must lead), and
only the holder's controller drives rollouts; the others follow.
"""

from __future__ import annotations

from typing import Any

from shared import MqttSettings, SigningKey, Topics

from .._assignment_sender import AssignmentSender
from ..fleet import FleetEvent, FleetLink
from ..registry import Registry
from ._controller import RolloutController
from ._leader import DEFAULT_LEASE_TTL_S, LeaderLease

__all__ = ["FleetService"]


class FleetService:
    """``start()`` connects the link and runs the controller; ``stop()`` undoes both."""

    def __init__(
        self,
        registry: Registry,
        key: SigningKey,
        settings: MqttSettings,
        topics: Topics,
        *,
        leader_lease_s: float | None = DEFAULT_LEASE_TTL_S,
        **controller_options: Any,
    ) -> None:
        self.link = FleetLink(settings, topics, self._on_event)
        self.sender = AssignmentSender(self.link, key=key)
        lease = None if leader_lease_s is None else LeaderLease(registry, ttl_s=leader_lease_s)
        self.controller = RolloutController(
            registry, self.sender, lease=lease, **controller_options
        )

    def _on_event(self, event: FleetEvent) -> None:
        self.controller.submit(event)

    def start(self) -> FleetService:
        self.link.start()
        try:
            self.controller.start()
        except BaseException:
            self.link.stop()
            raise
        return self

    def stop(self) -> None:
        self.controller.stop()
        self.link.stop()

    def __enter__(self) -> FleetService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
