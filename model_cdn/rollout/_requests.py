"""What a request to start a rollout may say, checked against the registry and the fleet.

``spec_from`` turns the admin API's JSON body into a ``RolloutSpec`` (or
``RolloutRequestError``; an unknown model or version is
``ModelNotFoundError``); ``explain_empty`` adds what the fleet looks like to
the machine's "no device" refusals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import ModelNotFoundError, RolloutRequestError
from ..fleet._view import FleetView
from ..registry import Registry
from ._spec import RolloutSpec

__all__ = ["SPEC_FIELDS", "explain_empty", "spec_from"]

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


def spec_from(body: Mapping[str, Any], registry: Registry) -> RolloutSpec:
    if not isinstance(body, Mapping):
        raise RolloutRequestError("the body is a JSON object")
    unknown = set(body) - SPEC_FIELDS - {"model", "version", "previous_version"}
    if unknown:
        raise RolloutRequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
    model, version = body.get("model"), body.get("version")
    if not isinstance(model, str) or not model:
        raise RolloutRequestError("'model' names the model to roll out")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RolloutRequestError("'version' is the positive version number to roll out")
    registry.get_version(model, version)  # ModelNotFoundError: 404
    previous = body.get("previous_version")
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
