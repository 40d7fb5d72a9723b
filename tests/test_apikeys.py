"""API keys without a server: the key text, the file of keys, scopes and token buckets.

Time is a fake clock the tests move by hand, so no test waits or depends on speed.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from shared import ConfigError, InvalidApiKeyError, RateLimitedError, ScopeError
from shared.server import (
    API_KEY_SCOPES,
    ApiKey,
    ApiKeyFile,
    ApiKeyGuard,
    TokenBucket,
    generate_api_key,
    parse_api_key,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guard_over(*keys: ApiKey, clock: FakeClock | None = None) -> ApiKeyGuard:
    table = {k.id: k for k in keys}
    return ApiKeyGuard(lambda: table, clock=clock or FakeClock())


# -- the key text -------------------------------------------------------------------------


def test_a_new_key_reads_tdm_id_secret_and_its_record_holds_only_a_hash() -> None:
    text, key = generate_api_key(["infer"], name="cams")
    key_id, secret = parse_api_key(text)
    assert text == f"tdm_{key_id}_{secret}" and key_id == key.id
    assert len(key.id) == 8 and int(key.id, 16) >= 0
    assert len(secret) == 43  # 32 bytes, URL-safe base64 without padding
    assert secret not in json.dumps(key.to_dict())
    assert key.matches(secret) and not key.matches(
        secret[:-1] + ("A" if secret[-1] != "A" else "B")
    )
    assert ApiKey.from_dict(key.to_dict()) == key


def test_two_keys_never_share_an_id_or_secret() -> None:
    texts = {generate_api_key(["infer"])[0] for _ in range(50)}
    assert len(texts) == 50
    assert len({parse_api_key(t)[0] for t in texts}) == 50


@pytest.mark.parametrize(
    "text",
    [
        "",
        "tdm_",
        "tdm_1234567_" + "a" * 43,  # id too short
        "tdm_1234567G_" + "a" * 43,  # not hex
        "tdm_ABCDEF12_" + "a" * 43,  # upper-case id
        "tdm_12345678_" + "a" * 42,  # secret too short
        "tdm_12345678_" + "a" * 42 + "=",  # padding / wrong alphabet
        "xyz_12345678_" + "a" * 43,
        "tdm_12345678_" + "a" * 43 + "\n",
    ],
)
def test_malformed_keys_are_refused_before_any_lookup(text: str) -> None:
    looked_up = []
    guard = ApiKeyGuard(lambda: looked_up.append(1) or {})  # type: ignore[func-returns-value]
    with pytest.raises(InvalidApiKeyError, match="malformed"):
        guard.check(text, ["infer"])
    assert not looked_up


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", "xyz"),
        ("secret_sha256", "00"),
        ("scopes", []),
        ("scopes", ["infer", "root"]),
        ("rate", 0),
        ("rate", float("inf")),
        ("burst", 0),
        ("burst", 1.5),
        ("name", "two\nlines"),
    ],
)
def test_a_key_record_validates_in_its_constructor(field: str, value: object) -> None:
    _, key = generate_api_key(["infer"])
    data = {**key.to_dict(), field: value}
    with pytest.raises(ConfigError):
        ApiKey.from_dict(data)


# -- the guard: 401, then 403, then 429 ---------------------------------------------------------


def test_wrong_secret_unknown_id_and_revoked_key_are_all_invalid() -> None:
    text, key = generate_api_key(["infer"])
    other, _ = generate_api_key(["infer"])
    guard = guard_over(key)
    assert guard.check(text, ["infer"]) == key
    forged = f"tdm_{key.id}_{parse_api_key(other)[1]}"  # a real id with someone else's secret
    with pytest.raises(InvalidApiKeyError, match="unknown"):
        guard.check(forged, ["infer"])
    with pytest.raises(InvalidApiKeyError, match="unknown"):
        guard.check(other, ["infer"])
    from dataclasses import replace

    revoked = guard_over(replace(key, revoked="2026-01-01T00:00:00Z"))
    with pytest.raises(InvalidApiKeyError, match="revoked"):
        revoked.check(text, ["infer"])


def test_a_key_needs_one_of_the_scopes_the_route_accepts() -> None:
    text, key = generate_api_key(["models:read"])
    guard = guard_over(key)
    assert guard.check(text, ["models:read", "infer"]) == key
    with pytest.raises(ScopeError, match="'infer'"):
        guard.check(text, ["infer"])
    with pytest.raises(ScopeError):
        guard.check(text, ["models:publish", "rollout:admin"])
    assert {"infer", "generate", "models:read", "models:publish", "rollout:admin"} == API_KEY_SCOPES


def test_refused_requests_take_no_token() -> None:
    text, key = generate_api_key(["models:read"], rate=1, burst=1)
    guard = guard_over(key)
    for _ in range(5):
        with pytest.raises(ScopeError):
            guard.check(text, ["infer"])
    guard.check(text, ["models:read"])  # the one token is still there


def test_rate_limit_says_when_to_retry_and_recovers_as_the_clock_moves() -> None:
    clock = FakeClock()
    text, key = generate_api_key(["infer"], rate=2, burst=3)
    guard = guard_over(key, clock=clock)
    for _ in range(3):
        guard.check(text, ["infer"])
    with pytest.raises(RateLimitedError) as refused:
        guard.check(text, ["infer"])
    assert refused.value.retry_after_s == pytest.approx(0.5)
    assert refused.value.retry_after_header == "1"  # whole seconds, never 0
    clock.now += 0.5
    guard.check(text, ["infer"])
    with pytest.raises(RateLimitedError):
        guard.check(text, ["infer"])
    clock.now += 3600  # refills to the burst, no further
    for _ in range(3):
        guard.check(text, ["infer"])
    with pytest.raises(RateLimitedError):
        guard.check(text, ["infer"])


def test_each_key_has_its_own_bucket() -> None:
    clock = FakeClock()
    a_text, a = generate_api_key(["infer"], rate=1, burst=1)
    b_text, b = generate_api_key(["infer"], rate=1, burst=1)
    guard = guard_over(a, b, clock=clock)
    guard.check(a_text, ["infer"])
    with pytest.raises(RateLimitedError):
        guard.check(a_text, ["infer"])
    guard.check(b_text, ["infer"])


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert RateLimitedError("x", 0.001).retry_after_header == "1"
    assert RateLimitedError("x", 1.0).retry_after_header == "1"
    assert RateLimitedError("x", 1.01).retry_after_header == "2"
    assert RateLimitedError("x", 40.0).retry_after_header == "40"


def test_a_token_bucket_grants_exactly_burst_to_many_threads_at_once() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1.0, 100, clock=clock)
    granted: list[bool] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(50):
            ok = bucket.take() == 0.0
            with lock:
                granted.append(ok)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted.count(True) == 100
    assert bucket.take() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


# -- the file -------------------------------------------------------------------------------


def test_the_key_file_round_trip_never_holds_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    store = ApiKeyFile(path)
    text, key = generate_api_key(["infer", "models:read"], name="fleet", rate=5, burst=10)
    store.add(key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    _, secret = parse_api_key(text)
    assert secret not in path.read_text()
    assert text not in path.read_text()
    assert ApiKeyFile(path).load() == {key.id: key}
    guard = ApiKeyGuard.from_file(path)
    assert guard.check(text, ["infer"]).name == "fleet"
    revoked = store.revoke(key.id)
    assert revoked.revoked is not None
    assert ApiKeyFile(path).load()[key.id].revoked == revoked.revoked  # kept, marked
    with pytest.raises(InvalidApiKeyError, match="revoked"):
        guard.check(text, ["infer"])  # the running guard re-read the file
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_adding_a_key_keeps_the_others_and_refuses_a_duplicate_id(tmp_path: Path) -> None:
    store = ApiKeyFile(tmp_path / "keys.json")
    _, a = generate_api_key(["infer"])
    _, b = generate_api_key(["rollout:admin"])
    store.add(a)
    store.add(b)
    assert set(store.load()) == {a.id, b.id}
    with pytest.raises(ConfigError, match="already"):
        store.add(a)
    with pytest.raises(ConfigError, match="no API key"):
        store.revoke("ffffffff" if "ffffffff" not in (a.id, b.id) else "00000000")


def test_a_server_refuses_to_start_on_a_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no API key file"):
        ApiKeyGuard.from_file(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    for text in ("{", "[]", '{"keys": []}', '{"version": 2, "keys": []}'):
        broken.write_text(text)
        with pytest.raises(ConfigError):
            ApiKeyGuard.from_file(broken)


def test_a_file_that_goes_bad_while_serving_fails_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.json"
    text, key = generate_api_key(["infer"])
    ApiKeyFile(path).add(key)
    guard = ApiKeyGuard.from_file(path)
    guard.check(text, ["infer"])
    path.write_text("{ not json")
    with pytest.raises(InvalidApiKeyError):
        guard.check(text, ["infer"])
    assert "refused until the file is fixed" in caplog.text
    os.unlink(path)
    with pytest.raises(InvalidApiKeyError):
        guard.check(text, ["infer"])
    ApiKeyFile(path).add(key)  # fixed: accepted again
    guard.check(text, ["infer"])


def test_a_changed_rate_in_the_file_takes_effect(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    text, key = generate_api_key(["infer"], rate=1, burst=1)
    ApiKeyFile(path).add(key)
    clock = FakeClock()
    guard = ApiKeyGuard(ApiKeyFile(path).keys, clock=clock)
    guard.check(text, ["infer"])
    with pytest.raises(RateLimitedError):
        guard.check(text, ["infer"])
    data = json.loads(path.read_text())
    data["keys"][0]["burst"] = 10  # a new size: noticed even within one mtime tick
    path.write_text(json.dumps(data))
    for _ in range(10):
        guard.check(text, ["infer"])
