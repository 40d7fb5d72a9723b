"""API keys on the CDN: scopes per route, the old tokens beside them, rate limits, revocation.

Real uvicorn on loopback, real httpx, a real key file; token buckets on a fake
clock. Security tests are named after the attack they stage.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import create_app
from model_cdn.registry import SqliteRegistry
from shared import digest
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key, parse_api_key
from shared.server.store import LocalBlobStore

from ._cdn import serve_in_thread
from ._cli import tandem_env

ADMIN = "admin-s3cret"
BLOB = b"model bytes" * 100
BLOB_URL = f"/v1/blobs/{digest(BLOB)}"


def tandem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = tandem_env()
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cdn:
    client: httpx.Client
    keys_file: Path
    clock: FakeClock

    def key(self, *scopes: str, rate: float = 100.0, burst: int = 100) -> str:
        text, key = generate_api_key(scopes, rate=rate, burst=burst)
        ApiKeyFile(self.keys_file).add(key)
        return text


@pytest.fixture
def make_cdn(tmp_path: Path) -> Iterator[Callable[..., Cdn]]:
    with ExitStack() as stack:

        def make(**options: Any) -> Cdn:
            root = tmp_path / f"cdn-{uuid.uuid4().hex[:8]}"
            registry = SqliteRegistry(root / "registry.db")
            stack.callback(registry.close)
            keys_file = root / "api-keys.json"
            ApiKeyFile(keys_file).add(generate_api_key(["models:read"])[1])
            clock = FakeClock()
            guard = ApiKeyGuard(ApiKeyFile(keys_file).keys, clock=clock)
            options.setdefault("admin_token", None)
            app = create_app(
                registry=registry, store=LocalBlobStore(root / "blobs"), api_keys=guard, **options
            )
            url = stack.enter_context(serve_in_thread(app))
            client = stack.enter_context(httpx.Client(base_url=url, timeout=30))
            return Cdn(client, keys_file, clock)

        yield make


def test_healthz_stays_open_and_reads_need_a_key(make_cdn: Callable[..., Cdn]) -> None:
    cdn = make_cdn()
    assert cdn.client.get("/healthz").status_code == 200
    missing = cdn.client.get("/v1/models")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert cdn.client.get("/v1/models", headers=bearer(cdn.key("models:read"))).json() == {
        "models": []
    }
    assert cdn.client.get(BLOB_URL, headers=bearer(cdn.key("models:read"))).status_code == 404


@pytest.mark.parametrize("token", ["not-a-key", "tdm_12345678_short", "tdm_abcdef12_" + "A" * 43])
def test_malformed_or_unknown_keys_are_401(make_cdn: Callable[..., Cdn], token: str) -> None:
    cdn = make_cdn()
    for method, path in (("GET", "/v1/models"), ("PUT", BLOB_URL)):
        response = cdn.client.request(method, path, content=BLOB, headers=bearer(token))
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert set(response.json()) == {"error"}


def test_each_route_needs_its_own_scope(make_cdn: Callable[..., Cdn]) -> None:
    cdn = make_cdn()
    reader, publisher, roller = (
        cdn.key("models:read"),
        cdn.key("models:publish"),
        cdn.key("rollout:admin"),
    )
    assignment = "/v1/devices/cam-1/assignments/mnist"
    # A reader cannot publish, a publisher cannot assign, a roller cannot upload.
    for key, method, path in (
        (reader, "PUT", BLOB_URL),
        (reader, "PUT", assignment),
        (publisher, "PUT", assignment),
        (publisher, "GET", "/v1/models"),
        (roller, "PUT", BLOB_URL),
        (roller, "POST", "/v1/models/mnist/versions"),
        (roller, "DELETE", "/v1/models/mnist/versions/1"),
        (cdn.key("infer"), "GET", "/v1/models"),
    ):
        response = cdn.client.request(method, path, content=BLOB, headers=bearer(key))
        assert response.status_code == 403, (method, path, response.text)
        assert "lacks the scope" in response.json()["error"]
    created = cdn.client.put(BLOB_URL, content=BLOB, headers=bearer(publisher))
    assert created.status_code == 201, created.text
    deleted = cdn.client.delete("/v1/models/mnist/versions/1", headers=bearer(publisher))
    assert deleted.status_code == 404  # past the gate: no such version
    assigned = cdn.client.put(assignment, json={}, headers=bearer(roller))
    assert assigned.status_code == 400  # past the gate: not a signed assignment


def test_the_old_tokens_keep_working_beside_keys(make_cdn: Callable[..., Cdn]) -> None:
    cdn = make_cdn(admin_token=ADMIN, read_token="reader")
    assert cdn.client.put(BLOB_URL, content=BLOB, headers=bearer(ADMIN)).status_code == 201
    assert cdn.client.get(BLOB_URL, headers=bearer(ADMIN)).content == BLOB
    assert cdn.client.get(BLOB_URL, headers=bearer("reader")).content == BLOB
    assert cdn.client.get("/v1/models", headers=bearer(cdn.key("models:read"))).status_code == 200
    wrong = cdn.client.put(BLOB_URL, content=BLOB, headers=bearer("nope"))
    assert wrong.status_code == 403
    assert wrong.json() == {"error": "wrong admin token"}
    assert cdn.client.get("/v1/models", headers=bearer("nope")).status_code == 403
    assert cdn.client.put(BLOB_URL, content=BLOB, headers=bearer("reader")).status_code == 403


def test_without_keys_or_admin_token_the_admin_api_is_off(tmp_path: Path) -> None:
    registry = SqliteRegistry(tmp_path / "registry.db")
    try:
        app = create_app(registry=registry, store=LocalBlobStore(tmp_path), admin_token=None)
        with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
            assert client.get("/v1/models").status_code == 200  # reads stay open
            off = client.put(BLOB_URL, content=BLOB, headers=bearer("x"))
            assert off.status_code == 403
            assert "admin API is off" in off.json()["error"]
    finally:
        registry.close()


def test_flooding_with_one_key_gets_429_with_retry_after_then_recovers(
    make_cdn: Callable[..., Cdn],
) -> None:
    cdn = make_cdn()
    key = cdn.key("models:read", rate=1, burst=2)
    statuses = [cdn.client.get("/v1/models", headers=bearer(key)).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    limited = cdn.client.get("/v1/models", headers=bearer(key))
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert set(limited.json()) == {"error"}
    cdn.clock.now += 1.0
    assert cdn.client.get("/v1/models", headers=bearer(key)).status_code == 200


def test_keys_cli_create_list_revoke_on_a_running_cdn(
    make_cdn: Callable[..., Cdn], tmp_path: Path
) -> None:
    cdn = make_cdn()
    created = tandem(
        "keys", "create", "--scope", "models:read", "--scope", "models:publish",
        "--keys-file", str(cdn.keys_file), "--name", "ci-publisher",
        "--rate", "5", "--burst", "9",
        cwd=tmp_path,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    key_id, secret = parse_api_key(key)
    text = cdn.keys_file.read_text()
    assert secret not in text and key not in text
    assert stat.S_IMODE(cdn.keys_file.stat().st_mode) == 0o600
    stored = {k["id"]: k for k in json.loads(text)["keys"]}[key_id]
    assert stored["scopes"] == ["models:publish", "models:read"]
    assert (stored["rate"], stored["burst"], stored["name"]) == (5, 9, "ci-publisher")
    assert cdn.client.put(BLOB_URL, content=BLOB, headers=bearer(key)).status_code == 201

    listed = tandem("keys", "list", "--keys-file", str(cdn.keys_file), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert key_id in listed.stdout and "ci-publisher" in listed.stdout
    assert secret not in listed.stdout

    revoked = tandem("keys", "revoke", key_id, "--keys-file", str(cdn.keys_file), cwd=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    response = cdn.client.get("/v1/models", headers=bearer(key))
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]
    listed = tandem("keys", "list", "--keys-file", str(cdn.keys_file), cwd=tmp_path)
    assert "revoked" in listed.stdout


def test_keys_cli_refuses_unknown_scopes_and_ids(tmp_path: Path) -> None:
    keys_file = str(tmp_path / "k.json")
    bad = tandem("keys", "create", "--scope", "root", "--keys-file", keys_file, cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("tandem keys create: unknown scope 'root'")
    assert not Path(keys_file).exists()
    missing = tandem("keys", "revoke", "abcdef12", "--keys-file", keys_file, cwd=tmp_path)
    assert missing.returncode == 1
    assert "no API key file" in missing.stderr


def test_cdn_serve_refuses_a_missing_key_file(tmp_path: Path) -> None:
    result = tandem(
        "cdn", "serve", "--api-keys", str(tmp_path / "missing.json"),
        "--registry", f"sqlite:///{tmp_path}/registry.db", "--store", str(tmp_path / "blobs"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no API key file" in lines[0]
