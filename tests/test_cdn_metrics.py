"""The CDN's ``/metrics``: downloads and bytes per model and blob, on real uvicorn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from model_cdn import create_app
from model_cdn.registry import SqliteRegistry
from shared import SigningKey, digest
from shared.server.store import BlobStore

from ._cdn import NoWholeReadLocalStore, StreamOnlyStore, make_manifest_doc, serve_in_thread

KEY = SigningKey(bytes(range(32)))
ADMIN = "admin-s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
BLOB = bytes(range(256)) * 40  # 10240 bytes
BLOB_DIGEST = digest(BLOB)


@pytest.fixture(params=["file", "stream"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    with ExitStack() as stack:
        registry = SqliteRegistry(tmp_path / "registry.db")
        stack.callback(registry.close)
        store: BlobStore = (
            NoWholeReadLocalStore(tmp_path / "blobs")
            if request.param == "file"
            else StreamOnlyStore()
        )
        app = create_app(registry=registry, store=store, admin_token=ADMIN)
        url = stack.enter_context(serve_in_thread(app))
        c = stack.enter_context(httpx.Client(base_url=url, timeout=30))
        assert c.put(f"/v1/blobs/{BLOB_DIGEST}", content=BLOB, headers=AUTH).status_code in (
            200,
            201,
        )
        for version in (1, 2):
            doc = make_manifest_doc(KEY, "mnist", version, BLOB)
            assert c.post("/v1/models/mnist/versions", json=doc, headers=AUTH).status_code == 201
        yield c


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_manifest_downloads_are_counted_per_model_and_version(client: httpx.Client) -> None:
    for _ in range(3):
        assert client.get("/v1/models/mnist/manifest").status_code == 200
    assert client.get("/v1/models/mnist/versions/1/manifest").status_code == 200
    total = "tandem_cdn_manifest_downloads_total"
    assert metric(client, total, model="mnist", version="2") == 3
    assert metric(client, total, model="mnist", version="1") == 1


def test_blob_downloads_and_bytes_count_full_and_range_requests(client: httpx.Client) -> None:
    url = f"/v1/blobs/{BLOB_DIGEST}"
    assert len(client.get(url).content) == len(BLOB)
    assert client.get(url, headers={"Range": "bytes=0-99"}).status_code == 206
    assert client.get(url, headers={"Range": "bytes=-40"}).status_code == 206
    assert client.head(url).status_code == 200  # not a download
    assert client.get(url, headers={"If-None-Match": f'"{BLOB_DIGEST}"'}).status_code == 304
    downloads = "tandem_cdn_blob_downloads_total"
    assert metric(client, downloads, digest=BLOB_DIGEST, kind="full") == 1
    assert metric(client, downloads, digest=BLOB_DIGEST, kind="range") == 2
    served = "tandem_cdn_blob_bytes_served_total"
    assert metric(client, served, digest=BLOB_DIGEST) == len(BLOB) + 100 + 40
    assert metric(client, "tandem_cdn_blob_not_modified_total", digest=BLOB_DIGEST) == 1


def test_requests_for_things_that_do_not_exist_create_no_series(client: httpx.Client) -> None:
    assert client.get("/v1/models/nope/manifest").status_code == 404
    assert client.get(f"/v1/blobs/{digest(b'absent')}").status_code == 404
    text = client.get("/metrics").text
    assert "nope" not in text and digest(b"absent") not in text


def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    apps = []
    for i in range(2):
        registry = SqliteRegistry(tmp_path / f"r{i}.db")
        apps.append(create_app(registry=registry, store=StreamOnlyStore(), admin_token=ADMIN))
        registry.close()
    first, second = (app.state.metrics for app in apps)
    first.manifest_served("mnist", 1)
    assert b'model="mnist"' in first.render()
    assert b'model="mnist"' not in second.render()
