"""The fleet's devices and the rollouts persist in the registry, on SQLite and a real PostgreSQL.

A device and a rollout come back exactly as recorded; an upsert replaces a
device but never moves its ``first_seen`` later; a batch is all or nothing
and thousands of devices go in one call; two threads upserting overlapping
batches lose nothing (and do not deadlock); missing ids are typed errors and
malformed ids never reach the database; rollouts are listed newest first;
a registry made before these tables existed gains them when reopened.
"""

from __future__ import annotations

import random
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import model_cdn.registry
from model_cdn import (
    DeviceNotFoundError,
    InvalidNameError,
    RegistryError,
    RolloutNotFoundError,
)
from model_cdn.registry import (
    DeviceRecord,
    Registry,
    RolloutRecord,
    SqliteRegistry,
    open_registry,
)
from shared import SigningKey

from ._cdn import make_manifest_doc

KEY = SigningKey(bytes(range(32)))
T0 = 1764500000.123456  # epoch seconds with a fraction that must survive the round trip


def device(name: str, **changes: Any) -> DeviceRecord:
    record = DeviceRecord(
        device=name,
        labels={"site": "factory-a", "hw": "npu", "note": "ünïcode"},
        capabilities={"runtime": "onnxruntime", "provider": "CPUExecutionProvider"},
        models={"mnist": 2},
        first_seen=T0,
        last_seen=T0 + 5.5,
        telemetry={
            "type": "telemetry",
            "schema": 2,
            "device": name,
            "at": T0 + 5.5,
            "requests": 10,
            "p99_ms": 12.25,
            "p50_ms": None,
            "nested": {"list": [1, 2.5, "x"]},
        },
    )
    return replace(record, **changes)


def rollout(rollout_id: str, created_at: float = T0, **changes: Any) -> RolloutRecord:
    record = RolloutRecord(
        id=rollout_id,
        model="mnist",
        version=3,
        state="running",
        snapshot={
            "id": rollout_id,
            "waves": [0.05, 0.25, 1.0],
            "devices": {"sim-0001": {"status": "assigned", "wave": 0}},
            "target": {"site": "factory-a"},
            "reason": "wave 1 of 3",
        },
        created_at=created_at,
        updated_at=created_at + 1.25,
    )
    return replace(record, **changes)


def test_the_records_are_public() -> None:
    assert {"DeviceRecord", "RolloutRecord"} <= set(model_cdn.registry.__all__)


# -- devices -----------------------------------------------------------------


def test_a_device_comes_back_as_recorded(registry: Registry) -> None:
    assert registry.list_devices() == []
    record = device("cam-1")
    registry.upsert_devices([record])
    assert registry.get_device("cam-1") == record
    assert registry.list_devices() == [record]
    silent = device("cam-2", telemetry=None, labels={}, capabilities={}, models={})
    registry.upsert_devices(iter([silent]))  # any iterable will do
    assert registry.get_device("cam-2") == silent


def test_an_upsert_replaces_the_device_but_keeps_its_first_seen(registry: Registry) -> None:
    registry.upsert_devices([device("cam-1")])
    later = device(
        "cam-1",
        labels={"site": "factory-b"},
        capabilities={"runtime": "tflite"},
        models={"mnist": 3, "kws": 1},
        first_seen=T0 + 100,  # a caller that forgot: the stored, earlier one stays
        last_seen=T0 + 100,
        telemetry=None,
    )
    registry.upsert_devices([later])
    assert registry.get_device("cam-1") == replace(later, first_seen=T0)
    earlier = replace(later, first_seen=T0 - 50)  # an earlier sighting does move it back
    registry.upsert_devices([earlier])
    assert registry.get_device("cam-1") == earlier
    assert [d.device for d in registry.list_devices()] == ["cam-1"]


def test_the_same_device_twice_in_one_batch_ends_as_the_later_record(
    registry: Registry,
) -> None:
    first = device("cam-1", first_seen=T0, last_seen=T0 + 1, models={"mnist": 2})
    second = device("cam-1", first_seen=T0 + 1, last_seen=T0 + 2, models={"mnist": 3})
    registry.upsert_devices([first, device("cam-0"), second])
    assert registry.get_device("cam-1") == replace(second, first_seen=T0)
    assert [d.device for d in registry.list_devices()] == ["cam-0", "cam-1"]


def test_a_batch_of_two_thousand_devices_is_one_call(registry: Registry) -> None:
    names = [f"sim-{i:04d}" for i in range(2000)]
    batch = [device(n, models={"mnist": 1 + i % 3}) for i, n in enumerate(names)]
    random.Random(4).shuffle(batch)
    registry.upsert_devices(batch)
    stored = registry.list_devices()
    assert [d.device for d in stored] == names  # sorted by id
    assert stored[7] == device("sim-0007", models={"mnist": 2})
    # the next heartbeat flush of the same fleet replaces, never duplicates
    registry.upsert_devices([replace(d, last_seen=T0 + 60, first_seen=T0 + 60) for d in batch])
    again = registry.list_devices()
    assert len(again) == 2000
    assert {(d.first_seen, d.last_seen) for d in again} == {(T0, T0 + 60)}


def test_an_empty_batch_writes_nothing(registry: Registry) -> None:
    registry.upsert_devices([])
    assert registry.list_devices() == []


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (device("../etc"), InvalidNameError),
        (device("a/b"), InvalidNameError),
        (device("cam-9", models={"../m": 1}), InvalidNameError),
        (device("cam-9", models={"mnist": 0}), InvalidNameError),
        (device("cam-9", labels={"site": 7}), RegistryError),
        (device("cam-9", capabilities=["runtime"]), RegistryError),
        (device("cam-9", first_seen=float("nan")), RegistryError),
        (device("cam-9", last_seen=True), RegistryError),
        (device("cam-9", telemetry={"x": {1, 2}}), RegistryError),  # not JSON
        (device("cam-9", telemetry={"x": float("inf")}), RegistryError),
        ("cam-9", RegistryError),  # not a DeviceRecord
    ],
)
def test_a_batch_with_one_bad_record_writes_nothing(
    registry: Registry, bad: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        registry.upsert_devices([device("cam-1"), bad, device("cam-2")])
    assert registry.list_devices() == []


def test_one_record_instead_of_a_batch_is_refused(registry: Registry) -> None:
    with pytest.raises(RegistryError, match="iterable"):
        registry.upsert_devices(device("cam-1"))  # type: ignore[arg-type]


def test_a_missing_device_is_device_not_found(registry: Registry) -> None:
    registry.upsert_devices([device("cam-1")])
    with pytest.raises(DeviceNotFoundError, match="cam-2"):
        registry.get_device("cam-2")


@pytest.mark.parametrize("name", ["../etc", "a/b", "", "..", "x" * 200, "-lead", "cam 1"])
def test_path_like_device_ids_never_reach_the_database(registry: Registry, name: str) -> None:
    with pytest.raises(InvalidNameError):
        registry.get_device(name)


def test_two_threads_upserting_overlapping_batches_lose_nothing(registry: Registry) -> None:
    """Both threads write the shared devices, in opposite orders, and their own ones."""
    threads, rounds, shared = 2, 15, 150
    shared_names = [f"dev-{i:04d}" for i in range(shared)]
    barrier = threading.Barrier(threads)

    def flush(thread: int) -> None:
        barrier.wait()
        for r in range(rounds):
            seen = T0 + 10 * r + thread
            mine = [device(f"t{thread}-{r:02d}-{i:02d}", first_seen=seen) for i in range(20)]
            names = shared_names if thread == 0 else shared_names[::-1]
            common = [device(n, first_seen=seen, last_seen=seen) for n in names]
            registry.upsert_devices(common + mine)

    with ThreadPoolExecutor(threads) as pool:
        for result in [pool.submit(flush, t) for t in range(threads)]:
            result.result()
    stored = {d.device: d for d in registry.list_devices()}
    own = {
        f"t{t}-{r:02d}-{i:02d}" for t in range(threads) for r in range(rounds) for i in range(20)
    }
    assert set(stored) == set(shared_names) | own
    assert {stored[n].first_seen for n in shared_names} == {T0}  # the earliest of all writes


# -- rollouts ----------------------------------------------------------------


def test_a_rollout_comes_back_as_recorded_and_is_replaced_by_id(registry: Registry) -> None:
    assert registry.list_rollouts() == []
    record = rollout("ro-1a2b3c4d5e6f")
    registry.put_rollout(record)
    assert registry.get_rollout("ro-1a2b3c4d5e6f") == record
    halted = replace(
        record,
        state="halted",
        snapshot={**record.snapshot, "reason": "failure rate 0.05 > 0.02"},
        updated_at=T0 + 99.5,
    )
    registry.put_rollout(halted)
    assert registry.get_rollout("ro-1a2b3c4d5e6f") == halted
    assert registry.list_rollouts() == [halted]


def test_rollouts_are_listed_newest_first(registry: Registry) -> None:
    middle = rollout("ro-00000000000b", created_at=T0 + 10)
    oldest = rollout("ro-00000000000c", created_at=T0, model="kws", version=1)
    newest = rollout("ro-00000000000a", created_at=T0 + 20, state="completed")
    for record in (middle, oldest, newest):
        registry.put_rollout(record)
    assert registry.list_rollouts() == [newest, middle, oldest]
    # an update does not reorder: the order is by creation
    registry.put_rollout(replace(oldest, state="paused", updated_at=T0 + 30))
    assert [r.id for r in registry.list_rollouts()] == [newest.id, middle.id, oldest.id]


def test_a_missing_rollout_is_rollout_not_found(registry: Registry) -> None:
    registry.put_rollout(rollout("ro-1a2b3c4d5e6f"))
    with pytest.raises(RolloutNotFoundError, match="ro-000000000000"):
        registry.get_rollout("ro-000000000000")


@pytest.mark.parametrize(
    "rollout_id",
    [
        "",
        "ro-1",
        "ro-1A2B3C4D5E6F",
        "ro-1a2b3c4d5e6f0",
        "xx-1a2b3c4d5e6f",
        "../etc",
        "ro-1a2b3c4d5e6g",
    ],
)
def test_malformed_rollout_ids_never_reach_the_database(
    registry: Registry, rollout_id: str
) -> None:
    with pytest.raises(InvalidNameError):
        registry.get_rollout(rollout_id)
    with pytest.raises(InvalidNameError):
        registry.put_rollout(rollout(rollout_id))
    assert registry.list_rollouts() == []


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"model": "../m"}, InvalidNameError),
        ({"version": 0}, InvalidNameError),
        ({"state": ""}, RegistryError),
        ({"state": "Running; DROP"}, RegistryError),
        ({"snapshot": ["not", "an", "object"]}, RegistryError),
        ({"snapshot": {"x": object()}}, RegistryError),
        ({"created_at": float("-inf")}, RegistryError),
    ],
)
def test_a_malformed_rollout_is_refused(
    registry: Registry, changes: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        registry.put_rollout(rollout("ro-1a2b3c4d5e6f", **changes))
    assert registry.list_rollouts() == []


# -- schema and failures -----------------------------------------------------


def _drop_fleet_tables(url: str) -> None:
    """Make the registry look like one created before the fleet tables existed."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            conn.execute("DROP TABLE devices")
            conn.execute("DROP TABLE rollouts")
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE devices")
        conn.execute("DROP TABLE rollouts")


def test_a_registry_from_before_the_fleet_tables_gains_them(registry_url: str) -> None:
    old = open_registry(registry_url)
    old.add_version(make_manifest_doc(KEY, "mnist", 1))
    old.close()
    _drop_fleet_tables(registry_url)
    reopened = open_registry(registry_url)
    try:
        assert reopened.get_version("mnist").version == 1  # what was there stays
        assert reopened.list_devices() == []
        reopened.upsert_devices([device("cam-1")])
        reopened.put_rollout(rollout("ro-1a2b3c4d5e6f"))
        assert reopened.get_device("cam-1") == device("cam-1")
        assert reopened.get_rollout("ro-1a2b3c4d5e6f") == rollout("ro-1a2b3c4d5e6f")
    finally:
        reopened.close()


def test_sqlite_devices_and_rollouts_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    first = SqliteRegistry(path)
    first.upsert_devices([device("cam-1")])
    first.put_rollout(rollout("ro-1a2b3c4d5e6f"))
    first.close()
    with pytest.raises(RegistryError, match="closed"):
        first.upsert_devices([device("cam-2")])
    second = SqliteRegistry(path, create=False)
    try:
        assert second.list_devices() == [device("cam-1")]
        assert second.list_rollouts() == [rollout("ro-1a2b3c4d5e6f")]
    finally:
        second.close()


def test_a_database_failure_is_a_registry_error(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    reg = SqliteRegistry(path)
    try:
        with sqlite3.connect(path) as conn:  # someone else breaks the table under us
            conn.execute("DROP TABLE devices")
        with pytest.raises(RegistryError, match="cannot record 1 devices"):
            reg.upsert_devices([device("cam-1")])
        with pytest.raises(RegistryError, match="cannot list devices"):
            reg.list_devices()
    finally:
        reg.close()
