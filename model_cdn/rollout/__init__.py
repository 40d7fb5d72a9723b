"""Staged, health-gated model rollouts: the spec, the pure state machine, the statistics.

The controller that drives a ``Rollout`` (clock, registry DB, MQTT assignments)
builds on this package; see ``_machine`` for the states and invariants, and
``_stats`` for the canary judgement (non-inferiority, device as the unit).
"""

from ._machine import (
    Action,
    Assign,
    DeviceStatus,
    Notify,
    Rollout,
    RolloutState,
    RolloutStateError,
    Unassign,
)
from ._spec import RolloutSpec, Wave, parse_waves, plan_waves
from ._stats import Judgement, Verdict, t_quantile

__all__ = [
    "Action",
    "Assign",
    "DeviceStatus",
    "Judgement",
    "Notify",
    "Rollout",
    "RolloutSpec",
    "RolloutState",
    "RolloutStateError",
    "Unassign",
    "Verdict",
    "Wave",
    "parse_waves",
    "plan_waves",
    "t_quantile",
]
