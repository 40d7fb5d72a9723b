"""Canary statistics: is the new version's cohort *not worse* than its control cohort?

Pure: numbers in, a ``Judgement`` out; standard library only (the Student-t
quantile is computed here, checked against SciPy in the tests).

**The device is the unit.** Requests of one device are not independent (one
camera sees one scene all day), so every cohort statistic is built from one
observation per device:

- a *proportion* metric (edge-cloud agreement, error rate, offload rate) is a
  device's events ``k`` out of ``n`` trials in the comparison window;
- a *value* metric (p99 latency) is one number per device, compared on the
  log scale (so the margin is a ratio).

**Estimate and variance per cohort.** Proportions: the ratio estimator with
capped weights, ``p = Σ wᵢ rᵢ / Σ wᵢ`` with ``rᵢ = kᵢ / nᵢ`` and
``wᵢ = min(nᵢ, weight_cap * median n)``, so no device weighs more than
``weight_cap`` typical devices; its variance is the cluster-robust (CR1)
sandwich, the delta method for a ratio metric with the device as cluster,
``V = m/(m-1) Σ wᵢ² (rᵢ - p)² / (Σ wᵢ)²``, floored at the binomial variance of
the pooled rate (clustering only ever adds variance; the floor keeps a cohort
whose devices all saw zero errors from looking certain). Values: the mean of
the devices' logs and its standard error, floored at 1% per device.

**Outliers.** A device whose observation the others make implausible — a
leave-one-out z above ``outlier_z``, counting the binomial noise at the
device's own ``n`` and the spread between the other devices — is excluded and
reported, the most extreme first, but never more than ``max_outliers`` of a
cohort (at least one device once a cohort has three). More suspects than that
are not liars but the version itself, and stay in.

**Judgement.** Degradation ``d = sign * (new - control)`` (``sign`` +1 where
higher is worse), its standard error ``se = √(V_new + V_control)``, degrees of
freedom by Welch-Satterthwaite from the two cluster-robust variances, ``q`` the
t quantile at one-sided level ``alpha``; the interval ``[d - q·se, d + q·se]``
has each end a one-sided bound at ``1 - alpha``:

    upper < margin  → PASS          the new version is not worse by the margin
    lower > margin  → FAIL          it is worse than the margin allows
    otherwise       → INCONCLUSIVE  (also: too few devices or samples)

This is a one-sided non-inferiority test (as in clinical non-inferiority
trials) with Argo Rollouts' three outcomes; Kayenta's idea of an allowed
effect size around a confidence interval of the difference is the margin.

Invariants (``tests/test_rollout_significance.py`` checks them with Hypothesis):

1. the verdict is PASS only if ``upper < margin``, FAIL only if
   ``lower > margin``; the interval contains ``d``;
2. a higher confidence never narrows the interval nor turns INCONCLUSIVE into
   a decision;
3. mirroring a metric (``1 - rate`` with the opposite direction) gives the
   same verdict and interval;
4. up to ``max_outliers`` of a cohort's devices reporting anything cannot turn
   a clear PASS into FAIL nor a clear FAIL into PASS;
5. with no evidence (fewer than ``min_devices`` devices or ``min_samples``
   samples in a cohort) the verdict is INCONCLUSIVE and says why.
"""

from __future__ import annotations

import enum
import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "CohortEstimate",
    "Judgement",
    "ProportionObs",
    "StatsConfig",
    "ValueObs",
    "Verdict",
    "judge",
    "summarize_proportions",
    "summarize_values",
    "t_quantile",
]

_MIN_LOG_SD = 0.01  # a device's log-latency is not known better than to 1%


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class ProportionObs:
    """One device's events ``k`` out of ``n`` trials."""

    device: str
    k: float
    n: float


@dataclass(frozen=True)
class ValueObs:
    """One device's value (a latency in ms: positive)."""

    device: str
    value: float


@dataclass(frozen=True, kw_only=True)
class StatsConfig:
    """How the cohorts are summarized and judged."""

    alpha: float = 0.05  # one-sided level of each bound
    weight_cap: float = 3.0  # a device weighs at most this many median devices
    outlier_z: float = 5.0
    max_outliers: float = 0.05  # share of a cohort that may be excluded as outliers
    min_devices: int = 2  # per cohort
    min_samples: int = 100  # trials per cohort (proportions)


@dataclass(frozen=True)
class CohortEstimate:
    """One cohort's estimate of one metric."""

    devices: int  # devices that count (outliers excluded)
    samples: float  # trials that count (proportions), or devices (values)
    estimate: float | None  # a rate, or the mean log value
    variance: float  # of the estimate; inf when unknown
    excluded: tuple[str, ...] = ()  # outliers, most extreme first

    def to_dict(self) -> dict[str, object]:
        return {
            "devices": self.devices,
            "samples": self.samples,
            "estimate": self.estimate,
            "se": math.sqrt(self.variance) if math.isfinite(self.variance) else None,
            "excluded": list(self.excluded),
        }


@dataclass(frozen=True)
class Judgement:
    """The verdict on one metric, with the evidence behind it."""

    verdict: Verdict
    delta: float | None  # degradation, in the margin's units
    lower: float | None
    upper: float | None
    margin: float
    alpha: float
    new: CohortEstimate
    control: CohortEstimate
    why: str = ""
    extra: dict[str, object] = field(default_factory=dict)


# -- the Student-t quantile ------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (t ≥ 0)."""
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (0.5 ≤ p < 1, df ≥ 1; large df: the normal's)."""
    if not 0.5 <= p < 1.0 or not df >= 1.0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p!r}, df={df!r}")
    return _t_quantile(p, df)


def critical_value(p: float, df: float) -> float:
    """``t_quantile`` with ``df`` rounded *down* to 1/100 (a slightly wider interval) and
    remembered: a gate asks again at every tick with nearly the same df."""
    # (+1e-6: a df of 15.999999999999998 is 16 computed another way, not 15.99)
    return _cached_quantile(p, max(1.0, math.floor(df * 100.0 + 1e-6) / 100.0))


@functools.lru_cache(maxsize=4096)
def _cached_quantile(p: float, df: float) -> float:
    return t_quantile(p, df)


def _t_quantile(p: float, df: float) -> float:
    z = statistics.NormalDist().inv_cdf(p)
    if df > 1e5:
        return z
    lo, hi = z, max(z, 1.0)
    while _t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):  # bisection: the tail is monotone, ~60 steps reach 1e-12
        mid = 0.5 * (lo + hi)
        if _t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# -- one cohort ------------------------------------------------------------------------


def _allowed_outliers(m: int, share: float) -> int:
    if share <= 0 or m < 3:
        return 0
    return max(1, math.floor(share * m))


def _mad_sd(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def _proportion_z(obs: Sequence[ProportionObs], cap: float) -> list[float]:
    """Each device's leave-one-out z: its rate against the others' pooled rate and spread."""
    w = [min(o.n, cap) for o in obs]
    r = [o.k / o.n for o in obs]
    sw = sum(w)
    swr = sum(wi * ri for wi, ri in zip(w, r, strict=True))
    binomial = [ri * (1 - ri) / o.n for ri, o in zip(r, obs, strict=True)]
    spread_all = _mad_sd(r) ** 2 - statistics.median(binomial)
    zs = []
    for i, o in enumerate(obs):
        rest = sw - w[i]
        p = (swr - w[i] * r[i]) / rest if rest > 0 else r[i]
        sd = math.sqrt(max(p * (1 - p), 0.25 / o.n) / o.n + max(spread_all, 0.0))
        gap = max(0.0, abs(r[i] - p) - 0.5 / o.n)  # continuity: counts are whole
        zs.append(gap / sd if sd > 0 else 0.0)
    return zs


def _exclude(devices: Sequence[str], zs: Sequence[float], config: StatsConfig) -> set[int]:
    limit = _allowed_outliers(len(devices), config.max_outliers)
    # Rounded: a rate and its mirror (k/n, 1 - k/n) give z's a few ulps apart, and a
    # device exactly at the limit must be judged the same whichever way a metric points.
    rounded = [round(z, 9) for z in zs]
    suspects = sorted(
        (i for i, z in enumerate(rounded) if z > config.outlier_z),
        key=lambda i: (-rounded[i], devices[i]),
    )
    return set(suspects[:limit])


def summarize_proportions(obs: Sequence[ProportionObs], config: StatsConfig) -> CohortEstimate:
    """The capped-weight ratio estimate of one cohort, its CR1 variance, its outliers."""
    obs = [o for o in obs if o.n > 0 and 0 <= o.k <= o.n]
    if not obs:
        return CohortEstimate(0, 0, None, math.inf)
    cap = config.weight_cap * statistics.median(o.n for o in obs)
    zs = _proportion_z(obs, cap)
    out = _exclude([o.device for o in obs], zs, config)
    excluded = tuple(obs[i].device for i in sorted(out, key=lambda i: -zs[i]))
    kept = [o for i, o in enumerate(obs) if i not in out]
    m = len(kept)
    w = [min(o.n, cap) for o in kept]
    r = [o.k / o.n for o in kept]
    sw = sum(w)
    p = sum(wi * ri for wi, ri in zip(w, r, strict=True)) / sw
    trials = sum(o.n for o in kept)
    if m < 2:
        return CohortEstimate(m, trials, p, math.inf, excluded)
    cr1 = m / (m - 1) * sum((wi * (ri - p)) ** 2 for wi, ri in zip(w, r, strict=True)) / sw**2
    pooled = (sum(o.k for o in kept) + 0.5) / (trials + 1.0)
    floor = pooled * (1 - pooled) / trials
    return CohortEstimate(m, trials, p, max(cr1, floor), excluded)


def summarize_values(obs: Sequence[ValueObs], config: StatsConfig) -> CohortEstimate:
    """The mean log value of one cohort, its standard error squared, its outliers."""
    obs = [o for o in obs if o.value > 0 and math.isfinite(o.value)]
    if not obs:
        return CohortEstimate(0, 0, None, math.inf)
    logs = [math.log(o.value) for o in obs]
    zs = []
    for i in range(len(logs)):
        rest = logs[:i] + logs[i + 1 :]
        if len(rest) < 2:
            zs.append(0.0)
            continue
        sd = max(_mad_sd(rest), _MIN_LOG_SD)
        zs.append(abs(logs[i] - statistics.median(rest)) / sd)
    out = _exclude([o.device for o in obs], zs, config)
    excluded = tuple(obs[i].device for i in sorted(out, key=lambda i: -zs[i]))
    kept = [x for i, x in enumerate(logs) if i not in out]
    m = len(kept)
    mean = statistics.fmean(kept)
    if m < 2:
        return CohortEstimate(m, m, mean, math.inf, excluded)
    var = max(statistics.variance(kept), _MIN_LOG_SD**2) / m
    return CohortEstimate(m, m, mean, var, excluded)


# -- the judgement ---------------------------------------------------------------------


def _welch_df(new: CohortEstimate, control: CohortEstimate) -> float:
    vn, vc = new.variance, control.variance
    denominator = vn**2 / max(new.devices - 1, 1) + vc**2 / max(control.devices - 1, 1)
    if denominator <= 0:
        return float(max(new.devices + control.devices - 2, 1))
    return max(1.0, (vn + vc) ** 2 / denominator)


def _lacking(new: CohortEstimate, control: CohortEstimate, config: StatsConfig, *, value: bool):
    for name, c in (("new", new), ("control", control)):
        if c.devices < config.min_devices:
            return f"{name} cohort has {c.devices} device(s) reporting, {config.min_devices} needed"
        if not value and c.samples < config.min_samples:
            return f"{name} cohort has {c.samples:.0f} samples, {config.min_samples} needed"
    return ""


def judge(
    new: CohortEstimate,
    control: CohortEstimate,
    *,
    margin: float,
    higher_is_worse: bool,
    config: StatsConfig,
    value: bool = False,
) -> Judgement:
    """Non-inferiority of ``new`` against ``control`` within ``margin`` (module docstring).

    ``value``: the estimates are mean logs, and ``margin`` is already a log ratio.
    """
    lacking = _lacking(new, control, config, value=value)
    if lacking or new.estimate is None or control.estimate is None:
        why = lacking or "no data"
        return Judgement(
            Verdict.INCONCLUSIVE, None, None, None, margin, config.alpha, new, control, why
        )
    sign = 1.0 if higher_is_worse else -1.0
    delta = sign * (new.estimate - control.estimate)
    se = math.sqrt(new.variance + control.variance)
    df = _welch_df(new, control)
    q = critical_value(1.0 - config.alpha, df)
    lower, upper = delta - q * se, delta + q * se
    if upper < margin:
        verdict, why = Verdict.PASS, "not worse: the upper bound is inside the margin"
    elif lower > margin:
        verdict, why = Verdict.FAIL, "worse: the lower bound is beyond the margin"
    else:
        verdict, why = Verdict.INCONCLUSIVE, "the interval crosses the margin: more data needed"
    return Judgement(
        verdict, delta, lower, upper, margin, config.alpha, new, control, why, {"df": df, "q": q}
    )
