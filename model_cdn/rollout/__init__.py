"""Staged, health-gated model rollouts: the spec, the pure state machine, the statistics.

The controller that drives a ``Rollout`` (clock, registry DB, MQTT assignments)
builds on this package; see ``_machine`` for the states and invariants, and
``_significance`` for the canary judgement (non-inferiority, device as the unit).
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
from ._significance import Judgement, Verdict, t_quantile
from ._spec import RolloutSpec, Wave, parse_waves, plan_waves
from ._view import TERMINAL_STATES, status_view

__all__ = [
    "TERMINAL_STATES",
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
    "status_view",
    "t_quantile",
]
