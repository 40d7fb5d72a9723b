"""Staged, health-gated model rollouts: the spec and the pure state machine.

The controller that drives a ``Rollout`` (clock, registry DB, MQTT assignments)
builds on this package; see ``_machine`` for the states and invariants.
"""

from ._machine import (
    Action,
    Assign,
    DeviceStatus,
    HealthMetrics,
    Notify,
    Rollout,
    RolloutState,
    RolloutStateError,
    Unassign,
)
from ._spec import RolloutSpec, Wave, parse_waves, plan_waves

__all__ = [
    "Action",
    "Assign",
    "DeviceStatus",
    "HealthMetrics",
    "Notify",
    "Rollout",
    "RolloutSpec",
    "RolloutState",
    "RolloutStateError",
    "Unassign",
    "Wave",
    "parse_waves",
    "plan_waves",
]
