"""(c) Hub throughput: the part's tables, notes and plot, from the summarized points.

``describe_cores`` says where a point's CPU went, process by process (the
executor serving it, each ingress process, the supervisor), in cores or in
µs per request; ``tables_notes_plot`` lays out everything else the part
shows.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from ._heavy_model import CHANNELS, HIDDEN
from ._hub_throughput_memory import BODIES, ISOLATION_REQUESTERS
from ._hub_throughput_settings import (
    REPEATS,
    STALL_MS,
    SWEEP_ROUNDS,
    TARGET_AT,
    WINDOW_S,
    WORKERS,
)
from ._plots import plot_throughput
from ._report import RESULTS_DIR

__all__ = ["LABELS", "describe_cores", "tables_notes_plot"]

PLOT = "hub_throughput.png"
_IDLE_CORES = 0.005  # a process using less than this is idle in a row
LABELS = {
    "executor": "tiny model: executor alone at its best batch size (the limit)",
    "batcher": "DynamicBatcher in process, no transport",
    "hub_mqtt": "hub, batching on (MQTT)",
    "hub_mqtt_unbatched": "hub, batching off (MQTT)",
    "hub_mqtt_workers": f"hub, batching on, --workers {WORKERS} (MQTT)",
    "hub_http": "hub, batching on (HTTP, binary tensors)",
    "plain_http": "plain FastAPI + ORT, one request per run (HTTP, JSON)",
    "echo_crt": "bare echo consumer, awscrt MQTT 5 (the hub ingress's client)",
    "echo_paho": "bare echo consumer, paho-mqtt (reference)",
    "hub_mqtt_paho_load": "hub, batching on (MQTT), paho load generator",
    "hub_mqtt_paho": "hub, batching on, --mqtt-client paho (MQTT)",
    "hub_http_workers": f"hub, batching on, --http-workers {WORKERS} (HTTP, binary tensors)",
    "executor_heavy": "heavy model: executor alone at its best batch size (the limit)",
    "heavy_mqtt": "heavy model: hub, batching on (MQTT)",
    "heavy_mqtt_unbatched": "heavy model: hub, batching off (MQTT)",
    "heavy_mqtt_paho": "heavy model: hub, batching on, --mqtt-client paho (MQTT)",
}
_LOAD_OF = {  # which load generator drives each row
    "hub_mqtt_paho_load": "paho-mqtt, 4 clients",
    "hub_http": "asyncio HTTP/1.1, 1 process",
    "hub_http_workers": "asyncio HTTP/1.1, 1 process",
    "plain_http": "asyncio HTTP/1.1, 1 process",
    "batcher": "asyncio tasks, in process",
    "executor": "—",
    "executor_heavy": "—",
}


def describe_cores(point: dict[str, Any], *, per_request: bool) -> str:
    """``executor 0.61, mqtt 0 0.52, supervisor 0.01`` (or µs per request), busiest first."""
    procs = point["processes"]
    executors = sorted((k for k in procs if k.startswith("executor")), key=lambda k: -procs[k])
    others = [k for k in procs if not k.startswith(("executor", "supervisor"))]
    # An ingress of the other transport sits idle in a hub row: leave it out.
    shown = executors[:1] + [k for k in others if procs[k] >= _IDLE_CORES or len(procs) == 1]
    parts = [(k, procs[k]) for k in shown]
    if len(executors) > 1:
        parts.append((f"{len(executors) - 1} idle executors", sum(procs[k] for k in executors[1:])))
    if "supervisor" in procs:
        parts.append(("supervisor", procs["supervisor"]))
    if per_request:
        tput = point["throughput"] or float("nan")
        return ", ".join(f"{k} {v / tput * 1e6:.0f} µs" for k, v in parts)
    return ", ".join(f"{k} {v:.2f}" for k, v in parts)


def tables_notes_plot(
    m: dict[str, Any],
    summary: dict[str, dict[int, dict[str, Any]]],
    limits: dict[str, dict[int, float]],
) -> tuple[list[dict[str, Any]], list[str]]:
    tables = [_sweep_table(m, model) for model in ("cloud", "heavy")]
    tables.append(_variants_table(summary, m["best_batch"]))
    tables.append(_cores_table(summary))
    tables.append(_memory_table(m["memory_isolation"]))
    tables += _gpu_tables(m["gpu"])
    notes = _notes(m, summary)
    profile = m["hub_profile"]
    if profile is not None and "threads_cpu_s" in profile:
        seconds = profile["seconds"]
        tables.append(
            {
                "title": f"Where hub A's MQTT ingress process spends its CPU at {TARGET_AT} "
                f"requesters, tiny model (py-spy, {seconds:.0f} s, on-CPU samples; "
                f"{profile['requests_per_s']:.0f} req/s meanwhile)",
                "columns": ["thread: leaf function", "CPU s", "share"],
                "rows": [
                    [f"`{k}`", f"{v:.2f}", f"{v / seconds:.0%} of a core"]
                    for k, v in profile["top_leaves_cpu_s"]
                ],
            }
        )
    else:
        notes.append("py-spy is not installed: no profile of the hub (pip install py-spy).")
    shown = ("hub_mqtt", "hub_mqtt_unbatched", "hub_mqtt_workers", "hub_http", "plain_http")
    all_limits = [t for p in m["points"]["executor"].values() for t in p["throughput"]]
    plot_throughput(  # five series with a point at every requester count
        {name: summary[name] for name in shown},
        LABELS,
        limit=statistics.median(all_limits),
        limit_range=(min(all_limits), max(all_limits)),
        limit_label=f"tiny model: executor alone, batch {m['best_batch']['cloud']} (the limit)",
        reference=(
            summary["echo_crt"][TARGET_AT]["throughput"],
            f"{LABELS['echo_crt']}, {TARGET_AT} requesters",
        ),
        title="Hub throughput on the demo's tiny cloud CNN, 2 shared cores",
        path=RESULTS_DIR / PLOT,
    )
    return tables, notes


def _sweep_table(m: dict[str, Any], model: str) -> dict[str, Any]:
    sweep, cpu = m["sweeps"][model], m["sweep_cpu_us"][model]
    rows = []
    for b, v in sweep.items():
        rate = statistics.median(v)
        rows.append(
            [
                b,
                f"{rate:.0f}",
                f"{min(v):.0f} to {max(v):.0f}",
                f"{b / rate * 1e3:.2f}",
                f"{statistics.median(cpu[b]):.0f}",
            ]
        )
    what = "the demo's tiny cloud CNN" if model == "cloud" else "the heavy CNN"
    return {
        "title": f"Executor alone on {what} (OnnxExecutor, the hub's session options), "
        f"by batch size; median of {SWEEP_ROUNDS} rounds",
        "columns": ["batch size", "samples/s", "range", "ms per batch", "CPU µs per sample"],
        "rows": rows,
    }


def _variants_table(
    summary: dict[str, dict[int, dict[str, Any]]], best: dict[str, int]
) -> dict[str, Any]:
    rows = []
    for name, per_n in summary.items():
        load = _LOAD_OF.get(name, "awscrt MQTT 5, 4 clients")
        for n, st in per_n.items():
            if name.startswith("executor"):
                model = "heavy" if name == "executor_heavy" else "cloud"
                rows.append(
                    [
                        f"{LABELS[name]}, batch {best[model]}",
                        f"(rounds of {n})",
                        f"{st['throughput']:.0f} ({st['throughput_min']:.0f} to "
                        f"{st['throughput_max']:.0f}) samples/s",
                        "100%",
                        "—",
                        "—",
                        best[model],
                        f"{st['cores']['server']:.2f} / — / —",
                        f"{st['server_cpu_us_per_request']:.0f} per sample",
                        load,
                        0,
                    ]
                )
                continue
            share = st["share_of_limit"]
            rows.append(
                [
                    LABELS[name],
                    n,
                    f"{st['throughput']:.0f} ({st['throughput_min']:.0f} to "
                    f"{st['throughput_max']:.0f})",
                    "—" if share is None else f"{share:.1%}",
                    f"{st['p50_ms']:.1f}",
                    f"{st['p99_ms']:.1f}",
                    "—" if st["mean_batch"] is None else f"{st['mean_batch']:.1f}",
                    f"{st['cores']['server']:.2f} / {st['cores']['load generator']:.2f} / "
                    f"{st['cores']['broker']:.2f}",
                    "—"
                    if st["server_cpu_us_per_request"] is None
                    else f"{st['server_cpu_us_per_request']:.0f}",
                    load,
                    st["errors"],
                ]
            )
    return {
        "title": f"By variant and requesters (throughput: median of {REPEATS} windows of "
        f"{WINDOW_S} s, range; latency pools the windows; of limit: against the same model's "
        "executor alone in the same rounds; cores: server (every process of it) / load "
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
            "load generator",
            "errors",
        ],
        "rows": rows,
    }


def _cores_table(summary: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    rows = []
    for name, per_n in summary.items():
        st = per_n.get(TARGET_AT)
        if st is None or name.startswith(("executor", "batcher")):
            continue
        rows.append(
            [
                LABELS[name],
                f"{st['cores']['load generator']:.2f}",
                f"{st['cores']['broker']:.2f}",
                describe_cores(st, per_request=False),
                f"{st['cores']['server']:.2f}",
                describe_cores(st, per_request=True),
            ]
        )
    return {
        "title": f"Cores each process used at {TARGET_AT} requesters (/proc, median over "
        "windows; the server's processes busiest first)",
        "columns": [
            "variant",
            "load generator",
            "broker",
            "server processes (cores)",
            "server total",
            "server processes (CPU µs per request)",
        ],
        "rows": rows,
    }


def _memory_table(mi: dict[str, Any]) -> dict[str, Any]:
    mem, iso = mi["memory"], mi["isolation"]
    rows = [
        [
            f"{BODIES} JSON bodies at once, hub A's memory (sum of PSS)",
            f"{mem['before_mib']:.0f} MiB before, {mem['peak_growth_mib']:+.0f} MiB at the "
            f"peak, {mem['after_growth_mib']:+.1f} MiB {mem['returned_in_s']:.1f} s after; "
            f"{mem['in_flight_mib']:.0f} MiB in flight; answers {mem['statuses']} in "
            f"{mem['burst_s']:.1f} s",
        ]
    ]
    for condition in ("idle", "flood"):
        c = iso[condition]
        cores = ", ".join(f"{k} {v:.2f}" for k, v in c["cores"].items() if v >= 0.01)
        what = (
            "no HTTP traffic"
            if condition == "idle"
            else f"{BODIES} connections sending bodies back to back "
            f"({c['bodies_answered']} answered: {c['bodies_statuses']})"
        )
        rows.append(
            [
                f"MQTT at {ISOLATION_REQUESTERS} requesters, {what}",
                f"{c['requests_per_s']:.0f} req/s, p50 {c['p50_ms']:.2f} ms, p99 "
                f"{c['p99_ms']:.2f} ms ({c['answers']} answers); hub cores: {cores}",
            ]
        )
    return {
        "title": f"Memory and isolation on hub A ({mi['rounds']} rounds of {mi['window_s']} s "
        "windows per condition, alternating)",
        "columns": ["what", "measured"],
        "rows": rows,
    }


def _gpu_tables(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    if "skipped" in gpu:
        return [
            {
                "title": "GPU entry",
                "columns": ["status"],
                "rows": [[f"skipped: {gpu['skipped']}"]],
            }
        ]
    head = (
        f"{gpu['gpu']} (driver {gpu['driver']}, {gpu['gpu_memory']}), onnxruntime "
        f"{gpu['onnxruntime']} (onnxruntime-gpu {gpu['onnxruntime_gpu'] or 'not installed'})"
    )
    rows = []
    for model, sweep in gpu["sweeps"].items():
        best = max(sweep, key=lambda b: statistics.median(sweep[b]))
        rows.append(
            [
                f"{model}: executor alone on {gpu['executor_devices'][model]}",
                "—",
                f"{statistics.median(sweep[best]):.0f} samples/s at batch {best} (batch 1: "
                f"{statistics.median(sweep['1']):.0f})",
                "—",
                "—",
                "—",
            ]
        )
    for name, per_n in gpu["summary"].items():
        for n, st in per_n.items():
            rows.append(
                [
                    f"{name.removeprefix('gpu_hub_')}: hub --device cuda (MQTT)",
                    n,
                    f"{st['throughput']:.0f} req/s",
                    f"{st['p50_ms']:.1f} / {st['p99_ms']:.1f}",
                    "—" if st["mean_batch"] is None else f"{st['mean_batch']:.1f}",
                    f"{st['cores']['server']:.2f} / {st['cores']['load generator']:.2f} / "
                    f"{st['cores']['broker']:.2f}",
                ]
            )
    return [
        {
            "title": f"GPU entry: {head}",
            "columns": ["row", "requesters", "throughput", "p50 / p99 ms", "mean batch", "cores"],
            "rows": rows,
        }
    ]


def _notes(m: dict[str, Any], summary: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    load = m["load"]
    clients = m["load_clients"]
    notes = []
    flood = m["memory_isolation"]["isolation"]["flood"]
    refused = flood["bodies_statuses"].get("503", 0)
    if refused:
        notes.append(
            f"During the flood the HTTP ingress answered {refused} of "
            f"{flood['bodies_answered']} bodies with 503 (overloaded: its in-flight byte "
            "budget) without parsing them, so the flood loaded the hub less than "
            f"{BODIES} bodies in parsing at all times would."
        )
    lone = summary["hub_mqtt"][1]
    if lone["p50_ms"] > STALL_MS:
        notes.append(
            f"The hub's MQTT rows at few requesters are held back by a stall of ~40 ms per "
            f"reply (hub A, 1 requester: p50 {lone['p50_ms']:.1f} ms, "
            f"{lone['throughput']:.0f} req/s; the isolation rows at {ISOLATION_REQUESTERS} "
            "requesters too; hub P with `--mqtt-client paho`: p50 "
            f"{summary['hub_mqtt_paho'][1]['p50_ms']:.1f} ms). The signature of Nagle's "
            "algorithm against a delayed ACK: the MQTT ingress publishes each reply from the "
            "thread that reads the executors' replies, so it leaves as a small write of its "
            "own, held until the broker acknowledges the request's PUBACK, which Linux delays "
            "up to 40 ms, unless the ingress's socket to the broker has TCP_NODELAY. At 64 "
            "requesters the stall also caps throughput (N requesters over the mean round "
            "trip).",
        )
    return [
        *notes,
        "Hub A: `python -m cloud_hub --workers 1 --http-workers 1` serving four models, "
        "each in an executor process of its own: the tiny CNN with batching on (the "
        "defaults a user starts from, `max_batch_size` 64, `max_queue_delay_ms` 2) and off "
        "(`max_batch_size` 1), the heavy CNN likewise. Hub W: `--workers 2 --http-workers 2` "
        "with the tiny CNN batching, on a broker of its own. Hub P: `--workers 1 "
        "--http-workers 1 --mqtt-client paho` with both CNNs batching, under its own topic "
        "prefix on hub A's broker. The server CPU of a hub row sums every process of that "
        "hub (supervisor, executors, ingress), idle ones included.",
        f"The heavy CNN (`bench._heavy_model`): Conv 3x3 ({CHANNELS}) -> ReLU -> MaxPool 2 "
        f"-> FC {CHANNELS * 14 * 14}x{HIDDEN} -> ReLU -> FC 10 on 1x28x28 digits, ONNX built "
        "with fixed random weights: its rows measure throughput, not accuracy.",
        "Load generators: MQTT rows use awscrt's MQTT 5 client in the bench process "
        f"({clients['a'][1]} clients, each a device publishing on its own topic; QoS 1 both "
        "ways), except the one row marked paho (raw paho clients, as the earlier runs "
        "used); HTTP rows use N keep-alive connections on one asyncio loop; the echo rows "
        "use the awscrt load generator against echo consumers under their own topic "
        "prefixes on hub A's broker. The load generator, broker and servers share the "
        "same 2 cores (the cores columns show each one's take), so figures here are lower "
        "bounds for a server with the machine to itself.",
        "Hub CPU per request outside the model = the CPU of every hub process per request "
        "minus the executor alone's CPU per sample at the swept batch size nearest the "
        "mean batch the hub formed (its executor sweep table, last column).",
        "Memory: PSS (`/proc/PID/smaps_rollup`, shared pages counted once) summed over "
        f"every hub A process, sampled every 10 ms while {BODIES} bodies are in flight; "
        "the bodies come from a process of their own (`bench._json_flood`).",
        f"The machine is shared with other jobs: load average {load['before'][0]:.1f} "
        f"before, {load['after'][0]:.1f} after, on {os.cpu_count()} cores. Windows of every "
        "variant are interleaved, so they see the same interference; the ranges show it.",
    ]
