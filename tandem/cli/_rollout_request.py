"""What ``tandem rollout start`` sends: the rollout API's request for what was typed.

Checked here, in the order it is typed, so a bad command line sends nothing
(one line on stderr, exit 2).
"""

from __future__ import annotations

from typing import Any

from ._admin import parse_labels, parse_model_at_version
from ._common import fail

__all__ = ["start_request"]


def start_request(
    command: str,
    what: str,
    waves: str | None,
    target: list[str] | None,
    from_version: int | None,
    min_reports: int,
    min_health_samples: int,
) -> dict[str, Any]:
    """The rollout API's request for what was typed, checked in the order it is typed."""
    model, version = parse_model_at_version(what, command)
    if waves is None:
        fail(command, "--waves is required, e.g. --waves 5%,25%,100% (or 5,50,all)", 2)
    from model_cdn.rollout import parse_waves

    try:
        parse_waves(waves)
    except ValueError as e:
        fail(command, f"--{e}", 2)
    labels = parse_labels(target or [], "--target", command)
    if min_reports < 1:
        fail(command, f"--min-reports must be at least 1, got {min_reports}", 2)
    if min_health_samples < 0:
        fail(command, f"--min-health-samples must be 0 or more, got {min_health_samples}", 2)
    if from_version is not None and (from_version < 1 or from_version == version):
        fail(command, f"--from must be a version ≥ 1 other than {version}, got {from_version}", 2)
    body: dict[str, Any] = {
        "model": model,
        "version": version,
        "waves": waves,
        "min_reports": min_reports,
        "min_health_samples": min_health_samples,
    }
    if labels:
        body["target"] = labels
    if from_version is not None:
        body["previous_version"] = from_version
    return body
