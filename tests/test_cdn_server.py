"""The CDN's HTTP API, served by real uvicorn on loopback and spoken to with httpx.

Listings, manifests and versions, the admin API (tokens, uploads, publishing and
deleting versions, content types), path traversal, and device assignments (stored,
served, published retained over MQTT). Tests taking ``cdn`` run twice, on a local
store and on one without files; blob downloads and ranges are in
``test_cdn_server_blobs``. Security tests are named after the attack they stage.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from model_cdn import AssignmentSender, CdnError, make_assignment
from shared import MqttSettings, Topics, digest, verify_assignment

from ._brokers import MosquittoProcess, free_port
from ._cdn import make_assignment_doc, make_manifest_doc, receive_retained
from ._cdn_server import ADMIN, AUTH, BLOB, BLOB_DIGEST, KEY, OTHER_KEY, Cdn, publish
from ._cdn_server import cdn_fixture as cdn_fixture
from ._cdn_server import make_cdn_fixture as make_cdn_fixture

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


def test_sending_an_assignment_to_nowhere_is_one_clear_error() -> None:
    settings = MqttSettings.from_url(f"mqtt://127.0.0.1:{free_port()}", connect_timeout_s=2.0)
    with pytest.raises(CdnError, match=r"cannot reach the MQTT broker at mqtt://127\.0\.0\.1:"):
        AssignmentSender.connect(settings, Topics(), ack_timeout_s=2.0)
