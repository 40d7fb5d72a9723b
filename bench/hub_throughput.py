"""(c) Hub throughput under dynamic batching, on the demo's cloud CNN.

The model is the demo's cloud ONNX model (``tandem._training``, cached in
``~/.cache/tandem``; built through the demo's own code path if missing,
which takes minutes once). Against it, at 1, 8, 64 and 256 closed-loop
requesters:

* the limit: the hub's ``OnnxExecutor`` alone (the hub's own session
  options). A sweep over batch sizes 1..256 picks the best one; the limit
  itself is then re-measured at that size in every round, interleaved with
  the variants, because the machine's other load moves it as much as
  anything does;
* the hub (``python -m cloud_hub``) with the config a user starts from
  (``max_batch_size`` 64, ``max_queue_delay_ms`` 2, the defaults), over MQTT;
* the same hub and model with batching off (``max_batch_size`` 1), over MQTT;
* the batching hub as ``python -m cloud_hub --workers 2`` (two hub processes
  in one share group), over MQTT through a broker and load generator of its
  own, so that its requests never reach the single-process hub;
* the same batching hub over its HTTP API (binary tensors);
* a plain FastAPI + ONNX Runtime server running each request alone
  (``bench._baselines``; uvicorn, one worker), JSON nested lists;
* to locate the loss: the hub's ``DynamicBatcher`` in this process, fed by
  asyncio tasks, with no transport at all.

Requesters (``bench._load``): MQTT through four raw paho clients sharing the
N requesters (each request frame encoded once, replies matched by header),
HTTP through N keep-alive connections on one asyncio loop with a minimal
HTTP/1.1 client. Each (requesters, variant) point runs ``REPEATS`` windows,
interleaved with the other variants in rotating order; throughput is the
median over windows (spread: min to max), latency percentiles pool every
answer of those windows. CPU per process comes from /proc; with py-spy
installed, the hub is also sampled at 64 requesters. The part's settings,
targets and the result built from the points are in
``bench._hub_throughput_report``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._hub_throughput_report import (
    BATCH_SIZE,
    BATCHED,
    QUEUE_DELAY_MS,
    REPEATS,
    SWEEP_ROUNDS,
    TARGET_AT,
    UNBATCHED,
    WINDOW_S,
    WORKERS,
    build_result,
)
from ._load import HttpLoad, InProcessLoad, MqttLoad, Window, binary_infer_request
from ._procs import (
    BrokerProcess,
    HubProcess,
    PlainServerProcess,
    children,
    cpu_ns,
    hub_metrics,
    profile,
    profile_summary,
    write_model,
)

__all__ = ["run"]

CONCURRENCY = (1, 8, 64, 256)
_WARM_S = 0.4
_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SWEEP_S = 0.3
_PROFILE_S = 3.0


def run() -> dict[str, Any]:
    from cloud_hub import DynamicBatcher, OnnxExecutor, TensorSpec
    from tandem._training import build_demo_models

    model = build_demo_models().cloud_onnx
    image = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    executor = OnnxExecutor(model)  # the hub's own executor class and session options
    spec = executor.inputs[0]
    input_name = spec.name
    expected = next(iter(executor.run({input_name: image}).values()))
    sweep = _executor_sweep(executor, input_name)
    batcher = DynamicBatcher(
        executor,
        inputs=[TensorSpec(input_name, spec.datatype, spec.shape[1:])],
        max_batch_size=BATCH_SIZE,
        max_queue_delay_ms=QUEUE_DELAY_MS,
        model="cloud",
    ).start()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-tp-") as tmp:
        work = Path(tmp)
        write_model(work / "repo", "cloud", model, BATCHED)
        write_model(work / "repo", "cloud_unbatched", model, UNBATCHED)
        (work / "workers").mkdir()
        write_model(work / "workers" / "repo", "cloud", model, BATCHED)
        with (
            BrokerProcess(work).start() as broker,
            HubProcess(work / "repo", broker.url, work).start() as hub,
            PlainServerProcess(model, work).start() as plain,
            BrokerProcess(work / "workers").start() as broker_w,
            _WorkersHubProcess(
                work / "workers" / "repo", broker_w.url, work / "workers"
            ).start() as hub_w,
        ):
            mqtt = MqttLoad(broker.url)
            mqtt_w = MqttLoad(broker_w.url)
            try:
                hub_http, plain_http = _http_loads(hub.http_port, plain.port, input_name, image)
                _check(mqtt, hub_http, plain_http, input_name, image, expected)
                feed = {input_name: image}
                _wait_for_workers(mqtt_w, hub_w, feed)
                in_process = InProcessLoad(lambda: batcher.submit(feed))
                best = max(sweep, key=lambda b: statistics.median(sweep[b]))
                best_feed = {input_name: np.repeat(image, best, axis=0)}
                runs: dict[str, Any] = {
                    "executor": lambda n: _executor_window(executor, best_feed, WINDOW_S),
                    "batcher": lambda n: in_process.run(n, *_TIMES),
                    "hub_mqtt": lambda n: mqtt.run("cloud", feed, n, *_TIMES),
                    "hub_mqtt_unbatched": lambda n: mqtt.run("cloud_unbatched", feed, n, *_TIMES),
                    "hub_mqtt_workers": lambda n: mqtt_w.run("cloud", feed, n, *_TIMES),
                    "hub_http": lambda n: hub_http.run(n, *_TIMES),
                    "plain_http": lambda n: plain_http.run(n, *_TIMES),
                }
                servers = {
                    "self": [os.getpid()],
                    "hub": [hub.pid],
                    "plain": [plain.pid],
                    "hub_workers": [hub_w.pid, *children(hub_w.pid)],
                }
                brokers = {"hub_mqtt_workers": broker_w.pid}

                def batcher_counts() -> tuple[float, float]:
                    stats = batcher.metrics.snapshot()
                    return float(stats.rows), float(stats.batches)

                counters = {
                    "batcher": batcher_counts,
                    "hub_mqtt": lambda: _hub_counts(hub.http_port, "cloud"),
                    "hub_mqtt_unbatched": lambda: _hub_counts(hub.http_port, "cloud_unbatched"),
                    "hub_http": lambda: _hub_counts(hub.http_port, "cloud"),
                    # The first process's share only: its /metrics counts its own requests.
                    "hub_mqtt_workers": lambda: _hub_counts(hub_w.http_port, "cloud"),
                }
                points = _measure(runs, broker.pid, servers, counters, brokers)
                spy = profile(hub.pid, _PROFILE_S)
                window = mqtt.run("cloud", feed, TARGET_AT, 0.5, _PROFILE_S + 0.5)
                hub_profile = profile_summary(spy) if spy is not None else None
                if hub_profile is not None:
                    hub_profile["requests_per_s"] = window.throughput
            finally:
                mqtt.close()
                mqtt_w.close()
                batcher.stop()
                executor.close()
    load = {"before": load_before, "after": os.getloadavg()}
    return build_result(sweep, points, load, hub_profile)


_TIMES = (_WARM_S, WINDOW_S)


def _http_loads(
    hub_port: int, plain_port: int, input_name: str, image: np.ndarray
) -> tuple[HttpLoad, HttpLoad]:
    body, headers = binary_infer_request(input_name, image)
    hub_http = HttpLoad(hub_port, "/v2/models/cloud/infer", body, headers)
    plain_http = HttpLoad(
        plain_port,
        "/infer",
        json.dumps({"data": image.tolist()}).encode(),
        {"Content-Type": "application/json"},
    )
    return hub_http, plain_http


def _check(
    mqtt: MqttLoad,
    hub_http: HttpLoad,
    plain_http: HttpLoad,
    input_name: str,
    image: np.ndarray,
    expected: np.ndarray,
) -> None:
    """Every variant computes the same answer, so they time the same work."""
    for model in ("cloud", "cloud_unbatched"):
        window = mqtt.run(model, {input_name: image}, 1, 0.0, 0.3)
        if window.errors or not window.latencies_ms:
            raise RuntimeError(f"the hub did not answer {model} over MQTT")
    body = hub_http.one()
    length = len(body) - expected.nbytes
    got = np.frombuffer(body, np.float32, offset=length).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    got = np.asarray(json.loads(plain_http.one())["outputs"], np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def _executor_window(executor: Any, feed: dict[str, np.ndarray], seconds: float) -> Window:
    """The executor alone at one batch size for ``seconds``: its samples/s as a window."""
    rows = next(iter(feed.values())).shape[0]
    n = 0
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        executor.run_batch(feed)
        n += 1
    return Window(seconds=elapsed, latencies_ms=[elapsed / n * 1000.0] * (n * rows))


def _executor_sweep(executor: Any, input_name: str) -> dict[int, list[float]]:
    """Samples/s of the executor alone by batch size, rounds interleaved over sizes."""
    rng = np.random.default_rng(1)
    batches = {b: {input_name: rng.random((b, 1, 28, 28), dtype=np.float32)} for b in _SWEEP}
    for batch in batches.values():
        executor.run_batch(batch)
    out: dict[int, list[float]] = {b: [] for b in _SWEEP}
    for r in range(SWEEP_ROUNDS):
        order = list(_SWEEP) if r % 2 == 0 else list(reversed(_SWEEP))
        for b in order:
            n = 0
            t0 = time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < _SWEEP_S or n < 3:
                executor.run_batch(batches[b])
                n += 1
            out[b].append(n * b / elapsed)
    return out


def _hub_counts(port: int, model: str) -> tuple[float, float]:
    """(rows computed, batches executed) for ``model`` from the hub's /metrics."""
    rows = batches = 0.0
    label = f'model="{model}"'
    for line in hub_metrics(port).splitlines():
        if label not in line:
            continue
        if line.startswith("tandem_inference_count_total{"):
            rows = float(line.rsplit(" ", 1)[1])
        elif line.startswith("tandem_inference_exec_count_total{"):
            batches = float(line.rsplit(" ", 1)[1])
    return rows, batches


class _WorkersHubProcess(HubProcess):
    """``python -m cloud_hub --workers N``; ready once its first process is."""

    def command(self, port: int) -> list[str]:
        return [*super().command(port), "--workers", str(WORKERS)]


def _wait_for_workers(mqtt: MqttLoad, hub: HubProcess, feed: dict[str, np.ndarray]) -> None:
    """Until every worker serves: the first process then counts fewer answers than came."""
    deadline = time.monotonic() + 120.0
    while len(children(hub.pid)) < WORKERS - 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    answered = 0
    while time.monotonic() < deadline:
        answered += len(mqtt.run("cloud", feed, 4, 0.0, 0.3).latencies_ms)
        if _metric_sum(hub.http_port, "tandem_inference_request_success_total{") < answered:
            return
    raise RuntimeError(f"the --workers {WORKERS} hub's other processes never answered")


def _metric_sum(port: int, prefix: str) -> float:
    """The sum of every series whose line starts with ``prefix`` on a hub's /metrics."""
    lines = [line for line in hub_metrics(port).splitlines() if line.startswith(prefix)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def _cpu_ns(pids: list[int]) -> int:
    return sum(cpu_ns(pid) for pid in pids)


def _measure(
    runs: dict[str, Any],
    broker_pid: int,
    servers: dict[str, list[int]],
    counters: dict[str, Callable[[], tuple[float, float]]],
    brokers: dict[str, int],
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every (variant, requesters) point, ``REPEATS`` windows interleaved over variants."""
    names = list(runs)
    points: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in names}
    me = os.getpid()
    for n in CONCURRENCY:
        for name in names:
            points[name][n] = {
                "throughput": [],
                "latencies": [],
                "errors": 0,
                "cores": [],
                "rows": 0.0,
                "batches": 0.0,
            }
        for rep in range(REPEATS):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                point = points[name][n]
                server = {
                    "plain_http": "plain",
                    "batcher": "self",
                    "executor": "self",
                    "hub_mqtt_workers": "hub_workers",
                }.get(name, "hub")
                watched = {
                    "load generator": [me],
                    "broker": [brokers.get(name, broker_pid)],
                    "server": servers[server],
                }
                counter = counters.get(name)
                counts = counter() if counter else (0.0, 0.0)
                cpu0, t0 = {k: _cpu_ns(p) for k, p in watched.items()}, time.perf_counter()
                window: Window = runs[name](n)
                elapsed = time.perf_counter() - t0
                cores = {k: (_cpu_ns(p) - cpu0[k]) / 1e9 / elapsed for k, p in watched.items()}
                if server == "self":  # one process: the load generator's share is in "server"
                    cores["load generator"] = 0.0
                if counter:
                    after = counter()
                    point["rows"] += after[0] - counts[0]
                    point["batches"] += after[1] - counts[1]
                point["throughput"].append(window.throughput)
                point["latencies"].extend(window.latencies_ms)
                point["errors"] += window.errors
                point["cores"].append(cores)
    return points
