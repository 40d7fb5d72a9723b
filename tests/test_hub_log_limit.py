"""``RateLimitedLog``: a burst in full per window, the rest counted in one summary line."""

from __future__ import annotations

import logging

import pytest

from cloud_hub.mqtt._log_limit import RateLimitedLog


def test_each_window_logs_its_burst_and_the_next_one_starts_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    limited = RateLimitedLog(
        logging.getLogger("t.limit"), "drops", burst=3, window_s=10.0, clock=lambda: now[0]
    )
    with caplog.at_level("WARNING", logger="t.limit"):
        for i in range(50):
            limited.warning("drop %d", i)
        assert [r.getMessage() for r in caplog.records] == ["drop 0", "drop 1", "drop 2"]
        now[0] = 10.0  # the next window: the count first, then its own burst
        limited.warning("drop %d", 50)
        assert [r.getMessage() for r in caplog.records][3:] == [
            "47 more drops in the last 10s, not logged one by one",
            "drop 50",
        ]
        limited.flush()  # nothing suppressed since: no line
        assert len(caplog.records) == 5


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RateLimitedLog(logging.getLogger("t"), "x", burst=0)
