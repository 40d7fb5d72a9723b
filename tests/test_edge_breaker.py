from __future__ import annotations

import pytest

from edge_agent import BreakerState, CircuitBreaker


class FakeClock:
    """A clock the test moves by hand (the breaker takes any callable)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_and_probes_after_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=1.0, clock=clock)
    for _ in range(2):
        breaker.record_failure()
        assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    clock.now += 1.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the one probe
    assert not breaker.allow()  # nobody else while it is out
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()


def test_failed_probe_doubles_cooldown_up_to_max() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=1.0, max_cooldown_s=3.0, clock=clock)
    breaker.record_failure()
    cooldowns = []
    for _ in range(4):
        waited = 0.0
        while not breaker.allow():
            clock.now += 0.25
            waited += 0.25
        cooldowns.append(waited)
        breaker.record_failure()
    assert cooldowns == [1.0, 2.0, 3.0, 3.0]


def test_success_resets_failure_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2, clock=FakeClock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED


def test_lost_probe_frees_the_slot() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=1.0, probe_timeout_s=5.0, clock=clock)
    breaker.record_failure()
    clock.now += 1.0
    assert breaker.allow()
    clock.now += 5.5  # the probe never reported
    assert breaker.allow()


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(failure_threshold=0)


def test_hearing_from_a_silent_cloud_ends_the_cool_down_at_once() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        failure_threshold=1, cooldown_s=60.0, max_cooldown_s=600.0, clock=clock
    )
    breaker.probe_now()  # closed: nothing to end
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure()  # silence: a timeout, a lost broker
    assert breaker.awaiting_silence and not breaker.allow()
    breaker.probe_now()
    assert breaker.state is BreakerState.HALF_OPEN and not breaker.awaiting_silence
    assert breaker.allow() and not breaker.allow()  # one probe, as after a cool-down
    breaker.record_failure()  # the probe failed: the cool-down doubles as usual
    clock.now += 60.0
    assert breaker.state is BreakerState.OPEN


def test_a_hub_that_answered_overloaded_keeps_its_cool_down() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        failure_threshold=1, cooldown_s=60.0, max_cooldown_s=600.0, clock=clock
    )
    breaker.record_failure(answered=True)
    assert not breaker.awaiting_silence
    breaker.probe_now()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()


def test_a_success_resets_the_doubled_cool_down() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=1.0, max_cooldown_s=8.0, clock=clock)
    breaker.record_failure()
    for _ in range(2):  # two failed probes: the cool-down is 4 s now
        clock.now += 10.0
        assert breaker.allow()
        breaker.record_failure()
    clock.now += 4.0
    assert breaker.allow()
    breaker.record_success()  # the cloud is back: the next outage starts from the base again
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.now += 1.0
    assert breaker.state is BreakerState.HALF_OPEN
