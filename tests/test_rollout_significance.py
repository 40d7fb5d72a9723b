"""The canary statistics (``model_cdn.rollout._significance``): the invariants of its docstring.

Pure and fast. The Student-t quantile is checked against SciPy's; the
judgement's invariants with Hypothesis; its calibration (how often a good
version fails, and a bad one passes, when devices differ from each other) by
simulating cohorts with a seeded generator; and the gates' looks
(``model_cdn.rollout._gates``): Bonferroni over a wave's looks, by simulating
whole waves.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import scipy.stats as scipy_stats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_cdn.rollout import RolloutSpec, Verdict, t_quantile
from model_cdn.rollout._evidence import EvidenceBook
from model_cdn.rollout._gates import evaluate, look_times
from model_cdn.rollout._significance import (
    CohortEstimate,
    ProportionObs,
    StatsConfig,
    ValueObs,
    judge,
    summarize_proportions,
    summarize_values,
)


@pytest.mark.parametrize("df", [1, 1.7, 3, 8, 29.5, 200, 5000])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.975, 0.9975, 0.99999])
def test_t_quantile_is_scipys(df: float, p: float) -> None:
    assert t_quantile(p, df) == pytest.approx(float(scipy_stats.t.ppf(p, df)), rel=1e-7, abs=1e-9)


def test_t_quantile_refuses_what_it_cannot_answer() -> None:
    for p, df in ((0.4, 5), (1.0, 5), (0.9, 0.5), (0.9, float("nan"))):
        with pytest.raises(ValueError, match="t_quantile"):
            t_quantile(p, df)


_device = st.tuples(st.integers(0, 400), st.integers(1, 400)).map(
    lambda kn: (min(kn[0], kn[1]), kn[1])
)
_cohort = st.lists(_device, min_size=0, max_size=25)


def _obs(cohort: list[tuple[int, int]], prefix: str) -> list[ProportionObs]:
    return [ProportionObs(f"{prefix}{i}", k, n) for i, (k, n) in enumerate(cohort)]


def _judge(
    new: list[tuple[int, int]],
    control: list[tuple[int, int]],
    *,
    margin: float = 0.02,
    higher_is_worse: bool = False,
    config: StatsConfig | None = None,
):
    c = config or StatsConfig(alpha=0.01, min_samples=50)
    return judge(
        summarize_proportions(_obs(new, "n"), c),
        summarize_proportions(_obs(control, "c"), c),
        margin=margin,
        higher_is_worse=higher_is_worse,
        config=c,
    )


@settings(max_examples=300, deadline=None)
@given(new=_cohort, control=_cohort, margin=st.floats(0.0, 0.2), worse_up=st.booleans())
def test_a_verdict_matches_its_interval(
    new: list[tuple[int, int]], control: list[tuple[int, int]], margin: float, worse_up: bool
) -> None:
    j = _judge(new, control, margin=margin, higher_is_worse=worse_up)
    if j.verdict is Verdict.PASS:
        assert j.upper is not None and j.upper < margin
    elif j.verdict is Verdict.FAIL:
        assert j.lower is not None and j.lower > margin
    if j.delta is not None:
        assert j.lower is not None and j.upper is not None
        assert j.lower <= j.delta <= j.upper
    else:
        assert j.verdict is Verdict.INCONCLUSIVE and j.why


@settings(max_examples=200, deadline=None)
@given(new=_cohort, control=_cohort, margin=st.floats(0.0, 0.2))
def test_more_confidence_never_narrows_the_interval_nor_decides_more(
    new: list[tuple[int, int]], control: list[tuple[int, int]], margin: float
) -> None:
    loose = _judge(new, control, margin=margin, config=StatsConfig(alpha=0.05, min_samples=50))
    strict = _judge(new, control, margin=margin, config=StatsConfig(alpha=0.001, min_samples=50))
    if loose.lower is not None and strict.lower is not None:
        assert strict.lower <= loose.lower + 1e-12 and strict.upper >= loose.upper - 1e-12
    if loose.verdict is Verdict.INCONCLUSIVE:
        assert strict.verdict is Verdict.INCONCLUSIVE


@settings(max_examples=200, deadline=None)
@given(new=_cohort, control=_cohort, margin=st.floats(0.0, 0.2))
def test_mirroring_a_metric_gives_the_same_judgement(
    new: list[tuple[int, int]], control: list[tuple[int, int]], margin: float
) -> None:
    agreement = _judge(new, control, margin=margin, higher_is_worse=False)
    flip = [(n - k, n) for k, n in new], [(n - k, n) for k, n in control]
    disagreement = _judge(*flip, margin=margin, higher_is_worse=True)
    assert agreement.verdict is disagreement.verdict
    if agreement.delta is not None:
        assert disagreement.delta == pytest.approx(agreement.delta, abs=1e-9)
        assert disagreement.upper == pytest.approx(agreement.upper, abs=1e-9)


def test_too_few_devices_or_samples_is_inconclusive_and_says_why() -> None:
    one = _judge([(97, 100)], [(97, 100), (95, 100)])
    assert one.verdict is Verdict.INCONCLUSIVE and "new cohort has 1 device" in one.why
    few = _judge([(9, 10), (10, 10)], [(9, 10), (10, 10)])
    assert few.verdict is Verdict.INCONCLUSIVE and "samples" in few.why
    empty = _judge([], [])
    assert empty.verdict is Verdict.INCONCLUSIVE


def _clear_cohort(rng: random.Random, m: int, rate: float, n: int) -> list[tuple[int, int]]:
    out = []
    for _ in range(m):
        p = min(1.0, max(0.0, rng.gauss(rate, 0.005)))
        out.append((sum(rng.random() < p for _ in range(n)), n))
    return out


_lie = st.tuples(st.integers(0, 10**6), st.integers(1, 10**6)).map(
    lambda kn: (min(kn[0], kn[1]), kn[1])
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10**6),
    bad=st.booleans(),
    lies_new=st.lists(_lie, max_size=1),
    lies_control=st.lists(_lie, max_size=1),
)
def test_a_few_lying_devices_cannot_flip_a_clear_judgement(
    seed: int, bad: bool, lies_new: list[tuple[int, int]], lies_control: list[tuple[int, int]]
) -> None:
    """20 honest devices a side, up to max_outliers (5%: one device) of each lying."""
    rng = random.Random(seed)
    new = _clear_cohort(rng, 20, 0.90 if bad else 0.97, 400)
    control = _clear_cohort(rng, 20, 0.97, 400)
    honest = _judge(new, control)
    want = Verdict.FAIL if bad else Verdict.PASS
    if honest.verdict is not want:
        return  # not a clear case for this draw
    lied = _judge(new + lies_new, control + lies_control)
    assert lied.verdict is not {Verdict.PASS: Verdict.FAIL, Verdict.FAIL: Verdict.PASS}[want]


def test_an_absurd_device_is_excluded_and_reported() -> None:
    rng = random.Random(7)
    control = _obs(_clear_cohort(rng, 20, 0.97, 300), "c")
    liar = ProportionObs("liar", 0, 10**6)
    est = summarize_proportions([*control, liar], StatsConfig())
    assert est.excluded == ("liar",) and est.devices == 20
    assert est.estimate == pytest.approx(0.97, abs=0.01)


def test_more_suspects_than_allowed_are_the_version_itself_and_stay() -> None:
    rng = random.Random(3)
    mixed = _clear_cohort(rng, 17, 0.97, 300) + _clear_cohort(rng, 3, 0.3, 300)
    est = summarize_proportions(_obs(mixed, "d"), StatsConfig(max_outliers=0.05))
    assert len(est.excluded) == 1 and est.devices == 19  # one of three suspects
    assert est.estimate is not None and est.estimate < 0.93


def _rates(trials: int, seed: int, *, new_rate: float, unit: str) -> dict[Verdict, int]:
    """How one look judges ``trials`` simulated canaries with heterogeneous devices."""
    rng = random.Random(seed)
    config = StatsConfig(alpha=0.05, min_samples=100)
    seen = dict.fromkeys(Verdict, 0)
    for _ in range(trials):
        cohorts = []
        for rate in (new_rate, 0.97):
            cohort = []
            for _ in range(12):  # devices differ by 3 points: requests of one are clustered
                p = min(1.0, max(0.0, rng.gauss(rate, 0.03)))
                n = rng.randint(200, 800)
                cohort.append((sum(rng.random() < p for _ in range(n)), n))
            cohorts.append(cohort)
        if unit == "request":  # the naive test: one pooled binomial per cohort
            ests = []
            for cohort in cohorts:
                k, n = sum(c[0] for c in cohort), sum(c[1] for c in cohort)
                ests.append(CohortEstimate(len(cohort), n, k / n, (k / n) * (1 - k / n) / n))
            j = judge(*ests, margin=0.0, higher_is_worse=False, config=config)
        else:
            j = _judge(*cohorts, margin=0.0, config=config)
        seen[j.verdict] += 1
    return seen


def test_with_clustered_devices_the_device_unit_keeps_its_error_rate_and_the_request_does_not():
    """Same rate, margin 0: 'worse' is a false alarm, expected at most alpha (5%)."""
    device = _rates(300, 11, new_rate=0.97, unit="device")
    request = _rates(300, 11, new_rate=0.97, unit="request")
    assert device[Verdict.FAIL] / 300 <= 0.08
    assert request[Verdict.FAIL] / 300 > 2 * device[Verdict.FAIL] / 300


def test_values_are_judged_as_ratios_and_outliers_trimmed() -> None:
    rng = random.Random(5)
    config = StatsConfig(alpha=0.01)
    control = [ValueObs(f"c{i}", 10 * math.exp(rng.gauss(0, 0.05))) for i in range(20)]
    slow = [ValueObs(f"n{i}", 20 * math.exp(rng.gauss(0, 0.05))) for i in range(20)]
    j = judge(
        summarize_values(slow, config),
        summarize_values(control, config),
        margin=math.log(1.2),
        higher_is_worse=True,
        config=config,
        value=True,
    )
    assert j.verdict is Verdict.FAIL and j.lower is not None and math.exp(j.lower) > 1.2
    liar = ValueObs("liar", 1e9)
    est = summarize_values([*control, liar], config)
    assert est.excluded == ("liar",)


def _wave_ends(trials: int, seed: int) -> dict[str, int]:
    """How simulated waves of a version exactly as good as its control end, looking at the
    growing evidence at each of the spec's 12 looks as the rollout machine does."""
    spec = RolloutSpec(
        model="m",
        version=2,
        previous_version=1,
        waves="10%,100%",
        soak_s=60,
        max_soak_s=3600,
        max_error_rate_increase=0.0,  # at the margin: any decision is a wrong one
        confidence=0.95,
        looks=12,
    )
    rng = np.random.default_rng(seed)
    ends = {"pass": 0, "fail": 0, "inconclusive": 0}
    for _ in range(trials):
        book = EvidenceBook(0.0, max_rps=1000.0)
        devices = []  # name, version, error rate, requests, errors; devices differ
        for role, version in (("new", 2), ("control", 1)):
            for i in range(10):
                book.add(f"{role}-{i}", role, version, opened_at=0.0, from_zero=True)
                rate = float(np.clip(rng.normal(0.05, 0.015), 0.0, 1.0))
                devices.append([f"{role}-{i}", version, rate, 0, 0])
        end = "inconclusive"
        for at in look_times(spec, 0.0):
            for d in devices:
                n = int(rng.integers(20, 61))
                d[3] += n
                d[4] += int(rng.binomial(n, d[2]))
                book.observe(d[0], {"version": d[1], "requests": d[3], "errors": d[4]}, at)
            [(_, j)] = evaluate(spec, book)
            if j.verdict is not Verdict.INCONCLUSIVE:
                end = "pass" if j.verdict is Verdict.PASS else "fail"
                break
        ends[end] += 1
    return ends


def test_looking_twelve_times_buys_no_false_halt_and_no_false_pass() -> None:
    """Each look tests at (1 - confidence) / looks: over a wave's 12 looks a version at the
    margin halts, or passes, in at most 1 - confidence (5%) of waves (about 15% each when
    every look spends the whole 5%)."""
    trials = 300
    ends = _wave_ends(trials, seed=7)
    assert ends["fail"] <= 0.05 * trials, ends
    assert ends["pass"] <= 0.05 * trials, ends
