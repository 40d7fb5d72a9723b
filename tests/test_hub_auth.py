"""API keys on the hub's HTTP API: real uvicorn on loopback, real httpx, a real key file.

The token buckets run on a fake clock the tests move by hand: rate limits are
asserted on status codes, never on timings. Security tests are named after
the attack they stage.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cloud_hub import Hub
from cloud_hub.http import HttpServer, create_app
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key

from ._cli import tandem_env
from ._hub_http_kit import WAIT_S, hub_fixture, infer_json, rows

__all__ = ["hub_fixture"]

INFER = "/v2/models/linear/infer"


def tandem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = tandem_env()
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SecuredHub:
    def __init__(self, client: httpx.Client, keys_file: Path, clock: FakeClock) -> None:
        self.client = client
        self.keys_file = keys_file
        self.clock = clock

    def key(self, *scopes: str, rate: float = 100.0, burst: int = 100) -> str:
        text, key = generate_api_key(scopes, name="test", rate=rate, burst=burst)
        ApiKeyFile(self.keys_file).add(key)
        return text

    def infer(self, key: str | None) -> httpx.Response:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        return self.client.post(INFER, json=infer_json(rows(1)), headers=headers)


@pytest.fixture
def make_secured(hub: Hub, tmp_path: Path) -> Iterator[Callable[[], SecuredHub]]:
    with ExitStack() as stack:

        def make() -> SecuredHub:
            keys_file = tmp_path / "api-keys.json"
            ApiKeyFile(keys_file).add(generate_api_key(["infer"])[1])  # a file with a stranger
            clock = FakeClock()
            guard = ApiKeyGuard(ApiKeyFile(keys_file).keys, clock=clock)
            server = stack.enter_context(HttpServer(create_app(hub, api_keys=guard), port=0))
            client = stack.enter_context(httpx.Client(base_url=server.url, timeout=WAIT_S))
            return SecuredHub(client, keys_file, clock)

        yield make


@pytest.fixture
def secured(make_secured: Callable[[], SecuredHub]) -> SecuredHub:
    return make_secured()


def test_health_probes_server_metadata_and_metrics_stay_open(secured: SecuredHub) -> None:
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/metrics"):
        assert secured.client.get(path).status_code == 200, path


def test_infer_without_a_key_is_401_with_a_bearer_challenge(secured: SecuredHub) -> None:
    response = secured.infer(None)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "Bearer" in response.json()["error"]


@pytest.mark.parametrize(
    "authorization",
    [
        "Basic YWRtaW46eA==",
        "Bearer",
        "Bearer tdm_12345678_short",
        "Bearer not-a-key",
        "Bearer tdm_abcdef12_" + "A" * 43 + " extra",
        "tdm_abcdef12_" + "A" * 43,
    ],
)
def test_malformed_credentials_are_401(secured: SecuredHub, authorization: str) -> None:
    response = secured.client.post(
        INFER, json=infer_json(rows(1)), headers={"Authorization": authorization}
    )
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert set(response.json()) == {"error"}


def test_forged_key_with_a_known_id_is_401(secured: SecuredHub) -> None:
    real = secured.key("infer")
    forged = real[: len("tdm_12345678_")] + ("A" * 43 if not real.endswith("A" * 43) else "B" * 43)
    assert secured.infer(forged).status_code == 401
    assert secured.infer(real).status_code == 200


def test_a_key_without_the_infer_scope_gets_403(secured: SecuredHub) -> None:
    reader = secured.key("models:read")
    response = secured.infer(reader)
    assert response.status_code == 403
    assert "infer" in response.json()["error"]
    assert "www-authenticate" not in response.headers
    publisher = secured.key("models:publish", "rollout:admin")
    assert secured.infer(publisher).status_code == 403


def test_the_right_scope_infers_and_reads_metadata(secured: SecuredHub) -> None:
    inferer = secured.key("infer")
    response = secured.infer(inferer)
    assert response.status_code == 200, response.text
    assert response.json()["model_name"] == "linear"
    for key in (inferer, secured.key("models:read")):
        auth = {"Authorization": f"Bearer {key}"}
        for path in (
            "/v2/models/linear",
            "/v2/models/linear/ready",
            "/v2/models/linear/versions/1",
        ):
            assert secured.client.get(path, headers=auth).status_code == 200, path
    assert secured.client.get("/v2/models/linear").status_code == 401
    wrong = {"Authorization": f"Bearer {secured.key('rollout:admin')}"}
    assert secured.client.get("/v2/models/linear", headers=wrong).status_code == 403


def test_flooding_with_one_key_gets_429_with_retry_after_then_recovers(
    secured: SecuredHub,
) -> None:
    key = secured.key("infer", rate=1, burst=2)
    other = secured.key("infer", rate=1, burst=2)
    assert [secured.infer(key).status_code for _ in range(2)] == [200, 200]
    limited = secured.infer(key)
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert "rate" in limited.json()["error"]
    assert secured.infer(other).status_code == 200  # another key has its own bucket
    secured.clock.now += 1.0
    assert secured.infer(key).status_code == 200
    assert secured.infer(key).status_code == 429


def test_revoking_a_key_with_the_cli_locks_it_out_of_a_running_hub(
    secured: SecuredHub, tmp_path: Path
) -> None:
    key = secured.key("infer")
    assert secured.infer(key).status_code == 200
    key_id = key.split("_")[1]
    revoked = tandem("keys", "revoke", key_id, "--keys-file", str(secured.keys_file), cwd=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    response = secured.infer(key)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]


def test_the_hub_command_refuses_a_missing_key_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.json")
    result = tandem("hub", "--repo", str(tmp_path), "--api-keys", missing, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no API key file" in result.stderr
