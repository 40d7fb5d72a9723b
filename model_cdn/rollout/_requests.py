"""What a request to start a rollout may say, checked against the registry and the fleet.

``spec_from`` turns the admin API's JSON body into a ``RolloutSpec`` (or
``RolloutRequestError``; an unknown model or version is
``ModelNotFoundError``); ``explain_empty`` adds what the fleet looks like to
the machine's "no device" refusals.

The previous version (the baseline) is, unless the request names one, the
version most of the target's devices run now (of the published ones other
than the new one; the highest on a tie), and only when no device of the
target reports one, the highest published below the new version.
``running_versions`` is what each device runs, for the machine: a rollback
sends each device back to its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import ModelNotFoundError, RolloutRequestError
from ..fleet._view import FleetView
from ..registry import Registry
from ._feasibility import TrafficRates, describe_plan, plan, traffic_of
from ._machine import Rollout
from ._spec import RolloutSpec

__all__ = [
    "OPTIONS",
    "SPEC_FIELDS",
    "explain_empty",
    "plan_for",
    "running_versions",
    "spec_from",
    "undecidable",
]

# what a request may say about starting, besides the spec: see RolloutController.create
OPTIONS = frozenset({"dry_run", "accept_inconclusive", "by"})

# what a request to start a rollout may set, besides model, version and previous_version
SPEC_FIELDS = frozenset(
    {
        "target",
        "waves",
        "max_failure_rate",
        "min_reports",
        "soak_s",
        "device_timeout_s",
        "max_error_rate_increase",
        "max_p99_latency_ratio",
        "max_offload_rate_increase",
        "max_agreement_drop",
        "min_health_samples",
        "confidence",
        "looks",
        "max_soak_s",
        "max_outliers",
        "max_device_rps",
    }
)


def running_versions(fleet: FleetView, model: str, published: set[int], new: int) -> dict[str, int]:
    """The version each device of ``model`` runs, where that is published and not ``new``."""
    out = {}
    for record in fleet.select(model=model):
        v = record.models.get(model)
        if v is not None and v in published and v != new:
            out[record.device] = v
    return out


def _baseline(
    body: Mapping[str, Any], fleet: FleetView, model: str, published: set[int], new: int
) -> int | None:
    target = body.get("target")
    target = target if isinstance(target, Mapping) else {}
    counts: dict[int, int] = {}
    versions = running_versions(fleet, model, published, new)
    for device, v in versions.items():
        labels = fleet.devices[device].labels
        if all(labels.get(k) == want for k, want in target.items()):
            counts[v] = counts.get(v, 0) + 1
    return max(counts, key=lambda v: (counts[v], v)) if counts else None


def spec_from(
    body: Mapping[str, Any], registry: Registry, fleet: FleetView | None = None
) -> RolloutSpec:
    if not isinstance(body, Mapping):
        raise RolloutRequestError("the body is a JSON object")
    unknown = set(body) - SPEC_FIELDS - OPTIONS - {"model", "version", "previous_version"}
    if unknown:
        raise RolloutRequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
    model, version = body.get("model"), body.get("version")
    if not isinstance(model, str) or not model:
        raise RolloutRequestError("'model' names the model to roll out")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RolloutRequestError("'version' is the positive version number to roll out")
    registry.get_version(model, version)  # ModelNotFoundError: 404
    previous = body.get("previous_version")
    if previous is None and fleet is not None:
        published = {v.version for v in registry.list_versions(model)}
        previous = _baseline(body, fleet, model, published, version)
    if previous is None:
        earlier = [v.version for v in registry.list_versions(model) if v.version < version]
        if not earlier:
            raise RolloutRequestError(
                f"{model} has no version below {version} to fall back to; set previous_version"
            )
        previous = max(earlier)
    elif isinstance(previous, int) and not isinstance(previous, bool):
        try:
            registry.get_version(model, previous)
        except ModelNotFoundError as e:
            raise RolloutRequestError(f"previous_version: {e}") from e
    if "waves" not in body:
        raise RolloutRequestError("'waves' is required, e.g. \"5%,25%,100%\"")
    fields = {k: body[k] for k in SPEC_FIELDS if k in body and body[k] is not None}
    try:
        return RolloutSpec(model=model, version=version, previous_version=previous, **fields)
    except (TypeError, ValueError) as e:
        raise RolloutRequestError(str(e)) from e


def explain_empty(spec: RolloutSpec, message: str, fleet: FleetView) -> str:
    if "0 devices" in message or "empty" in message or "no device" in message:
        running = len(fleet.select(model=spec.model))
        target = ", ".join(f"{k}={v}" for k, v in spec.target.items()) or "(all)"
        return f"{message} (target {target}; {running} known devices run {spec.model})"
    return message


def plan_for(rollout: Rollout, fleet: FleetView, rates: TrafficRates) -> dict[str, Any]:
    """What the started (not yet stored) ``rollout``'s waves can decide at the traffic
    the baseline's devices show (``_feasibility``)."""
    spec = rollout.spec
    controls = [
        sum(len(pool) for pool in rollout.control_candidates(k))
        for k in range(len(rollout.wave_ends))
    ]
    base = fleet.select(model=spec.model, version=spec.previous_version)
    traffic = traffic_of(
        (r.telemetry or {} for r in base),
        (rates.rates[r.device] for r in base if r.device in rates.rates),
    )
    return plan(spec, rollout.wave_ends, controls, traffic)


def undecidable(planned: Mapping[str, Any]) -> str:
    """One line: the first wave that cannot decide, and what to do about it."""
    line = describe_plan(planned)[planned["undecidable"][0] - 1]
    return (
        f"this plan cannot reach a decision before the max soak "
        f"({planned['max_soak_s']:g} s): {line.split(' → ')[0]}; use larger waves (more "
        "devices per cohort), a wider margin or a longer --max-soak, or accept_inconclusive "
        "(--accept-inconclusive) to start anyway"
    )
