"""One API key's rate limit holds across HTTP processes sharing a real Redis.

Two shapes, each with three HTTP processes: one ``tandem hub --http-workers 3
--redis URL`` (three ingress processes on one port; the kernel spreads new
connections over them), and three hub replicas, each a ``tandem hub`` of its
own on its own port, taking requests in turn as a load balancer would send
them. No process keeps a bucket of its own, so the key gets what one bucket
grants: its burst plus the refill for the time elapsed (the bucket's own
invariant, not a timing). Per-process buckets would grant up to three bursts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.server import ApiKeyFile, generate_api_key

from ._brokers import free_port
from ._cli import ROOT
from ._hub_http_kit import infer_json, rows, write_repo
from ._needs import need
from ._redis import RedisProcess, redis_missing


@pytest.fixture(autouse=True)
def _redis_server_binary() -> None:
    need(redis_missing())  # skipped without redis-server; failed under CI


RATE, BURST = 2.0, 6
WAIT_S = 60.0


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + WAIT_S
    with httpx.Client(base_url=url, timeout=5) as c:
        while True:
            try:
                if c.get("/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < end and process.poll() is None, log.read_text()
            time.sleep(0.1)


def _listeners(port: int) -> int:
    """Sockets listening on ``port`` (each HTTP process has one, sharing it by SO_REUSEPORT)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(
        1
        for row in rows
        if (fields := row.split())[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port
    )


@contextlib.contextmanager
def _hub(
    tmp_path: Path, name: str, broker: str, keys_file: Path, redis_url: str, http_workers: int
) -> Iterator[str]:
    """A ``tandem hub`` process serving HTTP with the keys and Redis: its URL, once ready."""
    port, log = free_port(), tmp_path / f"{name}.log"
    command = [
        sys.executable, "-m", "cloud_hub", "--repo", str(write_repo(tmp_path / f"{name}-repo")),
        "--broker", broker, "--no-share", "--workers", "1",
        "--http-workers", str(http_workers), "--http-port", str(port),
        "--api-keys", str(keys_file), "--redis", redis_url, "--log-level", "warning",
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, process, log)
        end = time.monotonic() + WAIT_S  # ready once one listens: wait for all of them
        while _listeners(port) < http_workers:
            assert time.monotonic() < end and process.poll() is None, log.read_text()
            time.sleep(0.1)
        yield url
        assert "per process" not in log.read_text()  # Redis was used, not the fallback
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(WAIT_S) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _granted(urls: list[str], text: str, n: int = 45) -> tuple[int, set[int], float]:
    """``n`` requests with the key, in turn over ``urls``, each on a new connection."""
    granted, statuses = 0, set()
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=30, limits=no_reuse) as c:
        start = time.monotonic()
        for i in range(n):
            r = c.post(
                urls[i % len(urls)] + "/v2/models/linear/infer",
                json=infer_json(rows(1)),
                headers={"Authorization": f"Bearer {text}"},
            )
            statuses.add(r.status_code)
            granted += r.status_code == 200
        return granted, statuses, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["one hub, 3 HTTP processes", "3 hubs"])
def test_one_keys_rate_holds_across_three_http_processes_sharing_redis(
    shape: str, tmp_path: Path, mosquitto: Any
) -> None:
    redis = RedisProcess(tmp_path).start()
    keys_file = tmp_path / "api-keys.json"
    text, key = generate_api_key(["infer"], rate=RATE, burst=BURST)
    ApiKeyFile(keys_file).add(key)
    try:
        with contextlib.ExitStack() as hubs:
            if shape == "3 hubs":
                urls = [
                    hubs.enter_context(
                        _hub(tmp_path, f"hub{i}", mosquitto.url, keys_file, redis.url, 1)
                    )
                    for i in range(3)
                ]
            else:
                urls = [
                    hubs.enter_context(
                        _hub(tmp_path, "hub", mosquitto.url, keys_file, redis.url, 3)
                    )
                ]
            granted, statuses, elapsed = _granted(urls, text)
        assert statuses <= {200, 429}, statuses
        assert BURST <= granted <= BURST + RATE * elapsed + 1, (granted, elapsed)
    finally:
        redis.stop()
