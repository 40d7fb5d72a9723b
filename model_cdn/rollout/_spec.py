"""What a rollout should do: the waves, the gates, the target; validated on construction.

Pure: no I/O, no clock. ``parse_waves`` turns the operator's ``"1%,10%,50%,100%"`` or
``"5,50,all"`` into ``Wave`` objects; ``plan_waves`` turns waves into cumulative device
counts for one fleet size and refuses a wave that would hold no device.

Waves are cumulative: ``10%`` means "10% of the target fleet in total so far", not
"another 10%". Fractions round half up; counts are capped at the fleet size.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RolloutSpec", "Wave", "parse_waves", "plan_waves"]

_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")
_COUNT = re.compile(r"^\d+$")


@dataclass(frozen=True, kw_only=True)
class Wave:
    """One stage: a cumulative ``fraction`` (0 < f ≤ 1) of the target fleet or ``count``."""

    fraction: float | None = None
    count: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.count is None):
            raise ValueError("a wave has exactly one of fraction or count")
        if self.fraction is not None:
            f = self.fraction
            if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f <= 1:
                raise ValueError(f"a wave fraction is in (0, 1], got {f!r}")
            object.__setattr__(self, "fraction", float(f))
        if self.count is not None:
            c = self.count
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise ValueError(f"a wave count is an integer ≥ 1, got {c!r}")

    def devices(self, fleet_size: int) -> int:
        """Cumulative number of devices this wave covers in a fleet of ``fleet_size``."""
        if self.count is not None:
            return min(self.count, fleet_size)
        assert self.fraction is not None
        # Round half up; the epsilon absorbs float error such as 0.29 * 100 = 28.999….
        return min(fleet_size, math.floor(self.fraction * fleet_size + 0.5 + 1e-9))

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        assert self.fraction is not None
        if self.fraction == 1.0:
            return "all"
        return f"{self.fraction * 100:g}%"

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count} if self.count is not None else {"fraction": self.fraction}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Wave:
        return cls(fraction=d.get("fraction"), count=d.get("count"))


def parse_waves(text: str) -> list[Wave]:
    """Parse ``"1%,10%,50%,100%"`` or ``"5,50,all"`` (cumulative) into waves.

    Raises ``ValueError`` naming the offending item.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("waves: expected a comma-separated list such as '1%,10%,50%,100%'")
    waves: list[Wave] = []
    for i, raw in enumerate(text.split(","), start=1):
        item = raw.strip().lower()
        if not item:
            raise ValueError(f"waves: item {i} is empty in {text!r}")
        if item == "all":
            waves.append(Wave(fraction=1.0))
        elif m := _PERCENT.match(item):
            pct = float(m.group(1))
            if not 0 < pct <= 100:
                raise ValueError(f"waves: item {i} ({raw.strip()!r}) is not in (0%, 100%]")
            waves.append(Wave(fraction=pct / 100))
        elif _COUNT.match(item):
            n = int(item)
            if n < 1:
                raise ValueError(f"waves: item {i} ({raw.strip()!r}) is a count of 0 devices")
            waves.append(Wave(count=n))
        else:
            raise ValueError(
                f"waves: item {i} ({raw.strip()!r}) is neither a percentage ('10%'), "
                "a device count ('50') nor 'all'"
            )
    _check_order(waves)
    return waves


def _check_order(waves: Sequence[Wave]) -> None:
    if not waves:
        raise ValueError("waves: at least one wave is needed")
    for i, w in enumerate(waves):
        if not isinstance(w, Wave):
            raise ValueError(f"waves: item {i + 1} is {type(w).__name__}, not a Wave")
        if w.fraction == 1.0 and i != len(waves) - 1:
            raise ValueError(f"waves: wave {i + 1} ({w}) covers the whole fleet but is not last")
    fractions = [w.fraction for w in waves if w.fraction is not None]
    counts = [w.count for w in waves if w.count is not None]
    for kind, seq in (("percentages", fractions), ("counts", counts)):
        for a, b in itertools.pairwise(seq):
            if b <= a:
                raise ValueError(f"waves: {kind} are cumulative and must increase ({a} then {b})")


def plan_waves(spec: RolloutSpec, fleet_size: int) -> list[int]:
    """Cumulative device counts per wave for ``fleet_size`` target devices.

    Raises ``ValueError`` when the fleet is empty or a wave would add no device
    (e.g. ``1%`` of 40 devices rounds to 0).
    """
    if fleet_size < 1:
        raise ValueError(f"no device matches the rollout's target {spec.target!r}")
    ends: list[int] = []
    prev = 0
    for i, w in enumerate(spec.waves):
        n = w.devices(fleet_size)
        if n <= prev:
            raise ValueError(
                f"wave {i + 1} ({w}) would hold 0 devices for a fleet of {fleet_size} "
                f"(cumulative {n} after {prev}); use fewer or larger waves, or absolute counts"
            )
        ends.append(n)
        prev = n
    return ends


def _opt_nonneg(name: str, v: float | None, *, low: float = 0.0) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < low:
        raise ValueError(f"{name} must be a finite number ≥ {low:g}, got {v!r}")


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """A staged rollout of ``model`` from ``previous_version`` to ``version``.

    Health gates compare the telemetry of the devices on ``version`` with a
    control cohort kept on ``previous_version`` (``_gates``, ``_significance``); ``None``
    disables a gate. An enabled gate blocks the next wave until the evidence
    says "not worse than the margin" at ``confidence``, halts the rollout when
    it says "worse", and halts it as inconclusive after ``max_soak_s`` (default
    the larger of 6 soak times and the soak plus 30 minutes).
    """

    model: str
    version: int
    previous_version: int
    waves: tuple[Wave, ...]
    target: dict[str, str] = field(default_factory=dict)  # label → value; all must match
    max_failure_rate: float = 0.05  # failed / devices in waves started so far
    min_reports: int = 1  # per wave (capped at the wave's size)
    soak_s: float = 600.0  # seconds from a wave's start before the next may start
    device_timeout_s: float = 1800.0  # no terminal report within this → counted as failed
    max_error_rate_increase: float | None = None  # absolute, new - old
    max_p99_latency_ratio: float | None = None  # new / old, e.g. 1.2
    max_offload_rate_increase: float | None = None  # absolute, new - old
    max_agreement_drop: float | None = None  # edge-cloud agreement, absolute, old - new
    min_health_samples: int = 100  # trials per cohort and metric before a gate can decide
    confidence: float = 0.95  # of each gate's decision over all of a wave's looks
    looks: int = 12  # decisions per wave, spaced geometrically from soak_s to the max soak
    max_soak_s: float | None = None  # a wave inconclusive this long halts; None: see below
    max_outliers: float = 0.05  # share of a cohort that may be excluded as outliers
    max_device_rps: float = 1000.0  # requests a second a device may plausibly count

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string")
        for name in ("version", "previous_version", "min_reports", "min_health_samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer ≥ 0, got {v!r}")
        if self.version == self.previous_version:
            raise ValueError("version and previous_version must differ")
        if self.min_reports < 1:
            raise ValueError("min_reports must be ≥ 1")
        waves = self.waves
        if isinstance(waves, str):
            waves = parse_waves(waves)
        waves = tuple(waves)
        _check_order(waves)
        object.__setattr__(self, "waves", waves)
        if not isinstance(self.target, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.target.items()
        ):
            raise ValueError("target maps label names to values, both strings")
        object.__setattr__(self, "target", dict(self.target))
        _opt_nonneg("max_failure_rate", self.max_failure_rate)
        if self.max_failure_rate > 1:
            raise ValueError("max_failure_rate is a fraction in [0, 1]")
        _opt_nonneg("soak_s", self.soak_s)
        _opt_nonneg("device_timeout_s", self.device_timeout_s)
        if self.device_timeout_s <= 0:
            raise ValueError("device_timeout_s must be > 0")
        _opt_nonneg("max_error_rate_increase", self.max_error_rate_increase)
        _opt_nonneg("max_p99_latency_ratio", self.max_p99_latency_ratio, low=1.0)
        _opt_nonneg("max_offload_rate_increase", self.max_offload_rate_increase)
        _opt_nonneg("max_agreement_drop", self.max_agreement_drop)
        c = self.confidence
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0.5 <= c < 1:
            raise ValueError(f"confidence is in [0.5, 1), got {c!r}")
        if isinstance(self.looks, bool) or not isinstance(self.looks, int) or self.looks < 1:
            raise ValueError(f"looks must be an integer >= 1, got {self.looks!r}")
        _opt_nonneg("max_soak_s", self.max_soak_s)
        _opt_nonneg("max_outliers", self.max_outliers)
        if self.max_outliers >= 0.5:
            raise ValueError("max_outliers is a share of a cohort below 0.5")
        _opt_nonneg("max_device_rps", self.max_device_rps)
        if self.max_device_rps <= 0:
            raise ValueError("max_device_rps must be > 0")

    @property
    def health_gated(self) -> bool:
        return any(
            g is not None
            for g in (
                self.max_error_rate_increase,
                self.max_p99_latency_ratio,
                self.max_offload_rate_increase,
                self.max_agreement_drop,
            )
        )

    @property
    def health_max_soak_s(self) -> float:
        """How long a wave may soak while its health is inconclusive."""
        if self.max_soak_s is not None:
            return max(self.max_soak_s, self.soak_s)
        return max(6 * self.soak_s, self.soak_s + 1800.0)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a device with ``labels`` is in the target (every selector label equal)."""
        return all(labels.get(k) == v for k, v in self.target.items())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "waves"
        }
        d["target"] = dict(self.target)
        d["waves"] = [w.to_dict() for w in self.waves]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutSpec:
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        kw["waves"] = tuple(Wave.from_dict(w) for w in d["waves"])
        return cls(**kw)
