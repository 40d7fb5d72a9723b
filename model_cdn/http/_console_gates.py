"""Each health-gate cohort counted once, for the console's rollout page.

A rollout's ``gates`` view says how many devices each cohort holds
(``new_devices``, ``control_devices``) and, per gate, how many of them counted
(``judgements[i].new.devices``): outliers a gate excluded, devices whose
telemetry was flagged, and devices with nothing to report yet do not. The
page used to print the first in its header and the second in its table (3
control devices above a table saying 2). ``with_cohorts`` adds one
``gates.cohorts`` entry that the header and the table both read::

    {"new" | "control": {"devices": members, "counted": [fewest, most] over the gates
                         (null before any judgement), "excluded": outliers of any gate,
                         "flagged": devices whose telemetry is not counted}}

Pure: it reads the status dict and returns a copy with the entry added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["cohorts", "with_cohorts"]

_ROLES = ("new", "control")


def cohorts(gates: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Both cohorts of a ``gates`` view: members, counted (by gate), excluded, flagged."""
    judgements = [j for j in gates.get("judgements") or [] if isinstance(j, Mapping)]
    control = set(gates.get("control") or [])
    flagged = sorted(gates.get("flagged") or {})
    out: dict[str, dict[str, Any]] = {}
    for role in _ROLES:
        sides = [j[role] for j in judgements if isinstance(j.get(role), Mapping)]
        counted = [int(s.get("devices", 0)) for s in sides]
        excluded: list[str] = []
        for s in sides:
            excluded += [d for d in s.get("excluded") or [] if d not in excluded]
        out[role] = {
            "devices": int(gates.get(f"{role}_devices") or 0),
            "counted": [min(counted), max(counted)] if counted else None,
            "excluded": excluded,
            "flagged": [d for d in flagged if (d in control) == (role == "control")],
        }
    return out


def with_cohorts(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` with ``gates.cohorts`` added where it has gates."""
    out = dict(status)
    gates = out.get("gates")
    if isinstance(gates, Mapping) and gates.get("state", "off") != "off":
        out["gates"] = {**gates, "cohorts": cohorts(gates)}
    return out
