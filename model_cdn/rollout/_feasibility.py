"""What a rollout's plan can decide, worked out before it starts: the arithmetic only.

Pure: no I/O, no clock. ``plan`` takes the spec, the planned waves (cumulative
device counts), how many control devices each wave can have, and what the
fleet's telemetry says about the baseline (``Traffic``), and answers, per
wave: devices against controls, how many failures halt it, and per health
gate the samples each cohort needs before the interval can fit inside the
margin, the time that takes at the fleet's traffic, and the look at which a
decision can come. ``TrafficRates`` turns heartbeats into per-device rates.

The arithmetic (``_significance`` judges the same way): with ``m`` devices per cohort
(the smaller of the two), each look tests at ``alpha = (1 - confidence) /
looks`` one-sided, ``q`` the t quantile at ``2 (m - 1)`` degrees of freedom.
For a version exactly as good as the baseline (rate ``p``), the standard error
of "how much worse" after ``T`` trials per cohort is at least
``sqrt(2 p (1 - p) / T + 2 s / m)`` with ``s`` the device-to-device variance of
the rate beyond the binomial's (measured from the baseline devices' counters once
10 of them have 1,000 trials each; until then assumed ``0.0035 p (1 - p)``, a
standard deviation of 1 point at 97%). The gate can pass once ``q`` of those fit in
the margin ``M``::

    T >= 2 p (1 - p) / ((M / q)^2 - 2 s / m)        (and T >= --min-health-samples)

No ``T`` is enough when ``(M / q)^2 <= 2 s / m`` (too few devices for how much
they differ), nor when ``m < 2``. ``T`` trials take ``T / (m r)`` seconds at
``r`` trials a second per device (edge-cloud comparisons for the agreement
gate, requests for the error and offload gates), and a decision comes only at
the first look after that. p99 latency is one value per device: it decides at
the first look if ``q sqrt(2 v / m) < log(ratio)`` (``v`` the variance of the
devices' log p99, at least 1% squared), never otherwise. These are best
estimates for a version exactly as good as the baseline: chance moves a
decision a look or two either way, and with fewer than 5 devices per
cohort the cohorts' own variance is so uncertain that a decision often
comes later or not at all (the plan says so). With fewer than 2 devices, or
a spread that alone fills the margin, no amount of data decides.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._gates import look_times
from ._significance import t_quantile
from ._spec import RolloutSpec

__all__ = ["Traffic", "TrafficRates", "describe_plan", "plan", "traffic_of"]

# gate metric -> (its margin in the spec, the per-device trials counter, whose rate it is)
_PROPORTION_GATES = {
    "agreement": ("max_agreement_drop", "compared"),
    "error_rate": ("max_error_rate_increase", "requests"),
    "offload_rate": ("max_offload_rate_increase", "requests"),
}
_MIN_LOG_SD = 0.01
_MIN_DEVICES = 2
_SPREAD_TRIALS, _SPREAD_DEVICES = 1000, 10
# device-to-device variance assumed until measured, as a share of p(1 - p): at a 97%
# agreement, a standard deviation of 1 point between devices
_ASSUMED_SPREAD = 0.0035
_FEW = 5  # fewer devices per cohort: the interval's own width is a lottery


@dataclass(frozen=True)
class Traffic:
    """The baseline as the fleet's telemetry shows it (None: not known yet)."""

    devices: int = 0  # devices the figures come from
    requests_per_s: float | None = None  # per device, median
    compared_per_s: float | None = None  # edge-cloud comparisons a second per device, median
    rates: Mapping[str, float] = field(default_factory=dict)  # metric -> pooled rate
    spread: Mapping[str, float] = field(default_factory=dict)  # metric -> extra variance
    log_p99_var: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "requests_per_s": self.requests_per_s,
            "compared_per_s": self.compared_per_s,
            "rates": dict(self.rates),
            "spread": dict(self.spread),
            "log_p99_var": self.log_p99_var,
        }


class TrafficRates:
    """Per-device request and comparison rates from successive heartbeats' counters."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int, int]] = {}
        self.rates: dict[str, tuple[float, float]] = {}  # device -> (requests/s, compared/s)

    def observe(self, device: str, at: float, requests: int, compared: int) -> None:
        last = self._last.get(device)
        self._last[device] = (at, requests, compared)
        if last is None or at <= last[0] or requests < last[1] or compared < last[2]:
            return  # first report, out of order, or a restart: no rate from this pair
        dt = at - last[0]
        rate = ((requests - last[1]) / dt, (compared - last[2]) / dt)
        old = self.rates.get(device)
        self.rates[device] = (
            rate
            if old is None
            else tuple(  # type: ignore[assignment]
                0.5 * a + 0.5 * b for a, b in zip(old, rate, strict=True)
            )
        )

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for d in [d for d in self._last if d not in kept]:
            self._last.pop(d, None)
            self.rates.pop(d, None)


def _spread(obs: Sequence[tuple[float, float]]) -> float | None:
    """Variance of per-device rates k/n beyond the binomial's; None (not measurable)
    unless ``_SPREAD_DEVICES`` devices have ``_SPREAD_TRIALS`` trials each (with fewer,
    binomial noise drowns it)."""
    obs = [(k, n) for k, n in obs if n >= _SPREAD_TRIALS]
    if len(obs) < _SPREAD_DEVICES:
        return None
    r = [k / n for k, n in obs]
    pooled = sum(k for k, _n in obs) / sum(n for _k, n in obs)
    # the binomial part at the pooled rate: a device with few trials and r = 1 is noise too
    binomial = statistics.fmean(pooled * (1 - pooled) / n for _k, n in obs)
    return max(0.0, statistics.variance(r) - binomial)


def traffic_of(
    telemetry: Iterable[Mapping[str, Any]], rates: Iterable[tuple[float, float]]
) -> Traffic:
    """``Traffic`` from the baseline devices' latest heartbeats (counters since their
    start) and their measured rates (requests/s, compared/s)."""
    reports = [t for t in telemetry if isinstance(t, Mapping)]

    def num(t: Mapping[str, Any], key: str) -> float:
        v = t.get(key, 0)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

    pairs = {
        "agreement": [(num(t, "agreed"), num(t, "agreement_samples")) for t in reports],
        "error_rate": [(num(t, "errors"), num(t, "requests")) for t in reports],
        "offload_rate": [(num(t, "offloads"), num(t, "requests")) for t in reports],
    }
    pooled, spread = {}, {}
    for metric, obs in pairs.items():
        n = sum(x for _k, x in obs)
        if n > 0:
            pooled[metric] = sum(k for k, _n in obs) / n
            if (measured := _spread(obs)) is not None:
                spread[metric] = measured
    logs = [math.log(p) for t in reports if (p := num(t, "p99_ms")) > 0]
    heard = list(rates)
    return Traffic(
        devices=len(reports),
        requests_per_s=statistics.median(r for r, _c in heard) if heard else None,
        compared_per_s=statistics.median(c for _r, c in heard) if heard else None,
        rates=pooled,
        spread=spread,
        log_p99_var=statistics.variance(logs) if len(logs) >= 3 else None,
    )


def _gate(
    spec: RolloutSpec, metric: str, m: int, q: float, traffic: Traffic, looks: list[float]
) -> dict[str, Any]:
    out: dict[str, Any] = {"metric": metric, "samples_needed": None, "per_s": None}
    out.update(decision_s=None, look=None, decidable=True, why="")
    if metric == "p99_latency":
        margin = math.log(spec.max_p99_latency_ratio or 1.0)
        var = max(traffic.log_p99_var or 0.0, _MIN_LOG_SD**2)
        if q * math.sqrt(2 * var / m) >= margin:
            out.update(decidable=False, why=f"{m} devices per cohort differ too much in p99")
        else:
            out.update(decision_s=looks[0], look=1)
        return out
    margin_field, counter = _PROPORTION_GATES[metric]
    margin = float(getattr(spec, margin_field))
    p = traffic.rates.get(metric)
    var1 = 0.25 if p is None else max(p * (1 - p), 1e-6)
    spread = traffic.spread.get(metric)
    if spread is None and p is None:
        spread = 0.0  # nothing heard: no basis for a figure (the plan says traffic is unknown)
    elif spread is None:  # not measured yet: assume devices differ as real fleets do
        spread = _ASSUMED_SPREAD * var1
        out["spread"] = "assumed"
    room = (margin / q) ** 2 - 2 * spread / m
    if room <= 0:
        out.update(decidable=False, why=f"{m} devices per cohort differ too much to fit the margin")
        return out
    need = max(math.ceil(2 * var1 / room), spec.min_health_samples)
    per_device = traffic.compared_per_s if counter == "compared" else traffic.requests_per_s
    out["samples_needed"] = need
    if per_device is None:
        out["why"] = "traffic not known yet: no time estimate"
        return out
    if per_device <= 0:
        out.update(decidable=False, why="the devices send no traffic to judge")
        return out
    out["per_s"] = m * per_device
    t = need / out["per_s"]
    look = next((i for i, at in enumerate(looks) if at >= t), None)
    if look is None:
        out.update(decision_s=t, decidable=False, why="not before the last look")
    else:
        out.update(decision_s=looks[look], look=look + 1)
    return out


def plan(
    spec: RolloutSpec, wave_ends: Sequence[int], controls: Sequence[int], traffic: Traffic
) -> dict[str, Any]:
    """Per wave: devices, controls, failures that halt it, and per enabled gate what a
    decision needs and when it can come (module docstring). ``controls[k]``: the
    control devices wave ``k`` can have."""
    looks = look_times(spec, 0.0)
    alpha = (1.0 - spec.confidence) / spec.looks
    metrics = [
        metric
        for metric, (name, _c) in _PROPORTION_GATES.items()
        if getattr(spec, name) is not None
    ] + (["p99_latency"] if spec.max_p99_latency_ratio is not None else [])
    waves, problems, total = [], [], 0.0
    for k, new in enumerate(wave_ends):
        control = min(new, controls[k]) if k < len(controls) else 0
        wave: dict[str, Any] = {
            "wave": k + 1,
            "devices": new,
            "controls": control,
            "failures_to_halt": math.floor(spec.max_failure_rate * new + 1e-9) + 1,
            "gates": [],
            "decision_s": None,
            "decidable": True,
            "why": "",
        }
        if metrics and control == 0:
            wave["why"] = "no device on the previous version left to compare with: not judged"
            wave["decision_s"] = spec.soak_s
        elif metrics and min(new, control) < _MIN_DEVICES:
            wave.update(decidable=False, why=f"{new} vs {control} devices: 2 each needed")
        elif metrics:
            m = min(new, control)
            q = t_quantile(1.0 - alpha, max(1.0, 2.0 * (m - 1)))
            wave["gates"] = [_gate(spec, g, m, q, traffic, looks) for g in metrics]
            blocked = [g for g in wave["gates"] if not g["decidable"]]
            if blocked:
                wave.update(decidable=False, why=f"{blocked[0]['metric']}: {blocked[0]['why']}")
            times = [g["decision_s"] for g in wave["gates"]]
            if not blocked and all(t is not None for t in times):
                wave["decision_s"] = max(spec.soak_s, *times)
        else:
            wave["decision_s"] = spec.soak_s
        if not wave["decidable"]:
            problems.append(k)
        total = total + wave["decision_s"] if wave["decision_s"] is not None else math.nan
        waves.append(wave)
    return {
        "waves": waves,
        "confidence_per_look": 1.0 - alpha,
        "looks_s": looks,
        "max_soak_s": spec.health_max_soak_s,
        "expected_s": None if math.isnan(total) else total,
        "undecidable": [waves[k]["wave"] for k in problems],
        "traffic": traffic.to_dict(),
        "gated": bool(metrics),
    }


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def describe_plan(p: Mapping[str, Any]) -> list[str]:
    """The plan in lines for people: one per wave, then the expected total."""
    conf = f"{p['confidence_per_look'] * 100:.2f}%"
    lines = []
    for w in p["waves"]:
        head = (
            f"wave {w['wave']}: {w['devices']} devices"
            + (f" vs {w['controls']} controls" if p["gated"] else "")
            + f"; {w['failures_to_halt']} failure(s) halt it"
        )
        parts = []
        for g in w["gates"]:
            need = g["samples_needed"]
            if g["metric"] == "p99_latency":
                text = "p99_latency: one value per device"
            elif need is None:
                parts.append(f"{g['metric']}: {g['why']}")
                continue
            else:
                text = f"{g['metric']}: {need:,} samples per cohort"
            if g["per_s"]:
                text += f" at ~{g['per_s']:.1f}/s"
            if g["decidable"] and g["look"]:
                text += f", decision at look {g['look']} (~{_t(g['decision_s'])})"
            elif g["decision_s"] is not None and not g["decidable"]:
                text += f", ~{_t(g['decision_s'])}: after the last look"
            elif g["why"]:
                text += f" ({g['why']})"
            parts.append(text)
        if w["why"] and not w["gates"]:
            parts.append(w["why"])
        if w["decidable"] and w["gates"] and min(w["devices"], w["controls"]) < _FEW:
            parts.append(
                f"only {min(w['devices'], w['controls'])} devices per cohort: expect longer"
            )
        verdict = "" if w["decidable"] else " → CANNOT DECIDE before the max soak"
        lines.append(head + (": " + "; ".join(parts) if parts else "") + verdict)
    if p["gated"]:
        lines.append(
            f"each look tests at {conf}; looks from {_t(p['looks_s'][0])} to "
            f"{_t(p['max_soak_s'])} after a wave starts; times are for a version as good "
            "as the old one (a better one may pass sooner, a worse one later or never)"
        )
    if p["undecidable"]:
        lines.append(
            f"expected: wave {p['undecidable'][0]} halts as inconclusive "
            f"{_t(p['max_soak_s'])} after it starts"
        )
    elif p["expected_s"] is None:
        lines.append("expected time to completion: unknown until the devices' traffic is heard")
    else:
        lines.append(f"expected time to completion: about {_t(p['expected_s'])}")
    return lines
