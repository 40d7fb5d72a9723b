"""API-key rate limits shared by replicas through a real Redis, and the per-process fallback.

Each test starts its own ``redis-server`` on a free port (``tests/_redis.py``).
The bounds are the token bucket's own invariant (at most ``burst`` plus
``rate`` per second elapsed are ever granted), not timings.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from model_cdn import create_app
from model_cdn.registry import SqliteRegistry
from shared import ConfigError
from shared.server import (
    ApiKeyFile,
    ApiKeyGuard,
    LocalRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    generate_api_key,
    rate_limiter,
)
from shared.server.store import LocalBlobStore

from ._brokers import free_port
from ._cdn import serve_in_thread
from ._needs import need
from ._redis import RedisProcess, redis_missing


@pytest.fixture(autouse=True)
def _redis_server_binary() -> None:
    need(redis_missing())  # skipped without redis-server; failed under CI


RATE, BURST = 2.0, 6  # per second, at once: three per-process buckets would pass 3 * BURST


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path).start()
    yield server
    server.stop()


def _cdns(stack: ExitStack, root: Path, keys_file: Path, limiters: list[RateLimiter]) -> list[str]:
    """One CDN app per limiter on its own loopback port, all reading one key file."""
    urls = []
    for i, limiter in enumerate(limiters):
        registry = SqliteRegistry(root / f"cdn-{i}" / "registry.db")
        stack.callback(registry.close)
        guard = ApiKeyGuard.from_file(keys_file, limiter=limiter)
        app = create_app(
            registry=registry,
            store=LocalBlobStore(root / f"cdn-{i}" / "blobs"),
            admin_token=None,
            api_keys=guard,
        )
        urls.append(stack.enter_context(serve_in_thread(app)))
    return urls


def _flood(urls: list[str], key: str, rounds: int) -> tuple[int, float]:
    """GET /v1/models round-robin over ``urls``: (requests granted, seconds it took)."""
    granted = 0
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:
        start = time.monotonic()
        for _ in range(rounds):
            for url in urls:
                status = client.get(f"{url}/v1/models").status_code
                assert status in (200, 429), status
                granted += status == 200
        return granted, time.monotonic() - start


def test_one_keys_rate_holds_across_three_cdn_servers_sharing_redis(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    keys_file = tmp_path / "api-keys.json"
    text, key = generate_api_key(["models:read"], rate=RATE, burst=BURST)
    ApiKeyFile(keys_file).add(key)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    with ExitStack() as stack:
        shared = [RedisRateLimiter(redis_server.url, prefix=prefix) for _ in range(3)]
        for limiter in shared:
            stack.callback(limiter.close)
        urls = _cdns(stack, tmp_path / "shared", keys_file, list(shared))
        granted, elapsed = _flood(urls, text, rounds=15)
        assert all(limiter.shared for limiter in shared)
    # the whole fleet of three grants what one bucket would: burst, plus the refill
    assert BURST <= granted <= BURST + RATE * elapsed + 1, (granted, elapsed)

    # the same three servers with per-process buckets each let the key through in full
    with ExitStack() as stack:
        local: list[RateLimiter] = [LocalRateLimiter() for _ in range(3)]
        urls = _cdns(stack, tmp_path / "local", keys_file, local)
        granted_alone, _ = _flood(urls, text, rounds=15)
    assert granted_alone >= 3 * BURST > BURST + RATE * elapsed + 1


def test_the_bucket_in_redis_grants_the_burst_then_says_how_long_to_wait(
    redis_server: RedisProcess,
) -> None:
    limiter = RedisRateLimiter(redis_server.url, prefix=f"test:{uuid.uuid4().hex[:8]}:")
    try:
        waits = [limiter.take("k1", 0.01, 3) for _ in range(5)]
        assert waits[:3] == [0.0, 0.0, 0.0]
        assert all(0 < w <= 1 / 0.01 for w in waits[3:])
        # a key whose limits changed in the key file starts with a fresh, full bucket
        assert limiter.take("k1", 0.02, 3) == 0.0
        # buckets are per key
        assert limiter.take("k2", 0.01, 3) == 0.0
    finally:
        limiter.close()


def test_an_idle_bucket_in_redis_refills_to_its_burst_and_no_further(
    redis_server: RedisProcess,
) -> None:
    import redis

    rate, burst = 10.0, 3
    client = redis.Redis.from_url(redis_server.url)
    limiter = RedisRateLimiter(redis_server.url, prefix=f"test:{uuid.uuid4().hex[:8]}:")

    def redis_now() -> float:  # the bucket's own clock
        seconds, micros = client.time()
        return seconds + micros / 1e6

    try:
        while limiter.take("idle", rate, burst) == 0.0:  # empty the bucket
            pass
        # idle for 0.8 s of Redis's clock: 8 tokens' worth of refill, under the key's expiry
        # (1.3 s after the last take), so the bucket that comes back is the refilled one
        idle_until = redis_now() + 0.8
        _wait_until(lambda: redis_now() >= idle_until)
        start = redis_now()
        granted = [limiter.take("idle", rate, burst) for _ in range(10)].count(0.0)
        elapsed = redis_now() - start
        assert limiter.shared
        # at most the burst, plus what refills while the ten takes run
        assert burst <= granted <= burst + rate * elapsed + 1, (granted, elapsed)
    finally:
        limiter.close()
        client.close()


def test_redis_absent_lost_and_back_falls_back_to_per_process_buckets_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tandem.ratelimit")
    port = free_port()
    server = RedisProcess(tmp_path, port=port)
    limiter = RedisRateLimiter(
        f"redis://127.0.0.1:{port}/0", prefix=f"test:{uuid.uuid4().hex[:8]}:", retry_s=0.05
    )
    try:
        # absent: one warning at start, then the process's own buckets decide
        waits = [limiter.take("absent", 0.001, 4) for _ in range(20)]
        assert waits.count(0.0) == 4 and not limiter.shared
        assert _warnings(caplog) == 1 and "per process" in caplog.records[0].getMessage()

        # back: the shared buckets return, said once
        server.start()
        _wait_until(lambda: limiter.take("probe", 100.0, 100) == 0.0 and limiter.shared)
        assert _warnings(caplog) == 2 and "answers again" in caplog.records[1].getMessage()
        assert [limiter.take("back", 0.001, 2) for _ in range(3)].count(0.0) == 2

        # lost mid-way: one more warning, requests are still decided (no error, no hang)
        server.stop()
        waits = [limiter.take("lost", 0.001, 3) for _ in range(10)]
        assert waits.count(0.0) == 3 and not limiter.shared
        assert _warnings(caplog) == 3
    finally:
        limiter.close()
        server.stop()


def test_bad_redis_urls_are_config_errors_and_none_means_per_process() -> None:
    for url in ("http://127.0.0.1:6379", "127.0.0.1:6379", "redis://"):
        with pytest.raises(ConfigError, match="Redis URL"):
            RedisRateLimiter(url)
    assert isinstance(rate_limiter(None), LocalRateLimiter)
    assert isinstance(rate_limiter("  "), LocalRateLimiter)


def _warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        r.name == "tandem.ratelimit" and r.levelno == logging.WARNING for r in caplog.records
    )


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")
