from __future__ import annotations

import numpy as np
import pytest

from edge_agent import (
    HeavyCheck,
    LatencyEstimator,
    NetworkEstimator,
    OffloadPolicy,
    RequestFacts,
    Route,
    UncertainCheck,
    entropy,
    margin,
    max_probability,
    to_probabilities,
)


def _logits(rng: np.random.Generator, n: int, sharpness: np.ndarray | float) -> np.ndarray:
    return rng.normal(size=(n, 10)) * np.reshape(sharpness, (-1, 1))


def test_scores_rank_confident_rows_lower() -> None:
    sure = np.array([[0.97, 0.01, 0.01, 0.01]])
    unsure = np.array([[0.4, 0.35, 0.15, 0.1]])
    for fn in (max_probability, margin, entropy):
        assert fn(sure)[0] < fn(unsure)[0]
    assert entropy(np.full((1, 4), 0.25))[0] == pytest.approx(1.0)
    assert margin(np.array([[0.5, 0.5]]))[0] == pytest.approx(1.0)


def test_to_probabilities_softmaxes_logits_and_keeps_probabilities() -> None:
    logits = np.array([[2.0, -1.0, 0.5]])
    probs = to_probabilities(logits)
    assert probs.sum() == pytest.approx(1.0)
    assert probs.argmax() == 0
    given = np.array([[0.2, 0.8]])
    np.testing.assert_allclose(to_probabilities(given), given)
    # A row in [0, 1] that does not sum to 1 is taken as logits.
    assert to_probabilities(np.array([[0.2, 0.3]])).sum() == pytest.approx(1.0)


def test_calibrated_budget_offloads_that_share_of_a_fresh_stream() -> None:
    rng = np.random.default_rng(0)
    check = UncertainCheck("margin", budget=0.15, adapt=False)
    check.calibrate(_logits(rng, 4000, rng.uniform(0.5, 4.0, 4000)))
    stream = _logits(rng, 4000, rng.uniform(0.5, 4.0, 4000))
    routes = [check.decide(check.scores(row[None])).route for row in stream]
    rate = routes.count(Route.CLOUD) / len(routes)
    assert 0.12 <= rate <= 0.18


def test_online_adaptation_holds_the_budget_under_drift() -> None:
    rng = np.random.default_rng(1)
    check = UncertainCheck("entropy", budget=0.2, window=500, refresh_every=16)
    check.calibrate(_logits(rng, 2000, 4.0))  # calibrated on confident inputs
    drifted = _logits(rng, 3000, 0.7)  # then the inputs get much harder
    fixed = UncertainCheck("entropy", threshold=check.threshold)
    adaptive_routes = [check.decide(check.scores(r[None])).route for r in drifted]
    fixed_routes = [fixed.decide(fixed.scores(r[None])).route for r in drifted]
    tail = adaptive_routes[1000:]
    assert (
        fixed_routes.count(Route.CLOUD) / len(fixed_routes) > 0.6
    )  # a fixed threshold blows the budget
    assert abs(tail.count(Route.CLOUD) / len(tail) - 0.2) < 0.04


def test_heavy_offloads_are_charged_to_the_budget() -> None:
    policy = OffloadPolicy.budget(0.3, heavy=HeavyCheck(max_input_bytes=100), adapt=False)
    local, net = LatencyEstimator(), NetworkEstimator()
    for i in range(400):
        size = 1000 if i % 5 == 0 else 10  # every fifth request is heavy
        policy.before(RequestFacts(payload_bytes=size, deadline_ms=None), local, net)
    assert policy.uncertain is not None
    assert policy.uncertain._effective_budget == pytest.approx((0.3 - 0.2) / 0.8, abs=0.03)


def test_threshold_and_budget_are_exclusive() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        UncertainCheck("margin", threshold=0.5, budget=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        UncertainCheck("margin")
    with pytest.raises(ValueError, match="unknown score"):
        UncertainCheck("vibes", threshold=0.5)
    with pytest.raises(ValueError, match="budget"):
        UncertainCheck("margin", budget=1.5)


def test_user_callable_score() -> None:
    check = UncertainCheck(lambda p: p[:, 0], threshold=0.5, outputs="probabilities")
    assert check.decide(check.scores(np.array([[0.9, 0.1]]))).route is Route.CLOUD
    assert check.decide(check.scores(np.array([[0.1, 0.9]]))).route is Route.LOCAL


def test_heavy_check_by_size_and_by_latency() -> None:
    local = LatencyEstimator(prior_ms=40.0)
    net = NetworkEstimator(prior_rtt_ms=5.0, prior_hub_ms=2.0, prior_bandwidth_bytes_per_s=1e9)
    check = HeavyCheck(max_input_bytes=1000)
    assert check.check(RequestFacts(payload_bytes=5000, deadline_ms=None), local, net).reason == (
        "heavy:input_size"
    )
    late = check.check(RequestFacts(payload_bytes=100, deadline_ms=20.0), local, net)
    assert late is not None and late.reason == "heavy:latency"
    assert check.check(RequestFacts(payload_bytes=100, deadline_ms=100.0), local, net) is None
    # Offloading would be slower still: stay local even though the deadline is missed.
    slow_net = NetworkEstimator(prior_rtt_ms=500.0)
    assert check.check(RequestFacts(payload_bytes=100, deadline_ms=20.0), local, slow_net) is None
    # Queue depth scales the local prediction.
    assert (
        check.check(RequestFacts(payload_bytes=100, deadline_ms=100.0, queue_depth=3), local, net)
        is not None
    )


def test_estimators_learn_from_samples() -> None:
    net = NetworkEstimator(prior_rtt_ms=100.0, alpha=0.5)
    for _ in range(20):
        net.observe(total_ms=12.0, hub_ms=2.0, payload_bytes=100)
    assert net.rtt_ms.get() == pytest.approx(10.0, rel=0.01)
    for _ in range(20):
        net.observe(total_ms=12.0 + 100.0, hub_ms=2.0, payload_bytes=1_000_000)
    assert net.bandwidth_bytes_per_s == pytest.approx(1e7, rel=0.05)
    local = LatencyEstimator(prior_ms=9.0)
    assert local.predict_ms() == 9.0
    local.observe(3.0)
    assert local.predict_ms(queue_depth=1) == pytest.approx(6.0)


def test_a_deadline_reserves_a_slow_local_run_not_the_average_or_a_freak() -> None:
    local = LatencyEstimator(prior_ms=9.0, window=64)
    assert local.predict_high_ms() == 9.0  # the prior until a run is seen
    runs = np.random.default_rng(0).uniform(1.0, 2.0, size=64)
    runs[10] = 500.0  # one freak spike (a page fault, the first run of a session)
    for ms in runs:
        local.observe(float(ms))
    typical = np.sort(runs)[:-1]
    assert local.predict_ms() < local.predict_high_ms() < 500.0
    assert local.predict_high_ms() >= np.quantile(typical, 0.95)
    assert local.predict_high_ms(queue_depth=1) == pytest.approx(2 * local.predict_high_ms())


def test_policy_modes() -> None:
    local, net = LatencyEstimator(), NetworkEstimator()
    facts = RequestFacts(payload_bytes=10, deadline_ms=100.0)
    assert OffloadPolicy.always_cloud().before(facts, local, net).route is Route.CLOUD
    assert OffloadPolicy.always_local().before(facts, local, net).route is Route.LOCAL
    assert OffloadPolicy.always_local().after(np.array([1.0])).route is Route.LOCAL
    no_model = RequestFacts(payload_bytes=10, deadline_ms=100.0, local_model=False)
    decision = OffloadPolicy.always_local().before(no_model, local, net)
    assert (decision.route, decision.reason) == (Route.CLOUD, "no_local_model")


def test_realized_rate_feedback_corrects_a_biased_calibration_set() -> None:
    rng = np.random.default_rng(2)
    check = UncertainCheck("margin", budget=0.2, window=1000, refresh_every=16)
    check.calibrate(_logits(rng, 1000, rng.uniform(0.5, 2.0, 1000)))  # harder than live traffic
    stream = _logits(rng, 1200, rng.uniform(0.8, 3.0, 1200))
    static = UncertainCheck("margin", threshold=check.threshold)
    adaptive = [check.decide(check.scores(r[None])).route for r in stream]
    fixed = [static.decide(static.scores(r[None])).route for r in stream]
    assert fixed.count(Route.CLOUD) / len(fixed) < 0.15  # the stale threshold under-offloads
    tail = adaptive[600:]  # the window still holds mostly calibration scores here
    assert abs(tail.count(Route.CLOUD) / len(tail) - 0.2) < 0.04


def _first_column(probabilities: np.ndarray) -> np.ndarray:
    return probabilities[:, 0]  # the synthetic "score" rides in column 0


def _as_outputs(scores: np.ndarray) -> np.ndarray:
    return np.stack([scores, 1.0 - scores], axis=1)


@pytest.mark.parametrize("budget", [0.2, 0.3])
def test_the_realized_rate_holds_the_budget_on_each_stretch_of_a_shifted_stream(
    budget: float,
) -> None:
    """Issue 21: after a drift the old adaptation (the quantile of a 1,000-score window,
    aimed off the budget by the share realized over that window) overshot while its window
    caught up, then undershot while the overshoot was still in its record: 26% then 17% at
    a 20% budget in the drift demo. The same here, on scores: 8 devices, each calibrated on
    one score distribution, answer 200 requests of it, then the scores shift (the
    calibrated threshold alone would offload about twice the budget) for 750 requests
    each, then 200 more; the fleet's realized share of each stretch is within 2 points of
    the budget."""
    rng = np.random.default_rng(21)
    devices = 8

    def before(n: int) -> np.ndarray:
        return rng.beta(2.0, 5.0, n)

    def after(n: int) -> np.ndarray:
        return np.clip(rng.beta(2.0, 5.0, n) + 0.12, 0.0, 1.0)

    checks = [
        UncertainCheck(_first_column, budget=budget, outputs="probabilities")
        for _ in range(devices)
    ]
    for check in checks:
        check.calibrate(_as_outputs(before(500)))
    frozen = UncertainCheck(_first_column, threshold=checks[0].threshold, outputs="probabilities")

    def rate(scores: np.ndarray) -> float:
        routes = [checks[i % devices].decide(np.array([s])).route for i, s in enumerate(scores)]
        return routes.count(Route.CLOUD) / len(routes)

    stationary, shifted, later = before(200 * devices), after(750 * devices), after(200 * devices)
    frozen_rate = np.mean([frozen.decide(np.array([s])).route is Route.CLOUD for s in shifted])
    assert frozen_rate > 1.7 * budget  # the shift is one a threshold must follow
    assert abs(rate(stationary) - budget) <= 0.02
    assert abs(rate(shifted) - budget) <= 0.02
    assert abs(rate(later) - budget) <= 0.02


def test_a_stationary_stream_is_offloaded_at_the_budget_in_every_stretch() -> None:
    rng = np.random.default_rng(5)
    check = UncertainCheck(_first_column, budget=0.2, outputs="probabilities")
    check.calibrate(_as_outputs(rng.beta(2.0, 5.0, 500)))
    decided = [check.decide(np.array([s])).route is Route.CLOUD for s in rng.beta(2.0, 5.0, 3000)]
    for block in np.array_split(np.array(decided), 6):
        assert abs(block.mean() - 0.2) <= 0.04  # 500 decisions: about 1.8 points of noise
    assert abs(np.mean(decided) - 0.2) <= 0.01
