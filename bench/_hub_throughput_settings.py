"""(c) Hub throughput: the part's settings (hub configs, windows, repeats, requesters).

``TANDEM_BENCH_QUICK=1`` shortens everything for development: one short
window per point, fewer requester counts, one sweep round. The lead's
published figures come from a full run.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "BATCHED",
    "BATCH_SIZE",
    "CONCURRENCY",
    "ISOLATION_ROUNDS",
    "ISOLATION_WINDOW_S",
    "PREVIOUS_HTTP_REQ_S",
    "QUEUE_DELAY_MS",
    "QUICK",
    "REPEATS",
    "STALL_MS",
    "SWEEP_ROUNDS",
    "TARGET_AT",
    "UNBATCHED",
    "WARM_S",
    "WINDOW_S",
    "WORKERS",
]

QUICK = os.environ.get("TANDEM_BENCH_QUICK") == "1"  # development: short windows, once each
TARGET_AT = 64
CONCURRENCY = (1, TARGET_AT) if QUICK else (1, 8, TARGET_AT, 256)
BATCH_SIZE = 64  # the hub's defaults: max_batch_size 64, max_queue_delay_ms 2
QUEUE_DELAY_MS = 2.0
BATCHED: dict[str, Any] = {"max_batch_size": BATCH_SIZE, "max_queue_delay_ms": QUEUE_DELAY_MS}
UNBATCHED: dict[str, Any] = {"max_batch_size": 1}
REPEATS = 1 if QUICK else 3
WINDOW_S = 0.5 if QUICK else 1.0
WARM_S = 0.3 if QUICK else 0.4
SWEEP_ROUNDS = 1 if QUICK else 3
ISOLATION_WINDOW_S = 1.0 if QUICK else 2.0
ISOLATION_ROUNDS = 1 if QUICK else 2
WORKERS = 2
# Hub, batching on, HTTP binary tensors, 64 connections: BENCHMARKS.md part c of the
# 2026-11-30 run, the single-process hub before issue 10 (its item 5 asks for 2x this).
PREVIOUS_HTTP_REQ_S = 822.0
# A median MQTT round trip above this at 1 requester is a stall (Nagle against a delayed
# ACK), not work: the report then says so.
STALL_MS = 30.0
