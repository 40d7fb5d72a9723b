"""One API key's rate limit holds across a hub's HTTP processes sharing a real Redis.

``tandem hub --http-workers 3 --redis URL`` runs three HTTP ingress processes
on one port (the kernel spreads new connections over them); each keeps no
bucket of its own, so the key gets what one bucket grants: its burst plus the
refill for the time elapsed (the bucket's own invariant, not a timing).
Per-process buckets would grant up to three bursts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import ApiKeyFile, generate_api_key

from ._brokers import free_port
from ._cli import ROOT
from ._hub_http_kit import infer_json, rows, write_repo
from ._redis import RedisProcess, redis_missing

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=str(redis_missing()))

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


@pytest.mark.slow
def test_one_keys_rate_holds_across_three_http_processes_of_a_hub_sharing_redis(
    tmp_path: Path, mosquitto: Any
) -> None:
    redis = RedisProcess(tmp_path).start()
    keys_file = tmp_path / "api-keys.json"
    text, key = generate_api_key(["infer"], rate=RATE, burst=BURST)
    ApiKeyFile(keys_file).add(key)
    port, log = free_port(), tmp_path / "hub.log"
    command = [
        sys.executable, "-m", "cloud_hub", "--repo", str(write_repo(tmp_path / "repo")),
        "--broker", mosquitto.url, "--no-share", "--workers", "1", "--http-workers", "3",
        "--http-port", str(port), "--api-keys", str(keys_file), "--redis", redis.url,
        "--log-level", "warning",
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, process, log)
        granted, statuses = 0, set()
        no_reuse = httpx.Limits(max_keepalive_connections=0)  # a new connection each time
        with httpx.Client(base_url=url, timeout=30, limits=no_reuse) as c:
            start = time.monotonic()
            for _ in range(45):
                r = c.post(
                    "/v2/models/linear/infer",
                    json=infer_json(rows(1)),
                    headers={"Authorization": f"Bearer {text}"},
                )
                statuses.add(r.status_code)
                granted += r.status_code == 200
            elapsed = time.monotonic() - start
        assert statuses <= {200, 429}, statuses
        assert BURST <= granted <= BURST + RATE * elapsed + 1, (granted, elapsed)
        assert "per process" not in log.read_text()  # Redis was used, not the fallback
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(WAIT_S) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        redis.stop()
