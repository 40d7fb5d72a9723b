"""The console's devices API pages and filters the fleet on the server (issue 21, item 4).

Real parts: the CDN app on loopback (uvicorn), a SQLite registry seeded with
thousands of device records, API keys. No browser: ``test_console_browser.py``
drives the page itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from model_cdn import LocalBlobStore, create_app, open_registry
from model_cdn.http._console_gates import cohorts
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key

from ._console_fleet import judged_with_an_outlier, seed_fleet

FLEET = 3000


class Fleet:
    def __init__(self, url: str, reader: str) -> None:
        self.url, self.headers = url, {"Authorization": f"Bearer {reader}"}

    def get(self, query: str) -> httpx.Response:
        return httpx.get(f"{self.url}/console/api/devices{query}", headers=self.headers, timeout=60)

    def ok(self, query: str) -> dict[str, Any]:
        r = self.get(query)
        assert r.status_code == 200, r.text
        return dict(r.json())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from ._cdn import serve_in_thread

    root = tmp_path_factory.mktemp("console-devices")
    registry = open_registry(root / "registry.db")
    seed_fleet(registry, FLEET, time.time())
    keys = root / "keys.json"
    reader, record = generate_api_key(["models:read"], name="reader")
    ApiKeyFile(keys).add(record)
    app = create_app(
        registry=registry,
        store=LocalBlobStore(root / "blobs"),
        admin_token=None,
        api_keys=ApiKeyGuard.from_file(keys),
    )
    try:
        with serve_in_thread(app) as url:
            yield Fleet(url, reader)
    finally:
        registry.close()


def test_a_page_of_the_fleet_not_all_of_it(fleet: Fleet) -> None:
    first = fleet.ok("")
    assert (first["total"], first["fleet"], first["offset"], first["limit"]) == (
        FLEET,
        FLEET,
        0,
        50,
    )
    assert [d["device"] for d in first["devices"]] == [f"cam-{i:05d}" for i in range(50)]
    later = fleet.ok("?offset=2990&limit=25")  # the last page is short, not an error
    assert [d["device"] for d in later["devices"]] == [f"cam-{i:05d}" for i in range(2990, 3000)]
    assert fleet.ok("?offset=5000")["devices"] == []
    big = fleet.ok("?limit=500&offset=500")
    assert len(big["devices"]) == 500 and big["devices"][0]["device"] == "cam-00500"


def test_filters_narrow_and_the_total_counts_what_matches(fleet: Fleet) -> None:
    def total(query: str) -> int:
        return int(fleet.ok(query)["total"])

    assert total("?label=site=factory-b") == FLEET // 3
    assert total("?label=site=factory-b&label=hw=npu") == FLEET // 6
    heard = FLEET - FLEET // 100
    assert total("?model=mnist-edge") == heard
    assert total("?model=mnist-edge&version=2") == sum(
        1 for i in range(FLEET) if i % 100 != 99 and i % 4 == 3
    )
    assert total("?status=never") == FLEET // 100
    assert total("?status=offline") == sum(1 for i in range(FLEET) if i % 10 == 9 and i % 100 != 99)
    assert total("?status=online") == heard - total("?status=offline")
    # text: every word somewhere in the id, a label k=v or a model@version, any case
    assert [d["device"] for d in fleet.ok("?q=CAM-01234")["devices"]] == ["cam-01234"]
    assert total("?q=factory-c%20mnist-edge@2") == sum(
        1 for i in range(FLEET) if i % 3 == 2 and i % 100 != 99 and i % 4 == 3
    )
    narrowed = fleet.ok("?label=site=factory-a&status=offline&limit=5")
    assert narrowed["fleet"] == FLEET and len(narrowed["devices"]) == 5
    assert all(
        d["labels"]["site"] == "factory-a" and not d["online"] and d["last_seen"] > 0
        for d in narrowed["devices"]
    )


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("?limit=0", "limit is a whole number from 1 to 500, got 0"),
        ("?limit=501", "limit is a whole number from 1 to 500"),
        ("?limit=ten", "limit is a whole number"),
        ("?limit=-1", "limit is a whole number"),
        ("?offset=1e3", "offset is a whole number"),
        ("?offset=99999999999", "offset is a whole number"),
        ("?version=2", "version needs model"),
        ("?model=mnist-edge&version=0", "version is a whole number from 1"),
        ("?model=../etc", "invalid model name"),
        ("?status=up", "status is one of online, offline, never"),
        ("?label=site", "a label selector is NAME=VALUE"),
        ("?q=" + "x" * 201, "q is at most 200 characters"),
        ("?limt=5", "unknown query parameter 'limt'"),
        ("?limit=5&limit=6", "query parameter 'limit' given 2 times"),
    ],
)
def test_bad_query_parameters_are_a_400_that_says_which(
    fleet: Fleet, query: str, says: str
) -> None:
    r = fleet.get(query)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error and "\n" not in error, error


def test_the_devices_api_needs_a_key(fleet: Fleet) -> None:
    assert httpx.get(f"{fleet.url}/console/api/devices?limit=1").status_code == 401


def test_the_gate_header_and_table_count_the_same_devices_with_an_outlier_excluded() -> None:
    """A real health judgement with one control device far from the others: excluded by
    the gate, the cohort summary says 3 devices, 2 counted, and names the outlier."""
    gates = judged_with_an_outlier()
    control = next(j["control"] for j in gates["judgements"] if j["metric"] == "agreement")
    assert control["excluded"] == ["ctl-2"], control
    summary = cohorts(gates)
    assert summary["control"] == {
        "devices": 3,
        "counted": [control["devices"], control["devices"]],
        "excluded": ["ctl-2"],
        "flagged": [],
    }
    assert control["devices"] == 2 == summary["control"]["devices"] - len(control["excluded"])
    assert summary["new"]["devices"] == 3 and summary["new"]["excluded"] == []
