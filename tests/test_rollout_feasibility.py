"""What a rollout's plan can decide (``model_cdn.rollout._feasibility``): pure arithmetic,
checked against the judge that decides for real (``_significance.judge``) so the plan and
the gate cannot drift apart, and against what a plan must refuse."""

from __future__ import annotations

import math
from typing import Any

import pytest

from model_cdn.rollout import Verdict
from model_cdn.rollout._feasibility import Traffic, TrafficRates, describe_plan, plan, traffic_of
from model_cdn.rollout._gates import stats_config
from model_cdn.rollout._significance import ProportionObs, judge, summarize_proportions

from ._rollout_machine import _gated


def _cohort(m: int, trials: int, p: float) -> list[ProportionObs]:
    """``m`` devices with the same rate ``p``: no spread beyond the binomial."""
    n = trials / m
    return [ProportionObs(f"d{i}", p * n, n) for i in range(m)]


@pytest.mark.parametrize(("m", "p", "margin"), [(3, 0.97, 0.02), (10, 0.97, 0.02), (5, 0.9, 0.05)])
def test_the_samples_a_plan_asks_for_are_what_the_judge_needs(
    m: int, p: float, margin: float
) -> None:
    spec = _gated("50%,all", max_agreement_drop=margin, min_health_samples=1, looks=12)
    traffic = Traffic(devices=2 * m, rates={"agreement": p}, spread={"agreement": 0.0})
    [wave, _last] = plan(spec, [m, 2 * m], [m, 0], traffic)["waves"]
    [gate] = wave["gates"]
    need = gate["samples_needed"]
    config = stats_config(spec)

    def verdict(trials: int) -> Verdict:
        new = summarize_proportions(_cohort(m, trials, p), config)
        control = summarize_proportions(_cohort(m, trials, p), config)
        return judge(new, control, margin=margin, higher_is_worse=False, config=config).verdict

    assert verdict(math.ceil(need * 1.02)) is Verdict.PASS  # enough: a good version passes
    assert verdict(math.floor(need * 0.9)) is Verdict.INCONCLUSIVE  # 10% fewer: not yet


def test_time_to_a_decision_is_the_first_look_after_the_samples_arrive() -> None:
    spec = _gated("10,all", soak_s=10.0, max_soak_s=1000.0, looks=4, min_health_samples=1)
    traffic = Traffic(devices=40, compared_per_s=2.0, rates={"agreement": 0.97}, spread={})
    p = plan(spec, [10, 40], [10, 0], traffic)
    gate = p["waves"][0]["gates"][0]
    t = gate["samples_needed"] / (10 * 2.0)
    assert p["looks_s"] == pytest.approx([10.0, 46.4159, 215.4435, 1000.0], rel=1e-4)
    assert (
        p["looks_s"][gate["look"] - 2] < t <= gate["decision_s"] == p["looks_s"][gate["look"] - 1]
    )
    assert p["waves"][1]["why"].endswith("not judged") and p["waves"][1]["decidable"]
    assert p["undecidable"] == [] and p["expected_s"] == gate["decision_s"] + 10.0
    slow = plan(spec, [10, 40], [10, 0], Traffic(compared_per_s=0.001, rates={"agreement": 0.97}))
    assert slow["undecidable"] == [1]
    assert "not before the last look" in slow["waves"][0]["why"]


def test_a_spread_not_measured_yet_is_assumed_and_said() -> None:
    spec = _gated("3,all", min_health_samples=1, max_soak_s=3600.0)
    young = Traffic(compared_per_s=5.0, rates={"agreement": 0.97})  # counters too short
    [gate] = plan(spec, [3, 40], [3, 0], young)["waves"][0]["gates"]
    assert not gate["decidable"] and gate["spread"] == "assumed"
    measured = Traffic(compared_per_s=5.0, rates={"agreement": 0.97}, spread={"agreement": 0.0})
    assert plan(spec, [3, 40], [3, 0], measured)["waves"][0]["decidable"]


def test_what_no_amount_of_waiting_can_decide() -> None:
    spec = _gated("1,all", min_health_samples=1)
    few = plan(spec, [1, 40], [1, 0], Traffic())["waves"][0]
    assert not few["decidable"] and "1 vs 1 devices: 2 each needed" in few["why"]
    noisy = Traffic(compared_per_s=100.0, rates={"agreement": 0.9}, spread={"agreement": 0.01})
    wave = plan(spec, [3, 40], [3, 0], noisy)["waves"][0]
    assert not wave["decidable"] and "differ too much" in wave["why"]
    unknown = plan(spec, [10, 40], [10, 0], Traffic())["waves"][0]  # no traffic heard yet
    assert unknown["decidable"] and unknown["decision_s"] is None
    assert unknown["gates"][0]["why"] == "traffic not known yet: no time estimate"


def test_the_failures_that_halt_each_wave_are_spelled_out() -> None:
    spec = _gated("5,20,all", max_failure_rate=0.1, max_agreement_drop=None)
    p = plan(spec, [5, 20, 40], [0, 0, 0], Traffic())
    assert [w["failures_to_halt"] for w in p["waves"]] == [1, 3, 5]
    assert p["expected_s"] == 3 * spec.soak_s and not p["gated"]
    lines = describe_plan(p)
    assert lines[0] == "wave 1: 5 devices; 1 failure(s) halt it"
    assert lines[-1] == "expected time to completion: about 30 s"


def test_rates_come_from_successive_counters_and_restarts_are_skipped() -> None:
    rates = TrafficRates()
    rates.observe("a", 0.0, 100, 10)
    rates.observe("a", 10.0, 200, 30)  # 10 req/s, 2 comparisons/s
    assert rates.rates["a"] == (10.0, 2.0)
    rates.observe("a", 20.0, 5, 1)  # a restart: counters went back, no rate from it
    rates.observe("a", 30.0, 205, 21)  # 20/s and 2/s: averaged with the earlier rate
    assert rates.rates["a"] == (15.0, 2.0)
    rates.observe("b", 5.0, 10, 1)
    rates.observe("b", 5.0, 20, 2)  # the same instant: no rate
    assert "b" not in rates.rates
    rates.forget(["a"])
    assert set(rates.rates) == {"a"}


def test_traffic_pools_the_baseline_and_measures_the_spread() -> None:
    def report(agreed: int, n: int = 1000) -> dict[str, int]:
        return {
            "requests": n,
            "errors": n // 100,
            "offloads": n,
            "agreement_samples": n,
            "agreed": agreed * n // 1000,
        }

    reports = [report(970) for _ in range(11)] + [report(570)]
    t = traffic_of(reports, [(10.0, 1.0), (20.0, 3.0), (30.0, 2.0)])
    assert t.devices == 12 and (t.requests_per_s, t.compared_per_s) == (20.0, 2.0)
    assert t.rates["agreement"] == pytest.approx((11 * 970 + 570) / 12000)
    assert t.rates["error_rate"] == pytest.approx(0.01) and t.spread["error_rate"] == 0.0
    assert t.spread["agreement"] > 0.01  # one device far off: the devices differ
    young = traffic_of([report(970, n=100) for _ in range(12)], [])
    assert young.spread == {} and young.requests_per_s is None  # too few trials to tell


# ---------------------------------------------- the README's rollout on a virtual fleet


def _readme_rollout(devices: int, waves: str) -> tuple[dict[str, Any], Any]:
    """The README's 'rollout start' on ``devices`` simulated devices (virtual clock): the
    plan as the controller works it out after two heartbeats, and how the rollout ends."""
    from model_cdn.rollout import Rollout, RolloutSpec
    from model_cdn.rollout._requests import plan_for
    from shared import SigningKey
    from tandem.simulator import SimulatorConfig, VirtualFleet

    key = SigningKey.generate()
    config = SimulatorConfig(
        devices=devices, trusted_keys=(key.public_key,), model="mnist-edge", initial_version=1
    )
    fleet = VirtualFleet(config, key)
    spec = RolloutSpec(
        model="mnist-edge",
        version=2,
        previous_version=1,
        waves=waves,
        target={"site": "factory-a"},
        soak_s=5.0,
        max_failure_rate=0.02,
        max_agreement_drop=0.02,
    )
    rates = TrafficRates()
    for at in (fleet.now, fleet.now + 30.0):  # two heartbeats each, as the controller hears
        for name, device in fleet.devices.items():
            report = device.report(at)
            fleet.fleet.observe_report(report, at)
            rates.observe(name, at, report.requests, report.agreement_samples)
    fleet._run_until(fleet.now + 30.0)
    rollout = Rollout(spec)
    candidates = {r.device: r.labels for r in fleet.fleet.select(model=spec.model)}
    rollout.start(candidates, fleet.now, dict.fromkeys(candidates, 1))
    return plan_for(rollout, fleet.fleet, rates), fleet.rollout(spec, max_s=3 * 3600)


def test_the_readmes_rollout_on_200_devices_is_refused_up_front_and_would_halt() -> None:
    # issue 21: on ~200 devices (3 vs 3 controls in wave 1) it waited silently ~30 min
    planned, outcome = _readme_rollout(200, "5%,25%,100%")
    first = planned["waves"][0]
    assert (first["devices"], first["controls"], planned["undecidable"]) == (3, 3, [1])
    assert describe_plan(planned)[-1].startswith("expected: wave 1 halts as inconclusive")
    assert (outcome.state, outcome.wave) == ("halted", 0)  # the plan was right
    assert outcome.reason.startswith("health gate inconclusive after 12 looks")


def test_the_readmes_rollout_on_1000_devices_is_planned_and_completes() -> None:
    planned, outcome = _readme_rollout(1000, "5%,25%,100%")
    assert planned["undecidable"] == [] and planned["expected_s"] is not None
    first = planned["waves"][0]
    assert (first["devices"], first["controls"]) == (17, 17)
    assert outcome.state == "completed"
