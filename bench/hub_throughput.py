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
HTTP/1.1 client. Each (requesters, variant) point runs ``_REPEATS`` windows,
interleaved with the other variants in rotating order; throughput is the
median over windows (spread: min to max), latency percentiles pool every
answer of those windows. CPU per process comes from /proc; with py-spy
installed, the hub is also sampled at 64 requesters.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._load import HttpLoad, InProcessLoad, MqttLoad, Window
from ._plots import plot_throughput
from ._procs import (
    BrokerProcess,
    HubProcess,
    PlainServerProcess,
    cpu_ns,
    profile,
    profile_summary,
    write_model,
)
from ._report import RESULTS_DIR

__all__ = ["run"]

TARGET_SHARE = 0.85
TARGET_SPEEDUP = 3.0
TARGET_AT = 64
CONCURRENCY = (1, 8, 64, 256)
BATCH_SIZE = 64  # the hub's defaults: max_batch_size 64, max_queue_delay_ms 2
QUEUE_DELAY_MS = 2.0
BATCHED: dict[str, Any] = {"max_batch_size": BATCH_SIZE, "max_queue_delay_ms": QUEUE_DELAY_MS}
UNBATCHED: dict[str, Any] = {"max_batch_size": 1}
_REPEATS = 3
_WARM_S = 0.4
_WINDOW_S = 1.0
_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SWEEP_ROUNDS = 3
_SWEEP_S = 0.3
_PROFILE_S = 3.0
_PLOT = "hub_throughput.png"
WORKERS = 2

_LABELS = {
    "executor": "executor alone at its best batch size (the limit)",
    "batcher": "DynamicBatcher in process, no transport",
    "hub_mqtt": "hub, batching on (MQTT)",
    "hub_mqtt_unbatched": "hub, batching off (MQTT)",
    "hub_mqtt_workers": f"hub, batching on, --workers {WORKERS} (MQTT)",
    "hub_http": "hub, batching on (HTTP, binary tensors)",
    "plain_http": "plain FastAPI + ORT, one request per run (HTTP, JSON)",
}


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
        inputs=[TensorSpec(input_name, spec.datatype, spec.dims[1:])],
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
                    "executor": lambda n: _executor_window(executor, best_feed, _WINDOW_S),
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
                    "hub_workers": [hub_w.pid, *_children(hub_w.pid)],
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
    return _result(sweep, points, load, hub_profile)


_TIMES = (_WARM_S, _WINDOW_S)


def _http_loads(
    hub_port: int, plain_port: int, input_name: str, image: np.ndarray
) -> tuple[HttpLoad, HttpLoad]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": list(image.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": image.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    hub_http = HttpLoad(
        hub_port,
        "/v2/models/cloud/infer",
        header + image.tobytes(),
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
    )
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
    for r in range(_SWEEP_ROUNDS):
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
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    rows = batches = 0.0
    label = f'model="{model}"'
    for line in text.splitlines():
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


def _children(pid: int) -> list[int]:
    """Child processes of ``pid`` (a hub's workers), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _wait_for_workers(mqtt: MqttLoad, hub: HubProcess, feed: dict[str, np.ndarray]) -> None:
    """Until every worker serves: the first process then counts fewer answers than came."""
    deadline = time.monotonic() + 120.0
    while len(_children(hub.pid)) < WORKERS - 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    answered = 0
    while time.monotonic() < deadline:
        answered += len(mqtt.run("cloud", feed, 4, 0.0, 0.3).latencies_ms)
        if _metric_sum(hub.http_port, "tandem_inference_request_success_total{") < answered:
            return
    raise RuntimeError(f"the --workers {WORKERS} hub's other processes never answered")


def _metric_sum(port: int, prefix: str) -> float:
    """The sum of every series whose line starts with ``prefix`` on a hub's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
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
    """Every (variant, requesters) point, ``_REPEATS`` windows interleaved over variants."""
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
        for rep in range(_REPEATS):
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


def _result(
    sweep: dict[int, list[float]],
    points: dict[str, dict[int, dict[str, Any]]],
    load: dict[str, Any],
    hub_profile: dict[str, Any] | None,
) -> dict[str, Any]:
    best = {b: statistics.median(v) for b, v in sweep.items()}
    best_batch = max(best, key=lambda b: best[b])
    # The limit is re-measured in every round, interleaved with the variants (the sweep
    # only picks the batch size): the machine's other load moves it as much as anything.
    limit_by_n = {n: statistics.median(p["throughput"]) for n, p in points["executor"].items()}
    all_limits = [t for p in points["executor"].values() for t in p["throughput"]]
    limit = statistics.median(all_limits)
    summary: dict[str, dict[int, dict[str, Any]]] = {}
    for name, per_n in points.items():
        summary[name] = {}
        for n, p in per_n.items():
            lat = np.asarray(p["latencies"]) if p["latencies"] else np.asarray([np.nan])
            tput = statistics.median(p["throughput"])
            cores = {k: statistics.median(c[k] for c in p["cores"]) for k in p["cores"][0]}
            summary[name][n] = {
                "throughput": tput,
                "throughput_min": min(p["throughput"]),
                "throughput_max": max(p["throughput"]),
                "p50_ms": float(np.percentile(lat, 50)),
                "p99_ms": float(np.percentile(lat, 99)),
                "errors": p["errors"],
                "mean_batch": p["rows"] / p["batches"] if p["batches"] else None,
                "share_of_limit": tput / limit_by_n[n],
                "cores": cores,
                "server_cpu_us_per_request": cores["server"] / tput * 1e6 if tput else None,
                "load_cpu_us_per_request": cores["load generator"] / tput * 1e6 if tput else None,
            }
    at = {name: per_n[TARGET_AT] for name, per_n in summary.items()}
    hub, off, inproc = at["hub_mqtt"], at["hub_mqtt_unbatched"], at["batcher"]
    pool = at["hub_mqtt_workers"]
    share = hub["share_of_limit"]
    limit_at = limit_by_n[TARGET_AT]
    speedup = hub["throughput"] / off["throughput"]
    mean_batch = hub["mean_batch"] or 1.0
    nearest = min(best, key=lambda b: abs(b - mean_batch))
    compute_us = 1e6 / best[nearest]  # per sample, at about the batch size the hub formed
    cores = hub["cores"]
    why = (
        f"per-request work outside the model: at {TARGET_AT} requesters the hub answers "
        f"{hub['throughput']:.0f} req/s in batches of {mean_batch:.1f} on average and spends "
        f"{hub['server_cpu_us_per_request']:.0f} µs of CPU per request, against about "
        f"{compute_us:.0f} µs of compute per sample at batch {nearest} (executor alone). "
        "Even in process, without a transport, the batcher reaches only "
        f"{inproc['throughput']:.0f} req/s ({inproc['share_of_limit']:.0%} of the limit, "
        f"batches of {inproc['mean_batch'] or 1:.0f}, {inproc['server_cpu_us_per_request']:.0f} "
        "µs of CPU per request with its asyncio requesters under one GIL); the MQTT path "
        "multiplies that: per request paho handles four packets (request, its PUBACK, reply, "
        "its PUBACK) in pure Python on one network thread that also decodes the frame, and "
        "the batcher's thread encodes and publishes the reply, all under one GIL: the hub "
        "takes requests off its socket no faster than that, so the rest of the 64 wait in "
        "the broker and the socket rather than in the batcher's queue, and batches stay "
        f"small ({mean_batch:.1f}). Cores used (median): hub "
        f"{cores['server']:.2f}, load generator {cores['load generator']:.2f}, broker "
        f"{cores['broker']:.2f}, on a machine whose other jobs kept the load average at "
        f"{load['before'][0]:.1f}. With --workers {WORKERS} (a GIL each) the hub answers "
        f"{pool['throughput']:.0f} req/s ({pool['share_of_limit']:.1%}; hub "
        f"{pool['cores']['server']:.2f} cores, load generator "
        f"{pool['cores']['load generator']:.2f}, broker {pool['cores']['broker']:.2f}): "
        "the two cores are then full, the Python load generator taking its share"
    )
    targets = [
        {
            "name": f"hub throughput at {TARGET_AT} requesters against the executor alone "
            f"(best batch, {best_batch})",
            "target": f">= {TARGET_SHARE:.0%}",
            "measured": f"{share:.1%} ({hub['throughput']:.0f} req/s of {limit_at:.0f} samples/s "
            "in the same rounds; "
            f"windows {hub['throughput_min']:.0f} to {hub['throughput_max']:.0f})",
            "met": share >= TARGET_SHARE,
            "limited_by": None if share >= TARGET_SHARE else why,
        },
        {
            "name": f"hub throughput at {TARGET_AT} requesters, batching on vs off",
            "target": f">= {TARGET_SPEEDUP:.0f}x",
            "measured": f"{speedup:.2f}x ({hub['throughput']:.0f} vs "
            f"{off['throughput']:.0f} req/s; batch {mean_batch:.1f} vs 1)",
            "met": speedup >= TARGET_SPEEDUP,
            "limited_by": None
            if speedup >= TARGET_SPEEDUP
            else (
                "both are capped by the same per-request CPU outside the model (batching "
                f"off: {off['server_cpu_us_per_request']:.0f} µs of hub CPU per request, "
                f"batching on: {hub['server_cpu_us_per_request']:.0f} µs), so saving "
                "compute by batching moves throughput little; see the first target"
            ),
        },
    ]
    rows = []
    for name, per_n in summary.items():
        for n, st in per_n.items():
            if name == "executor":
                rows.append(
                    [
                        f"executor alone, batch {best_batch} (the limit)",
                        f"(rounds of {n})",
                        f"{st['throughput']:.0f} ({st['throughput_min']:.0f} to "
                        f"{st['throughput_max']:.0f}) samples/s",
                        "100%",
                        "—",
                        "—",
                        best_batch,
                        f"{st['cores']['server']:.2f} / — / —",
                        f"{st['server_cpu_us_per_request']:.0f} per sample",
                        0,
                    ]
                )
                continue
            rows.append(
                [
                    _LABELS[name],
                    n,
                    f"{st['throughput']:.0f} ({st['throughput_min']:.0f} to "
                    f"{st['throughput_max']:.0f})",
                    f"{st['share_of_limit']:.1%}",
                    f"{st['p50_ms']:.1f}",
                    f"{st['p99_ms']:.1f}",
                    "—" if st["mean_batch"] is None else f"{st['mean_batch']:.1f}",
                    f"{st['cores']['server']:.2f} / {st['cores']['load generator']:.2f} / "
                    f"{st['cores']['broker']:.2f}",
                    "—"
                    if st["server_cpu_us_per_request"] is None
                    else f"{st['server_cpu_us_per_request']:.0f}",
                    st["errors"],
                ]
            )
    sweep_rows = [
        [b, f"{best[b]:.0f}", f"{min(v):.0f} to {max(v):.0f}", f"{b / best[b] * 1e3:.2f}"]
        for b, v in sweep.items()
    ]
    tables = [
        {
            "title": "Executor alone (OnnxExecutor, the hub's session options), samples/s by "
            f"batch size; median of {_SWEEP_ROUNDS} rounds",
            "columns": ["batch size", "samples/s", "range", "ms per batch"],
            "rows": sweep_rows,
        },
        {
            "title": f"By variant and requesters (throughput: median of {_REPEATS} windows of "
            f"{_WINDOW_S} s, range; latency pools the windows; cores: server / load "
            "generator / broker)",
            "columns": [
                "variant",
                "requesters",
                "req/s (range)",
                "of limit",
                "p50 ms",
                "p99 ms",
                "mean batch",
                "cores",
                "server CPU µs / request",
                "errors",
            ],
            "rows": rows,
        },
    ]
    notes = _notes(load, summary)
    if hub_profile is not None and "threads_cpu_s" in hub_profile:
        seconds = hub_profile["seconds"]
        tables.append(
            {
                "title": f"Where the hub's CPU goes at {TARGET_AT} requesters, batching on "
                f"(py-spy, {seconds:.0f} s, on-CPU samples; "
                f"{hub_profile['requests_per_s']:.0f} req/s meanwhile)",
                "columns": ["thread: leaf function", "CPU s", "share"],
                "rows": [
                    [f"`{k}`", f"{v:.2f}", f"{v / seconds:.0%} of a core"]
                    for k, v in hub_profile["top_leaves_cpu_s"]
                ],
            }
        )
        by_thread = ", ".join(
            f"{k} {v / seconds:.0%}" for k, v in hub_profile["threads_cpu_s"].items()
        )
        notes.append(f"Hub threads' on-CPU share of a core at {TARGET_AT} requesters: {by_thread}.")
    else:
        notes.append("py-spy is not installed: no profile of the hub (pip install py-spy).")
    plot_throughput(  # it draws five series: the in-process batcher stays in the table
        {name: per_n for name, per_n in summary.items() if name not in ("executor", "batcher")},
        _LABELS,
        limit=limit,
        limit_range=(min(all_limits), max(all_limits)),
        limit_label=f"executor alone, batch {best_batch} (the limit)",
        target_share=TARGET_SHARE,
        title="Hub throughput on the demo's cloud CNN, 2 shared cores",
        path=RESULTS_DIR / _PLOT,
    )
    return {
        "title": "(c) Hub throughput under dynamic batching",
        "summary": (
            f"The demo's cloud CNN (ONNX, 1x28x28 FP32 in, 10 logits out). The executor "
            f"alone, at its best batch size ({best_batch}), computes {limit:.0f} samples/s "
            f"(median over all rounds). At {TARGET_AT} "
            f"closed-loop requesters the hub over MQTT answers {hub['throughput']:.0f} req/s "
            f"({share:.1%} of that), {speedup:.2f}x its batching-off figure; the same batcher "
            f"in process, without a transport, answers {inproc['throughput']:.0f} req/s, the "
            f"hub with --workers {WORKERS} {pool['throughput']:.0f} req/s, and the plain "
            f"FastAPI server {at['plain_http']['throughput']:.0f} req/s."
        ),
        "targets": targets,
        "tables": tables,
        "plots": [_PLOT],
        "notes": notes,
        "data": {
            "hub_config_batched": BATCHED,
            "hub_config_unbatched": UNBATCHED,
            "executor_samples_per_s": {str(b): v for b, v in sweep.items()},
            "executor_limit": {
                "batch": best_batch,
                "samples_per_s_median": limit,
                "samples_per_s_by_round": all_limits,
            },
            "points": {
                name: {str(n): st for n, st in per_n.items()} for name, per_n in summary.items()
            },
            "hub_profile": hub_profile,
            "load_average": load,
        },
    }


def _notes(load: dict[str, Any], summary: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    http_stall = summary["hub_http"][1]["p50_ms"] > 35.0
    notes = [
        "Hub configs: batching on = the defaults a user starts from (`max_batch_size` 64, "
        "`max_queue_delay_ms` 2); batching off = `max_batch_size` 1. Both are models of one "
        "hub process, measured in turn. The in-process row is a `DynamicBatcher` with the "
        "same executor class and settings in the bench's own process. The batcher computes "
        "a lone request for an idle model at once; the 2 ms window runs only while "
        "requests keep company.",
        f"`--workers {WORKERS}`: `python -m cloud_hub --workers {WORKERS}` with the batching "
        "config, its own Mosquitto and its own load generator (so that none of its requests "
        "reach the single-process hub), interleaved with the rest; its server CPU sums both "
        "processes. Its mean batch is the first process's (its /metrics counts its own "
        "requests); the plot leaves out the in-process batcher (the plotting helper draws "
        "five series).",
        "Requesters: MQTT variants use 4 raw paho clients (MQTT 5, QoS 1 both ways, "
        "TCP_NODELAY, no in-flight cap) sharing the N requesters, every request frame "
        "encoded once and replies matched by their JSON header; HTTP variants use N "
        "keep-alive connections on one asyncio loop with a minimal HTTP/1.1 client; the "
        "in-process row uses N asyncio tasks awaiting the batcher's futures. The load "
        "generator, the broker and the server share the same 2 cores (the cores column "
        "shows each one's take), so figures here are lower bounds for a server with the "
        "machine to itself.",
        "The plain server is FastAPI on uvicorn (one worker) with a sync `def` route, which "
        "FastAPI runs in its thread pool; each request is its own `session.run` (default "
        "session options); JSON nested lists in and out.",
        f"The machine is shared with other jobs: load average {load['before'][0]:.1f} "
        f"before, {load['after'][0]:.1f} after, on {os.cpu_count()} cores. Windows of every "
        "variant are interleaved, so they see the same interference; the ranges show it.",
        "The hub's MQTT path as measured: paho's network thread reads each request, "
        "acknowledges it and decodes it, then hands it to the batcher; the batcher's thread "
        "encodes each reply and publishes it from the batch's completion (paho then writes "
        "it from its network thread). Reply properties are packed by hand, and correlation "
        "data goes back only to requests that sent some (the envelope carries the id). "
        "Decoding frames on another thread would not help under one GIL: it is the same "
        "Python work. What is left per request is mostly paho's own Python (four packets), "
        "then the codec and the thread hand-offs; a C-backed MQTT client is the next step "
        "for one process, `--workers` the one for spare cores.",
    ]
    if http_stall:
        notes.insert(
            0,
            "The hub's HTTP variant is held back by a ~40 ms stall per response (delayed "
            "ACK: its listening socket is created with proto 0, so asyncio never sets "
            "TCP_NODELAY on accepted connections; see the round-trip part). Its figures "
            "measure that bug, not the HTTP path.",
        )
    return notes
