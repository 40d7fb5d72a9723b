"""The hub's restart back-off: doubling while a process dies young, capped by --restart-max-s."""

from __future__ import annotations

import shutil
from pathlib import Path

from cloud_hub.plane import HubServeSettings
from cloud_hub.plane._launch import plan
from cloud_hub.plane._spec import PlaneSpec
from cloud_hub.plane._supervisor import (
    RESTART_MAX_S,
    RESTART_MIN_S,
    Child,
    HubSupervisor,
    next_backoff,
)


def _waits(cap_s: float, n: int) -> list[float]:
    waits, backoff = [], RESTART_MIN_S
    for _ in range(n):
        backoff = next_backoff(backoff, lived_s=1.0, cap_s=cap_s)
        waits.append(backoff)
    return waits


def test_the_wait_doubles_while_a_process_dies_young_up_to_the_default_cap() -> None:
    waits = _waits(RESTART_MAX_S, 8)
    assert waits[:5] == [2 * RESTART_MIN_S * 2**i for i in range(5)]
    assert max(waits) == waits[-1] == RESTART_MAX_S


def test_a_lower_cap_bounds_every_wait_and_a_long_life_resets_it() -> None:
    assert max(_waits(2.0, 10)) == 2.0
    assert next_backoff(2.0, lived_s=31.0, cap_s=2.0) == RESTART_MIN_S


def test_the_supervisor_waits_by_its_spec_s_cap(tmp_path: Path) -> None:
    spec = PlaneSpec(hub_id="cafe0001", repo=str(tmp_path), metrics_dir="", executors=(),
                     restart_max_s=1.5)  # fmt: skip
    supervisor = HubSupervisor(spec, mqtt_workers=0, http_workers=0)
    try:
        child = Child("llm", 0, started_at=100.0)
        for _ in range(6):  # six quick deaths
            supervisor._schedule_restart(child, now=child.started_at + 1.0)
        assert child.backoff_s == 1.5
        assert child.due_at == child.started_at + 1.0 + 1.5
    finally:
        shutil.rmtree(supervisor.run_dir, ignore_errors=True)


def test_restart_max_s_goes_from_the_settings_into_the_plane(tmp_path: Path) -> None:
    spec = plan(HubServeSettings(repo=tmp_path, restart_max_s=4.0))
    assert spec.restart_max_s == 4.0
    assert plan(HubServeSettings(repo=tmp_path)).restart_max_s == RESTART_MAX_S
