"""The CDN's HTTP API, served by real uvicorn on loopback and spoken to with httpx.

Blob tests run twice: on a local store (sent as a file by ``FileResponse``)
and on a store without files (streamed from ``open()``, like S3). The stores
fail the test if the server ever reads a whole blob. Security tests are named
after the attack they stage.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import CdnError, create_app
from model_cdn._assign import make_assignment, publish_assignment
from model_cdn.registry import Registry, SqliteRegistry
from model_cdn.store import BlobStore
from shared import MqttSettings, SigningKey, Topics, digest, verify_assignment

from ._brokers import MosquittoProcess, free_port
from ._cdn import (
    NoWholeReadLocalStore,
    StreamOnlyStore,
    make_assignment_doc,
    make_manifest_doc,
    receive_retained,
    serve_in_thread,
)

KEY = SigningKey(bytes(range(32)))
OTHER_KEY = SigningKey(bytes(range(1, 33)))
ADMIN = "admin-s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
BLOB = bytes(range(256)) * 40  # 10240 bytes
BLOB_DIGEST = digest(BLOB)
IMMUTABLE = "public, max-age=31536000, immutable"


@dataclass
class Cdn:
    url: str
    client: httpx.Client
    registry: Registry
    store: BlobStore
    root: Path


@pytest.fixture
def make_cdn(tmp_path: Path) -> Iterator[Callable[..., Cdn]]:
    """Starts CDN servers over a fresh SQLite registry; all stopped after the test."""
    with ExitStack() as stack:

        def make(store: str = "file", **options: Any) -> Cdn:
            root = tmp_path / f"cdn-{uuid.uuid4().hex[:8]}"
            registry = SqliteRegistry(root / "registry.db")
            stack.callback(registry.close)
            blobs: BlobStore = (
                NoWholeReadLocalStore(root / "blobs") if store == "file" else StreamOnlyStore()
            )
            options.setdefault("admin_token", ADMIN)
            app = create_app(registry=registry, store=blobs, **options)
            if app.state.publisher is not None:  # its own MQTT link (``mqtt=``)
                stack.callback(app.state.publisher.close)
            url = stack.enter_context(serve_in_thread(app))
            client = stack.enter_context(httpx.Client(base_url=url, timeout=30))
            return Cdn(url, client, registry, blobs, root)

        yield make


@pytest.fixture(params=["file", "stream"])
def cdn(request: pytest.FixtureRequest, make_cdn: Callable[..., Cdn]) -> Cdn:
    return make_cdn(request.param)


def publish(cdn: Cdn, version: int, blob: bytes = BLOB, name: str = "mnist") -> dict[str, Any]:
    assert cdn.client.put(f"/v1/blobs/{digest(blob)}", content=blob, headers=AUTH).status_code in (
        200,
        201,
    )
    doc = make_manifest_doc(KEY, name, version, blob)
    response = cdn.client.post(f"/v1/models/{name}/versions", json=doc, headers=AUTH)
    assert response.status_code == 201, response.text
    return doc


# -- reads ------------------------------------------------------------------


def test_models_versions_and_manifests_are_listed_and_served(cdn: Cdn) -> None:
    assert cdn.client.get("/healthz").json() == {"status": "ok"}
    assert cdn.client.get("/v1/models").json() == {"models": []}
    first = publish(cdn, 1)
    second = publish(cdn, 2, b"a second model")
    assert cdn.client.get("/v1/models").json() == {"models": ["mnist"]}
    versions = cdn.client.get("/v1/models/mnist/versions").json()["versions"]
    assert [(v["version"], v["blob_digest"]) for v in versions] == [
        (1, BLOB_DIGEST),
        (2, digest(b"a second model")),
    ]
    assert all(v["published_at"].endswith("Z") for v in versions)
    latest = cdn.client.get("/v1/models/mnist/manifest")
    assert latest.status_code == 200
    assert latest.headers["content-type"] == "application/json"
    assert latest.json() == second
    assert cdn.client.get("/v1/models/mnist/versions/1/manifest").json() == first


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/nope/manifest",
        "/v1/models/nope/versions",
        "/v1/models/mnist/versions/9/manifest",
        "/v1/devices/cam-1/assignments/mnist",
        "/v1/nothing-here",
    ],
)
def test_unknown_things_are_404_with_a_json_error(cdn: Cdn, path: str) -> None:
    publish(cdn, 1)
    response = cdn.client.get(path)
    assert response.status_code == 404
    assert response.json()["error"]


def test_a_bad_version_number_is_400(cdn: Cdn) -> None:
    for bad in ("0", "-1", "x", "1.5", "9" * 30):
        response = cdn.client.get(f"/v1/models/mnist/versions/{bad}/manifest")
        assert response.status_code == 400, bad
        assert "version" in response.json()["error"]


# -- blobs ------------------------------------------------------------------


def test_a_blob_is_served_whole_with_cache_headers(cdn: Cdn) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}")
    assert response.status_code == 200
    assert response.content == BLOB
    assert response.headers["etag"] == f'"{BLOB_DIGEST}"'
    assert response.headers["cache-control"] == IMMUTABLE
    assert response.headers["accept-ranges"] == "bytes"
    assert response.headers["content-length"] == str(len(BLOB))
    assert response.headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-5119", 0, 5120),  # first half
        ("bytes=5120-", 5120, 10240),  # second half
        ("bytes=-100", 10140, 10240),  # suffix
        ("bytes=10000-99999", 10000, 10240),  # last byte past the end: clamped
        ("bytes=-99999", 0, 10240),  # suffix longer than the blob: all of it
        ("bytes=7-7", 7, 8),
        ("bytes=0-" + "9" * 30, 0, 10240),  # a last byte of any length: clamped
        ("bytes=-" + "9" * 30, 0, 10240),  # a suffix of any length: all of it
    ],
)
def test_a_range_gets_206_and_exactly_those_bytes(
    cdn: Cdn, header: str, start: int, end: int
) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}", headers={"Range": header})
    assert response.status_code == 206
    assert response.content == BLOB[start:end]
    assert response.headers["content-range"] == f"bytes {start}-{end - 1}/{len(BLOB)}"
    assert response.headers["content-length"] == str(end - start)
    assert response.headers["etag"] == f'"{BLOB_DIGEST}"'


@pytest.mark.parametrize(
    "header",
    [
        "bytes=10240-",
        "bytes=99999-100000",
        "bytes=-0",
        "bytes=" + "9" * 30 + "-",
        "bytes=1" + "0" * 19 + "-",
    ],
)
def test_an_unsatisfiable_range_is_416(cdn: Cdn, header: str) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}", headers={"Range": header})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{len(BLOB)}"
    assert "not satisfiable" in response.json()["error"]


@pytest.mark.parametrize(
    "header", ["items=0-5", "bytes=0-5,10-20", "bytes=9-3", "bytes=x-", "bytes=-", "bytes"]
)
def test_a_range_we_do_not_honour_gets_the_whole_blob(cdn: Cdn, header: str) -> None:
    publish(cdn, 1)
    response = cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}", headers={"Range": header})
    assert response.status_code == 200
    assert response.content == BLOB


def test_if_range_with_another_etag_gets_the_whole_blob(cdn: Cdn) -> None:
    publish(cdn, 1)
    url = f"/v1/blobs/{BLOB_DIGEST}"
    for stale in (f'"{digest(b"old")}"', f'W/"{BLOB_DIGEST}"', "Mon, 30 Nov 2026 09:00:00 GMT"):
        response = cdn.client.get(url, headers={"Range": "bytes=0-9", "If-Range": stale})
        assert response.status_code == 200, stale
        assert response.content == BLOB
    resumed = cdn.client.get(url, headers={"Range": "bytes=10-", "If-Range": f'"{BLOB_DIGEST}"'})
    assert resumed.status_code == 206
    assert resumed.content == BLOB[10:]


def test_if_none_match_with_the_digest_is_304(cdn: Cdn) -> None:
    publish(cdn, 1)
    url = f"/v1/blobs/{BLOB_DIGEST}"
    for tags in (f'"{BLOB_DIGEST}"', f'"x", W/"{BLOB_DIGEST}"', "*"):
        response = cdn.client.get(url, headers={"If-None-Match": tags})
        assert response.status_code == 304, tags
        assert response.content == b""
        assert response.headers["etag"] == f'"{BLOB_DIGEST}"'
    other = cdn.client.get(url, headers={"If-None-Match": f'"{digest(b"old")}"'})
    assert other.status_code == 200
    assert other.content == BLOB


def test_head_gives_the_headers_without_the_body(cdn: Cdn) -> None:
    publish(cdn, 1)
    url = f"/v1/blobs/{BLOB_DIGEST}"
    whole = cdn.client.head(url)
    assert whole.status_code == 200
    assert whole.content == b""
    assert whole.headers["content-length"] == str(len(BLOB))
    assert whole.headers["etag"] == f'"{BLOB_DIGEST}"'
    part = cdn.client.head(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206
    assert part.headers["content-length"] == "100"
    assert part.headers["content-range"] == f"bytes 100-199/{len(BLOB)}"
    assert cdn.client.head(f"/v1/blobs/{digest(b'absent')}").status_code == 404


def test_a_missing_blob_is_404(cdn: Cdn) -> None:
    response = cdn.client.get(f"/v1/blobs/{digest(b'absent')}")
    assert response.status_code == 404
    assert "no blob" in response.json()["error"]


def test_a_5_mb_blob_is_sent_without_reading_it_whole(cdn: Cdn) -> None:
    """The stores fail on ``get``; the local one also on ``open`` (its files go out by
    path through FileResponse), the other records every read (64 KiB chunks at most)."""
    big = bytes(range(251)) * (5 * 1024 * 1024 // 251 + 1)
    publish(cdn, 1, big)
    url = f"/v1/blobs/{digest(big)}"
    with cdn.client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-length"] == str(len(big))
        assert b"".join(response.iter_bytes()) == big
    tail = cdn.client.get(url, headers={"Range": f"bytes={len(big) - 3_000_000}-"})
    assert tail.status_code == 206
    assert tail.content == big[-3_000_000:]
    # a resumed download across several 1 MiB file reads, starting and ending mid-read
    etag = f'"{digest(big)}"'
    middle = cdn.client.get(url, headers={"Range": "bytes=1000000-3200000", "If-Range": etag})
    assert middle.status_code == 206
    assert middle.headers["content-range"] == f"bytes 1000000-3200000/{len(big)}"
    assert middle.content == big[1_000_000:3_200_001]
    if isinstance(cdn.store, StreamOnlyStore):
        assert cdn.store.reads
        assert max(cdn.store.reads) <= 64 * 1024
        assert -1 not in cdn.store.reads  # never "read everything"


# -- admin ------------------------------------------------------------------


def test_admin_routes_need_the_admin_token(cdn: Cdn) -> None:
    url = f"/v1/blobs/{BLOB_DIGEST}"
    missing = cdn.client.put(url, content=BLOB)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    for malformed in ("Basic YWRtaW46eA==", "Bearer", f"Bearer {ADMIN} extra", ADMIN):
        response = cdn.client.put(url, content=BLOB, headers={"Authorization": malformed})
        assert response.status_code == 401, malformed
        assert "Bearer" in response.json()["error"]
    wrong = cdn.client.put(url, content=BLOB, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert wrong.json() == {"error": "wrong admin token"}
    assert not cdn.store.exists(BLOB_DIGEST)
    first = cdn.client.put(url, content=BLOB, headers=AUTH)
    assert first.status_code == 201
    assert first.json() == {"digest": BLOB_DIGEST, "size": len(BLOB)}
    assert cdn.client.put(url, content=BLOB, headers=AUTH).status_code == 200  # idempotent
    for method, path in (
        ("POST", "/v1/models/mnist/versions"),
        ("DELETE", "/v1/models/mnist/versions/1"),
        ("PUT", "/v1/devices/cam-1/assignments/mnist"),
    ):
        assert cdn.client.request(method, path, json={}).status_code == 401, path
        assert (
            cdn.client.request(
                method, path, json={}, headers={"Authorization": "Bearer nope"}
            ).status_code
            == 403
        ), path


def test_without_an_admin_token_the_admin_api_is_off(make_cdn: Callable[..., Cdn]) -> None:
    cdn = make_cdn(admin_token=None)
    response = cdn.client.put(f"/v1/blobs/{BLOB_DIGEST}", content=BLOB, headers=AUTH)
    assert response.status_code == 403
    assert "admin API is off" in response.json()["error"]


def test_a_read_token_guards_reads_but_not_healthz(make_cdn: Callable[..., Cdn]) -> None:
    cdn = make_cdn(read_token="reader")
    publish(cdn, 1)
    assert cdn.client.get("/healthz").status_code == 200
    assert cdn.client.get("/v1/models").status_code == 401
    assert cdn.client.get(f"/v1/blobs/{BLOB_DIGEST}").status_code == 401
    wrong = cdn.client.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    for token in ("reader", ADMIN):
        ok = cdn.client.get("/v1/models", headers={"Authorization": f"Bearer {token}"})
        assert ok.json() == {"models": ["mnist"]}


def test_a_blob_whose_bytes_do_not_match_its_digest_is_refused(cdn: Cdn) -> None:
    response = cdn.client.put(f"/v1/blobs/{BLOB_DIGEST}", content=b"other bytes", headers=AUTH)
    assert response.status_code == 400
    assert digest(b"other bytes") in response.json()["error"]
    assert not cdn.store.exists(BLOB_DIGEST)
    assert not cdn.store.exists(digest(b"other bytes"))


def test_an_upload_over_the_limit_is_413(make_cdn: Callable[..., Cdn]) -> None:
    cdn = make_cdn(max_blob_bytes=1000)
    big = b"x" * 1001
    response = cdn.client.put(f"/v1/blobs/{digest(big)}", content=big, headers=AUTH)
    assert response.status_code == 413
    chunked = cdn.client.put(
        f"/v1/blobs/{digest(big)}", content=iter([big[:600], big[600:]]), headers=AUTH
    )
    assert chunked.status_code == 413  # no Content-Length to trust: counted as it arrives
    assert not cdn.store.exists(digest(big))


def test_a_version_not_above_the_latest_is_409(cdn: Cdn) -> None:
    publish(cdn, 2)
    for version in (2, 1):
        doc = make_manifest_doc(KEY, "mnist", version, BLOB, note="again")
        response = cdn.client.post("/v1/models/mnist/versions", json=doc, headers=AUTH)
        assert response.status_code == 409
        assert "not above the latest version 2" in response.json()["error"]
    assert cdn.registry.get_version("mnist").manifest["signed"].get("note") is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: make_manifest_doc(KEY, "other", 1, BLOB), "for model 'other'"),
        (lambda d: make_manifest_doc(KEY, "mnist", 1, b"never uploaded"), "not in the store"),
        (lambda d: make_manifest_doc(OTHER_KEY, "mnist", 1, BLOB), "no trusted key"),
        (lambda d: {**d, "signed": {**d["signed"], "version": 5}}, "tampered"),
        (lambda d: {"signed": d["signed"]}, "not signed"),
        (lambda d: [d], "object"),
    ],
)
def test_manifests_that_are_not_acceptable_are_400(
    make_cdn: Callable[..., Cdn], mutate: Callable[[dict[str, Any]], Any], message: str
) -> None:
    cdn = make_cdn(trusted_keys=[KEY.public_key])
    cdn.client.put(f"/v1/blobs/{BLOB_DIGEST}", content=BLOB, headers=AUTH)
    bad = mutate(make_manifest_doc(KEY, "mnist", 1, BLOB))
    response = cdn.client.post("/v1/models/mnist/versions", json=bad, headers=AUTH)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert cdn.client.get("/v1/models").json() == {"models": []}


def test_a_body_that_is_not_json_is_400(cdn: Cdn) -> None:
    for body in (b"{not json", b'{"signed": NaN}', "ü".encode("latin-1")):
        response = cdn.client.post("/v1/models/mnist/versions", content=body, headers=AUTH)
        assert response.status_code == 400, body
        assert response.json()["error"]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_cross_site_simple_body_is_refused_with_415_before_it_is_read(
    cdn: Cdn, content_type: str
) -> None:
    # Bodies a web page may post to another site without a CORS preflight.
    headers = {**AUTH, "Content-Type": content_type}
    doc = json.dumps(make_manifest_doc(KEY, "mnist", 1, BLOB)).encode()
    r = cdn.client.post("/v1/models/mnist/versions", content=doc, headers=headers)
    assert r.status_code == 415 and "Content-Type" in r.json()["error"], r.text
    r = cdn.client.put(f"/v1/blobs/{BLOB_DIGEST}", content=BLOB, headers=headers)
    assert r.status_code == 415, r.text
    assignment = json.dumps(make_assignment_doc(KEY, "cam-1", "mnist", 1)).encode()
    r = cdn.client.put("/v1/devices/cam-1/assignments/mnist", content=assignment, headers=headers)
    assert r.status_code == 415, r.text
    assert cdn.client.get("/v1/models").json() == {"models": []}
    assert cdn.client.head(f"/v1/blobs/{BLOB_DIGEST}").status_code == 404
    publish(cdn, 1)  # the same documents with their own types are taken


def test_a_blob_sent_as_json_or_a_document_as_bytes_is_415(cdn: Cdn) -> None:
    r = cdn.client.put(
        f"/v1/blobs/{BLOB_DIGEST}",
        content=BLOB,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert r.status_code == 415, r.text
    r = cdn.client.post(
        "/v1/models/mnist/versions",
        content=json.dumps(make_manifest_doc(KEY, "mnist", 1, BLOB)).encode(),
        headers={**AUTH, "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 415, r.text


def test_a_deleted_version_is_gone_and_its_number_spent(cdn: Cdn) -> None:
    publish(cdn, 1)
    publish(cdn, 2)
    response = cdn.client.delete("/v1/models/mnist/versions/2", headers=AUTH)
    assert response.json() == {"deleted": {"name": "mnist", "version": 2}}
    assert cdn.client.get("/v1/models/mnist/versions/2/manifest").status_code == 404
    assert cdn.client.get("/v1/models/mnist/manifest").json()["signed"]["version"] == 1
    assert cdn.client.delete("/v1/models/mnist/versions/2", headers=AUTH).status_code == 404
    again = make_manifest_doc(KEY, "mnist", 2, BLOB)
    assert cdn.client.post("/v1/models/mnist/versions", json=again, headers=AUTH).status_code == 409


# -- path traversal ---------------------------------------------------------


def raw_get(url: str, path: str) -> tuple[int, bytes]:
    """GET ``path`` byte for byte (httpx would normalise the dot segments away)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/blobs/../../secret.txt",
        "/v1/blobs/..%2F..%2F..%2Fsecret.txt",
        "/v1/blobs/%2e%2e%2f%2e%2e%2f%2e%2e%2fsecret.txt",
        "/v1/blobs/%2e%2e",
        "/v1/blobs/sha256:..%2f..%2f..%2fsecret.txt",
        "/v1/blobs/sha256%3A" + "0" * 64 + "%2F..%2F..%2F..%2Fsecret.txt",
        "/v1/blobs/sha256:" + "a" * 63,
        "/v1/blobs/sha512:" + "a" * 64,
        "/v1/models/..%2F..%2Fsecret.txt/manifest",
        "/v1/models/%2e%2e/versions",
        "/v1/models/mnist/versions/..%2F1/manifest",
        "/v1/devices/..%2F..%2Fsecret.txt/assignments/mnist",
        "/v1/devices/cam-1/assignments/%2e%2e",
    ],
)
def test_path_traversal_never_reads_a_file_outside_the_store(cdn: Cdn, path: str) -> None:
    publish(cdn, 1)
    (cdn.root / "secret.txt").write_text("TOP-SECRET")
    (cdn.root.parent / "secret.txt").write_text("TOP-SECRET")
    status, body = raw_get(cdn.url, path)
    assert status in (400, 404), (path, status)
    assert b"TOP-SECRET" not in body
    assert json.loads(body)["error"]


def test_an_upper_case_digest_is_400_not_the_blob(cdn: Cdn) -> None:
    publish(cdn, 1)
    upper = "sha256:" + BLOB_DIGEST.removeprefix("sha256:").upper()
    response = cdn.client.get(f"/v1/blobs/{upper}")
    assert response.status_code == 400
    assert "sha256:<64 hex>" in response.json()["error"]
    assert cdn.client.put(f"/v1/blobs/{upper}", content=BLOB, headers=AUTH).status_code == 400


# -- assignments ------------------------------------------------------------


def test_an_assignment_is_stored_and_served_to_polling_devices(cdn: Cdn) -> None:
    publish(cdn, 1)
    doc = make_assignment_doc(KEY, "cam-1", "mnist", 1)
    path = "/v1/devices/cam-1/assignments/mnist"
    response = cdn.client.put(path, json=doc, headers=AUTH)
    assert response.json() == {
        "device": "cam-1",
        "model": "mnist",
        "version": 1,
        "published": False,
    }
    served = cdn.client.get(path)
    assert served.json() == doc
    assert served.headers["cache-control"] == "no-cache"
    newer = make_assignment_doc(KEY, "cam-1", "mnist", 1, rollback=True)
    cdn.client.put(path, json=newer, headers=AUTH)
    assert cdn.client.get(path).json() == newer


@pytest.mark.parametrize(
    ("path", "doc", "status", "message"),
    [
        (
            "/v1/devices/cam-2/assignments/mnist",
            make_assignment_doc(KEY, "cam-1", "mnist", 1),
            400,
            "not cam-2/mnist",
        ),
        (
            "/v1/devices/cam-1/assignments/mnist",
            make_assignment_doc(KEY, "cam-1", "mnist", 9),
            404,
            "no version mnist@9",
        ),
        (
            "/v1/devices/cam-1/assignments/mnist",
            make_assignment_doc(OTHER_KEY, "cam-1", "mnist", 1),
            400,
            "no trusted key",
        ),
    ],
)
def test_assignments_that_cannot_be_right_are_refused(
    make_cdn: Callable[..., Cdn], path: str, doc: dict[str, Any], status: int, message: str
) -> None:
    cdn = make_cdn(trusted_keys=[KEY.public_key])
    publish(cdn, 1)
    response = cdn.client.put(path, json=doc, headers=AUTH)
    assert response.status_code == status
    assert message in response.json()["error"]
    assert cdn.registry.get_assignment("cam-1", "mnist") is None


def test_an_assignment_put_is_published_retained_to_the_device(
    make_cdn: Callable[..., Cdn], mosquitto: MosquittoProcess
) -> None:
    topics = Topics(f"test-{uuid.uuid4().hex[:8]}")
    cdn = make_cdn(
        mqtt=MqttSettings.from_url(mosquitto.url), topics=topics, trusted_keys=[KEY.public_key]
    )
    publish(cdn, 1)
    doc = make_assignment_doc(KEY, "cam-7", "mnist", 1)
    response = cdn.client.put("/v1/devices/cam-7/assignments/mnist", json=doc, headers=AUTH)
    assert response.status_code == 200
    assert response.json()["published"] is True
    # Subscribed only now: the broker hands over the retained copy.
    message = receive_retained(mosquitto.url, topics.assign("cam-7"))
    assert message.retain
    assert json.loads(message.payload) == doc
    assert verify_assignment(message.payload, [KEY.public_key]).device == "cam-7"


def test_an_unreachable_broker_is_502_but_the_assignment_is_kept(
    make_cdn: Callable[..., Cdn],
) -> None:
    dead = MqttSettings.from_url(f"mqtt://127.0.0.1:{free_port()}", connect_timeout_s=2.0)
    cdn = make_cdn(mqtt=dead)
    publish(cdn, 1)
    doc = make_assignment_doc(KEY, "cam-1", "mnist", 1)
    response = cdn.client.put("/v1/devices/cam-1/assignments/mnist", json=doc, headers=AUTH)
    assert response.status_code == 502
    assert "stored, but not published" in response.json()["error"]
    assert cdn.client.get("/v1/devices/cam-1/assignments/mnist").json() == doc


def test_make_assignment_signs_a_document_devices_accept() -> None:
    doc = make_assignment(
        KEY, device="cam-1", model="mnist", version=3, rollback=True, rollout="r-1"
    )
    got = verify_assignment(doc, [KEY.public_key])
    assert (got.device, got.model, got.version, got.rollback, got.rollout) == (
        "cam-1",
        "mnist",
        3,
        True,
        "r-1",
    )
    with pytest.raises(CdnError, match="ttl_days"):
        make_assignment(KEY, device="cam-1", model="mnist", version=3, ttl_days=0)


def test_publish_assignment_to_nowhere_is_one_clear_error() -> None:
    settings = MqttSettings.from_url(f"mqtt://127.0.0.1:{free_port()}", connect_timeout_s=2.0)
    doc = make_assignment(KEY, device="cam-1", model="mnist", version=1)
    with (
        pytest.warns(DeprecationWarning, match="AssignmentPublisher"),
        pytest.raises(CdnError, match=r"cannot reach the MQTT broker at mqtt://127\.0\.0\.1:"),
    ):
        publish_assignment(settings, Topics(), "cam-1", doc, timeout_s=2.0)


@pytest.mark.parametrize(
    "header",
    [
        "bytes=0-49",
        "bytes=50-",
        "bytes=-10",
        "bytes=-500",
        "bytes=99-99",
        "bytes= 3 - 7",
        "BYTES=1-2",
    ],
)
def test_our_range_plan_matches_what_file_response_sends(header: str) -> None:
    """Local blobs go out through Starlette's FileResponse, which parses Range itself:
    wherever our plan honours a range, its parser must pick the very same bytes
    (this guards against a Starlette upgrade changing the rules under us)."""
    from starlette.responses import FileResponse

    from model_cdn.http._ranges import plan_range

    planned = plan_range(header, None, '"etag"', 100)
    assert planned is not None
    assert FileResponse._parse_range_header(header, 100) == [(planned.start, planned.end)]
