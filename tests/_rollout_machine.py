"""What the rollout state machine tests share: a fleet of labelled devices, a spec
with test defaults (and one with health gates), and small helpers that pick the
devices assigned, report them installed, round-trip a rollout through JSON, split
it into its new and control cohorts, and feed it heartbeat traffic (``_Traffic``).

Pure and fast: no broker, no clock; time is whatever ``now`` the test passes.
"""

from __future__ import annotations

import json
from typing import Any

from model_cdn.rollout import Assign, Rollout, RolloutSpec, parse_waves

__all__ = [
    "EU",
    "_Traffic",
    "_assigned",
    "_cohorts",
    "_fleet",
    "_gated",
    "_install_all",
    "_roundtrip",
    "_spec",
]

EU = {"region": "eu", "hw": "npu"}


def _fleet(n: int, *, others: int = 3) -> dict[str, dict[str, str]]:
    fleet = {f"dev-{i:03d}": dict(EU) for i in range(n)}
    fleet.update({f"us-{i}": {"region": "us", "hw": "npu"} for i in range(others)})
    return fleet


def _spec(waves: str = "10%,50%,all", **kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {
        "model": "mnist",
        "version": 2,
        "previous_version": 1,
        "waves": parse_waves(waves),
        "target": {"region": "eu"},
        "max_failure_rate": 0.1,
        "min_reports": 1,
        "soak_s": 60.0,
        "device_timeout_s": 1000.0,
    }
    base.update(kw)
    return RolloutSpec(**base)


def _assigned(actions: list[Any], *, rollback: bool = False) -> list[str]:
    return [a.device for a in actions if isinstance(a, Assign) and a.rollback == rollback]


def _install_all(r: Rollout, devices: list[str], now: float) -> list[Any]:
    out: list[Any] = []
    for d in devices:
        out += r.report(d, "installed", 2, now)
    return out


def _roundtrip(r: Rollout) -> Rollout:
    return Rollout.from_dict(json.loads(json.dumps(r.to_dict())))


class _Traffic:
    """Cumulative counters per device, fed to the rollout as heartbeats."""

    def __init__(self, r: Rollout) -> None:
        self.r = r
        self.counts: dict[str, list[int]] = {}

    def beat(
        self,
        devices: list[str],
        version: int,
        now: float,
        *,
        n: int = 100,
        agreement: float = 0.97,
        errors: float = 0.0,
        offloads: float = 1.0,
        p99: float = 10.0,
    ) -> None:
        for i, d in enumerate(devices):
            c = self.counts.setdefault(d, [0, 0, 0, 0])
            jitter = (i % 3) - 1  # devices differ a little: the variance is not zero
            c[0] += n
            c[1] += round(errors * n)
            c[2] += round(offloads * n)
            c[3] += min(n, max(0, round(agreement * n) + jitter))
            report = {
                "version": version,
                "requests": c[0],
                "errors": c[1],
                "offloads": c[2],
                "agreement_samples": c[0],
                "agreed": c[3],
                "p99_ms": p99 * (1 + 0.01 * jitter),
            }
            self.r.telemetry(d, report, now)


def _gated(waves: str = "25%,all", **kw: Any) -> RolloutSpec:
    gates: dict[str, Any] = {
        "max_agreement_drop": 0.02,
        "min_health_samples": 50,
        "soak_s": 10.0,
        "looks": 3,
        "max_soak_s": 30.0,
        **kw,
    }
    return _spec(waves, **gates)


def _cohorts(r: Rollout) -> tuple[list[str], list[str]]:
    book = r.health.book
    assert book is not None
    return book.members("new"), book.members("control")
