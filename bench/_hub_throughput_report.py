"""(c) Hub throughput: the part's settings, and its targets built from the measured points.

``bench.hub_throughput`` measures; ``build_result`` turns the executor sweeps
and every (variant, requesters) point into the part's summary and targets,
each next to its figure and, when missed, what limits it; the tables, notes
and plot come from ``bench._hub_throughput_tables``. See ``bench._report``
for the result's shape.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from ._hub_throughput_memory import BODIES, ISOLATION_REQUESTERS, RETURNED_MIB
from ._hub_throughput_settings import (
    BATCHED,
    PREVIOUS_HTTP_REQ_S,
    QUICK,
    STALL_MS,
    TARGET_AT,
    UNBATCHED,
    WORKERS,
)
from ._hub_throughput_tables import describe_cores, tables_notes_plot

__all__ = ["build_result", "summarize"]

TARGET_ECHO_SHARE = 0.60
TARGET_OUTSIDE_VS_ECHO = 2.0
TARGET_HEAVY_MS_AT_1 = 1.0
TARGET_HEAVY_GAIN = 4.0
TARGET_HEAVY_SPEEDUP = 3.0
TARGET_HEAVY_SHARE = 0.75
TARGET_SCALING = 1.6
TARGET_HTTP_GAIN = 2.0
TARGET_MEMORY_X = 3.0
TARGET_FLOOD_P99_X = 2.0
# The model each row serves; its executor-alone row is that model's limit.
MODEL_OF = {
    "executor_heavy": "heavy",
    "heavy_mqtt": "heavy",
    "heavy_mqtt_unbatched": "heavy",
    "heavy_mqtt_paho": "heavy",
}
LIMIT_OF = {"cloud": "executor", "heavy": "executor_heavy"}


def summarize(p: dict[str, Any], limit: float | None) -> dict[str, Any]:
    """One measured point as figures: medians over windows, percentiles over answers."""
    lat = np.asarray(p["latencies"]) if p["latencies"] else np.asarray([np.nan])
    tput = statistics.median(p["throughput"])
    cores = {k: statistics.median(c[k] for c in p["cores"]) for k in p["cores"][0]}
    labels = sorted({k for c in p["processes"] for k in c})
    processes = {k: statistics.median(c.get(k, 0.0) for c in p["processes"]) for k in labels}
    return {
        "throughput": tput,
        "throughput_min": min(p["throughput"]),
        "throughput_max": max(p["throughput"]),
        "p50_ms": float(np.percentile(lat, 50)),
        "mean_ms": float(np.mean(lat)),
        "p99_ms": float(np.percentile(lat, 99)),
        "errors": p["errors"],
        "mean_batch": p["rows"] / p["batches"] if p["batches"] else None,
        "share_of_limit": tput / limit if limit else None,
        "cores": cores,
        "processes": processes,
        "server_cpu_us_per_request": cores["server"] / tput * 1e6 if tput else None,
        "load_cpu_us_per_request": cores["load generator"] / tput * 1e6 if tput else None,
    }


def _per_sample(sweep: dict[int, list[float]], batch: float) -> tuple[int, float]:
    """(nearest swept batch size, its median) for a batch size the hub formed."""
    nearest = min(sweep, key=lambda b: abs(b - batch))
    return nearest, statistics.median(sweep[nearest])


def _closed_loop(point: dict[str, Any]) -> str:
    """Little's law for a closed loop: N requesters over the mean round trip bound the rate."""
    return (
        f"{TARGET_AT} requesters over a mean round trip of {point['mean_ms']:.1f} ms allow "
        f"{TARGET_AT / point['mean_ms'] * 1e3:.0f} req/s"
    )


def _target(name: str, target: str, measured: str, met: bool | None, why: str) -> dict[str, Any]:
    return {
        "name": name,
        "target": target,
        "measured": measured,
        "met": met,
        "limited_by": None if met or met is None else why,
    }


def build_result(m: dict[str, Any]) -> dict[str, Any]:
    sweeps, sweep_cpu = m["sweeps"], m["sweep_cpu_us"]
    limits = {
        model: {n: statistics.median(p["throughput"]) for n, p in m["points"][row].items()}
        for model, row in LIMIT_OF.items()
    }
    summary: dict[str, dict[int, dict[str, Any]]] = {}
    for name, per_n in m["points"].items():
        by_n = limits[MODEL_OF.get(name, "cloud")]
        limit_for = (lambda n: None) if name.startswith("echo") else by_n.get
        summary[name] = {n: summarize(p, limit_for(n)) for n, p in per_n.items()}
    at = {name: per_n[TARGET_AT] for name, per_n in summary.items()}
    stalled = summary["hub_mqtt"][1]["p50_ms"] > STALL_MS
    stall = "; see the note on the reply stall" if stalled else ""
    targets = _echo_targets(at, sweep_cpu["cloud"], m["load"], stall)
    targets += _heavy_targets(at, sweeps["heavy"], m["best_batch"]["heavy"], stall)
    targets += _scaling_http_targets(at, m["load"])
    targets += _memory_targets(m["memory_isolation"])
    gpu = m["gpu"]
    if "skipped" in gpu:
        targets.append(
            _target(
                "GPU entry: part c's executor sweep and hub MQTT rows on CUDA",
                "run where onnxruntime has CUDA and nvidia-smi lists a GPU",
                f"skipped: {gpu['skipped']}",
                None,
                "",
            )
        )
    else:
        gpu["summary"] = {
            name: {n: summarize(p, None) for n, p in per_n.items()}
            for name, per_n in gpu.pop("points").items()
        }
    hub, heavy, echo = at["hub_mqtt"], at["heavy_mqtt"], at["echo_crt"]
    tables, notes = tables_notes_plot(m, summary, limits)
    return {
        "title": "(c) Hub throughput under dynamic batching",
        "summary": (
            ("Quick run (TANDEM_BENCH_QUICK=1): short windows, once each. " if QUICK else "")
            + f"The hub as processes (an executor per model, MQTT and HTTP ingress "
            f"processes, shared-memory rings). At {TARGET_AT} closed-loop requesters over "
            f"MQTT, on the demo's tiny cloud CNN the hub answers {hub['throughput']:.0f} req/s "
            f"against {echo['throughput']:.0f} msg/s for a bare awscrt echo consumer on the "
            f"same broker; on a heavier CNN (random weights, throughput only) "
            f"{heavy['throughput']:.0f} req/s, {heavy['share_of_limit']:.0%} of its executor's "
            f"best-batch limit and {heavy['throughput'] / at['heavy_mqtt_unbatched']['throughput']:.1f}x "  # noqa: E501
            f"its batching-off figure. --workers {WORKERS}: "
            f"{at['hub_mqtt_workers']['throughput']:.0f} req/s; HTTP binary tensors "
            f"{at['hub_http']['throughput']:.0f} req/s (one HTTP process), "
            f"{at['hub_http_workers']['throughput']:.0f} (two); the plain FastAPI server "
            f"{at['plain_http']['throughput']:.0f} req/s."
        ),
        "targets": targets,
        "tables": tables,
        "plots": ["hub_throughput.png"],
        "notes": notes,
        "data": {
            "quick": QUICK,
            "hub_config_batched": BATCHED,
            "hub_config_unbatched": UNBATCHED,
            "executor_samples_per_s": {
                model: {str(b): v for b, v in s.items()} for model, s in sweeps.items()
            },
            "executor_cpu_us_per_sample": {
                model: {str(b): v for b, v in s.items()} for model, s in sweep_cpu.items()
            },
            "best_batch": m["best_batch"],
            "points": {
                name: {str(n): st for n, st in per_n.items()} for name, per_n in summary.items()
            },
            "load_clients": m["load_clients"],
            "memory_isolation": m["memory_isolation"],
            "gpu": gpu,
            "hub_profile": m["hub_profile"],
            "load_average": m["load"],
            "previous_http_req_s": PREVIOUS_HTTP_REQ_S,
        },
    }


def _echo_targets(
    at: dict[str, dict[str, Any]], cpu: dict[int, list[float]], load: dict[str, Any], stall: str
) -> list[dict[str, Any]]:
    hub, echo = at["hub_mqtt"], at["echo_crt"]
    share = hub["throughput"] / echo["throughput"]
    batch = hub["mean_batch"] or 1.0
    nearest, compute = _per_sample(cpu, batch)
    outside = (hub["server_cpu_us_per_request"] or 0.0) - compute
    echo_us = echo["server_cpu_us_per_request"] or float("nan")
    ratio = outside / echo_us
    where = describe_cores(hub, per_request=True)
    return [
        _target(
            f"tiny model, {TARGET_AT} requesters: hub req/s against a bare echo consumer "
            "(awscrt MQTT 5, the hub ingress's client; same broker, same frame)",
            f">= {TARGET_ECHO_SHARE:.0%}",
            f"{share:.0%} ({hub['throughput']:.0f} req/s vs {echo['throughput']:.0f} msg/s; "
            f"load generator awscrt, {hub['cores']['load generator']:.2f} vs "
            f"{echo['cores']['load generator']:.2f} cores)",
            share >= TARGET_ECHO_SHARE,
            f"the hub's CPU per request: {hub['server_cpu_us_per_request']:.0f} µs in all its "
            f"processes ({where}) against {echo_us:.0f} µs for the echo; the hub "
            f"used {hub['cores']['server']:.2f} cores, broker {hub['cores']['broker']:.2f}, "
            f"load generator {hub['cores']['load generator']:.2f}, on 2 cores shared with "
            f"other jobs (load average {load['before'][0]:.1f} before the part); "
            f"{_closed_loop(hub)} (p50 {hub['p50_ms']:.1f} ms against the echo's "
            f"{echo['p50_ms']:.1f} ms{stall})",
        ),
        _target(
            f"tiny model, {TARGET_AT} requesters: hub CPU per request outside the model "
            "against the echo consumer's CPU per message",
            f"<= {TARGET_OUTSIDE_VS_ECHO:.0f}x",
            f"{ratio:.1f}x ({outside:.0f} µs = {hub['server_cpu_us_per_request']:.0f} µs in "
            f"all hub processes - {compute:.0f} µs of compute per sample at batch {nearest}, "
            f"the size nearest the hub's mean batch of {batch:.1f}; echo {echo_us:.0f} µs)",
            ratio <= TARGET_OUTSIDE_VS_ECHO,
            f"per request, by process: {where}; the echo only receives and republishes "
            "(one callback, one publish), the hub also decodes and checks the frame, "
            "passes the tensor to the executor and back through shared memory, and encodes "
            "the reply",
        ),
    ]


def _heavy_targets(
    at: dict[str, dict[str, Any]], sweep: dict[int, list[float]], best: int, stall: str
) -> list[dict[str, Any]]:
    ms_at_1 = 1e3 / statistics.median(sweep[1])
    gain = statistics.median(sweep[64]) / statistics.median(sweep[1])
    on, off, limit = at["heavy_mqtt"], at["heavy_mqtt_unbatched"], at["executor_heavy"]
    paho = at["heavy_mqtt_paho"]
    other = (
        f"; the same model on hub P (`--mqtt-client paho`): {paho['throughput']:.0f} req/s, "
        f"{paho['share_of_limit'] or 0:.0%}, batches of {paho['mean_batch'] or 0:.1f}"
    )
    batch = on["mean_batch"] or 1.0
    nearest, rate = _per_sample(sweep, batch)
    speedup = on["throughput"] / off["throughput"]
    share = on["share_of_limit"] or 0.0
    return [
        _target(
            "heavy model, executor alone: time per sample at batch 1",
            f">= {TARGET_HEAVY_MS_AT_1:.0f} ms",
            f"{ms_at_1:.2f} ms",
            ms_at_1 >= TARGET_HEAVY_MS_AT_1,
            "this CPU runs the model faster than it was sized for; raise "
            "`bench._heavy_model.HIDDEN`",
        ),
        _target(
            "heavy model, executor alone: samples/s at batch 64 against batch 1",
            f">= {TARGET_HEAVY_GAIN:.0f}x",
            f"{gain:.1f}x ({statistics.median(sweep[64]):.0f} vs "
            f"{statistics.median(sweep[1]):.0f} samples/s)",
            gain >= TARGET_HEAVY_GAIN,
            "the fully connected layer's weights fit this CPU's caches, so batch 1 is not "
            "memory-bound; a larger `HIDDEN` makes it so",
        ),
        _target(
            f"heavy model, {TARGET_AT} requesters: hub batching on vs off (MQTT)",
            f">= {TARGET_HEAVY_SPEEDUP:.0f}x",
            f"{speedup:.1f}x ({on['throughput']:.0f} vs {off['throughput']:.0f} req/s; "
            f"batch {on['mean_batch'] or 0:.1f} vs 1)",
            speedup >= TARGET_HEAVY_SPEEDUP,
            f"batches of {on['mean_batch'] or 0:.1f} on average; the hub's own work per "
            f"request ({describe_cores(on, per_request=True)}) shares the cores with the "
            f"model; {_closed_loop(on)}{other}",
        ),
        _target(
            f"heavy model, {TARGET_AT} requesters: hub against its executor alone at the "
            f"best batch ({best})",
            f">= {TARGET_HEAVY_SHARE:.0%}",
            f"{share:.0%} ({on['throughput']:.0f} req/s of {limit['throughput']:.0f} "
            f"samples/s in the same rounds; windows {on['throughput_min']:.0f} to "
            f"{on['throughput_max']:.0f})",
            share >= TARGET_HEAVY_SHARE,
            f"batch size: {TARGET_AT} requesters can never fill batches of {best} (at most "
            f"{TARGET_AT} wait at once); the hub formed batches of {batch:.1f}, at which the "
            f"executor alone computes about {rate:.0f} samples/s (batch {nearest} in its "
            f"sweep); {_closed_loop(on)}. Cores: {describe_cores(on, per_request=False)}, "
            f"broker {on['cores']['broker']:.2f}, load generator "
            f"{on['cores']['load generator']:.2f}; the executor alone used "
            f"{limit['cores']['server']:.2f} in its rounds{stall}{other}",
        ),
    ]


def _scaling_http_targets(
    at: dict[str, dict[str, Any]], load: dict[str, Any]
) -> list[dict[str, Any]]:
    one, two = at["hub_mqtt"], at["hub_mqtt_workers"]
    scaling = two["throughput"] / one["throughput"]
    h1, h2 = at["hub_http"], at["hub_http_workers"]
    best_http = max(h1["throughput"], h2["throughput"])
    want = TARGET_HTTP_GAIN * PREVIOUS_HTTP_REQ_S
    return [
        _target(
            f"tiny model, {TARGET_AT} requesters: --workers {WORKERS} vs --workers 1 (MQTT)",
            f">= {TARGET_SCALING}x",
            f"{scaling:.2f}x ({two['throughput']:.0f} vs {one['throughput']:.0f} req/s); "
            f"cores with 2: {describe_cores(two, per_request=False)}; with 1: "
            f"{describe_cores(one, per_request=False)}",
            scaling >= TARGET_SCALING,
            "cores: the machine has 2, shared by the executor, every ingress process, the "
            "broker and the load generator (and other jobs: load average "
            f"{load['before'][0]:.1f}); a second ingress process adds no core, only its "
            "share of the same two",
        ),
        _target(
            f"HTTP binary tensors, {TARGET_AT} connections, tiny model: against the "
            f"previous {PREVIOUS_HTTP_REQ_S:.0f} req/s",
            f">= {TARGET_HTTP_GAIN:.0f}x ({want:.0f} req/s)",
            f"{best_http / PREVIOUS_HTTP_REQ_S:.2f}x: --http-workers 1 {h1['throughput']:.0f} "
            f"req/s, --http-workers {WORKERS} {h2['throughput']:.0f} req/s",
            best_http >= want,
            f"one HTTP process: {describe_cores(h1, per_request=True)}; two: "
            f"{describe_cores(h2, per_request=True)}; the load generator (asyncio, one "
            f"process) used {h1['cores']['load generator']:.2f} cores",
        ),
    ]


def _memory_targets(mi: dict[str, Any]) -> list[dict[str, Any]]:
    mem, iso = mi["memory"], mi["isolation"]
    growth_x = mem["peak_growth_mib"] / mem["in_flight_mib"]
    idle, flood = iso["idle"], iso["flood"]
    p99_x = flood["p99_ms"] / idle["p99_ms"]
    body_mib = mem["body_bytes"] / 2**20
    http_cores = sum(v for k, v in flood["cores"].items() if k.startswith("http"))
    return [
        _target(
            f"{BODIES} JSON bodies of {body_mib:.1f} MiB at once (400 once parsed): growth "
            "of the hub's memory (PSS of every hub process) against the bytes in flight",
            f"<= {TARGET_MEMORY_X:.0f}x",
            f"{growth_x:.2f}x ({mem['peak_growth_mib']:.0f} MiB over "
            f"{mem['before_mib']:.0f} MiB for {mem['in_flight_mib']:.0f} MiB in flight; "
            f"statuses {sorted(mem['statuses'])})",
            growth_x <= TARGET_MEMORY_X,
            "the HTTP ingress holds more than a parsed copy per body",
        ),
        _target(
            "the same memory given back afterwards",
            f"growth <= {RETURNED_MIB:.0f} MiB",
            f"{mem['after_growth_mib']:+.1f} MiB, {mem['returned_in_s']:.1f} s after the "
            "last answer",
            mem["after_growth_mib"] <= RETURNED_MIB,
            "the allocator keeps freed pages",
        ),
        _target(
            f"MQTT offload p99 at {ISOLATION_REQUESTERS} requesters during a flood of those "
            "bodies over HTTP, against idle",
            f"<= {TARGET_FLOOD_P99_X:.0f}x",
            f"{p99_x:.2f}x ({flood['p99_ms']:.1f} vs {idle['p99_ms']:.1f} ms; p50 "
            f"{flood['p50_ms']:.1f} vs {idle['p50_ms']:.1f} ms; "
            f"{flood['bodies_answered']} bodies answered meanwhile, by status "
            f"{flood['bodies_statuses']})",
            p99_x <= TARGET_FLOOD_P99_X,
            f"CPU: the bodies (read, parsed or refused) kept the HTTP ingress at "
            f"{http_cores:.2f} cores of the 2 that the MQTT ingress, the executor, the broker "
            "and the load generator also need",
        ),
    ]
