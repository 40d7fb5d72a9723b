"""(d) Edge overhead: what the agent adds on top of the runtime it wraps.

* Per call: ``EdgeAgent.infer`` on the local path (``always_local``, no
  broker) against a raw ``onnxruntime.InferenceSession.run`` of the same
  INT8 model with the same session options, batch 1. Calls alternate
  raw/agent (order flipped every pair) so drift hits both alike; each round
  gives median(agent) - median(raw); the figure is the median over rounds,
  spread as the IQR over rounds. Two more interleavings put the figure in
  context: ``agent.runtime.run`` (the runtime wrapper alone) and the C++
  ``run`` under ``session.run`` (``session._sess.run``), which is what the
  agent's ONNX runtime calls once ``validate`` has made the checks the
  Python ``session.run`` makes; the agent's own Python work is therefore
  "agent added" minus "C++ run added" (the latter is negative). The agent
  measured runs with tracing off (``tracing=False``: the default when no
  ``OTEL_*`` variable asks for it); one more interleaving times an agent
  with tracing on, every call's spans exported over OTLP/HTTP to a loopback
  receiver in another process (``bench._procs.OtlpSinkProcess``).
* Import: fresh interpreters timing ``import onnxruntime`` and
  ``import onnxruntime, edge_agent``; the difference is the agent's own.
* Memory: a fresh interpreter loads the agent with the model, runs 100
  calls and reads VmRSS / VmHWM from /proc/self/status.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["run"]

TARGET_ADDED_US = 25.0
TARGET_RSS_MB = 80.0
TARGET_IMPORT_S = 0.5
_ROUNDS = 9
_CALLS_PER_ROUND = 2000
_IMPORT_REPEATS = 7
_SAMPLE_RATIO = 0.01  # the sampled traced agent's share of recorded calls
_REPO = Path(__file__).resolve().parent.parent


def run() -> dict[str, Any]:
    import onnxruntime as ort

    from edge_agent import EdgeAgent, OffloadPolicy
    from tandem.demo.data import load_digit_splits
    from tandem.demo.models import build_demo_models

    model = build_demo_models().edge_int8_onnx
    image = np.ascontiguousarray(load_digit_splits().test_images[:1])

    # The agent's ONNX runtime builds its session this way (edge_agent/runtimes/_onnx.py):
    # matching it keeps the comparison about the Python layer, not about thread pools.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: image}
    agent = EdgeAgent(
        str(model), device_id="bench", policy=OffloadPolicy.always_local(), tracing=False
    )
    runtime = agent.runtime
    assert runtime is not None

    def raw() -> None:
        session.run(None, feed)

    def wrapped_runtime() -> None:
        runtime.run(feed)

    def agent_call() -> None:
        agent.infer(image)

    cxx = session._sess  # what InferenceSession.run calls after its Python-side checks
    output_names = [o.name for o in session.get_outputs()]

    def cxx_run() -> None:
        cxx.run(output_names, feed, None)

    for fn in (raw, wrapped_runtime, agent_call, cxx_run):
        for _ in range(300):
            fn()
    # Same model, same answer: otherwise the comparison would time different work.
    got = next(iter(agent.infer(image).outputs.values()))
    np.testing.assert_allclose(got, session.run(None, feed)[0], rtol=1e-6)

    rounds = {
        "agent": _interleaved(raw, agent_call),
        "runtime": _interleaved(raw, wrapped_runtime),
        "cxx_run": _interleaved(raw, cxx_run),
    }
    added = {k: [r["added_us"] for r in v] for k, v in rounds.items()}
    raw_us = [r["raw_us"] for r in rounds["agent"]]
    agent_us = [r["other_us"] for r in rounds["agent"]]
    added_us = statistics.median(added["agent"])

    rounds |= _traced_rounds(model, image, raw)
    added["traced"] = [r["added_us"] for r in rounds["traced"]]
    added["sampled"] = [r["added_us"] for r in rounds["sampled"]]
    profile = _profile(agent_call)
    agent.close()

    imports = _import_times()
    memory = _memory(model)
    tflite = _tflite(model)
    return _result(raw_us, agent_us, added, added_us, profile, imports, memory, tflite)


def _traced_rounds(model: Path, image: np.ndarray, raw: Any) -> dict[str, list[dict[str, float]]]:
    """Raw/agent interleavings with tracing on, every call recorded ("traced") and one in
    a hundred ("sampled"): spans exported to a loopback receiver in another process."""
    from bench._procs import OtlpSinkProcess
    from edge_agent import EdgeAgent, OffloadPolicy
    from shared import TracingSettings

    out = {}
    with tempfile.TemporaryDirectory() as work:
        sink = OtlpSinkProcess(Path(work)).start()
        try:
            for name, ratio in (("traced", None), ("sampled", _SAMPLE_RATIO)):
                traced = EdgeAgent(
                    str(model),
                    device_id=f"bench-{name}",
                    policy=OffloadPolicy.always_local(),
                    tracing=TracingSettings(endpoint=sink.url, sample_ratio=ratio),
                )

                def traced_call(agent: EdgeAgent = traced) -> None:
                    agent.infer(image)

                for _ in range(300):
                    traced_call()
                out[name] = _interleaved(raw, traced_call)
                traced.close()
        finally:
            sink.stop()
    return out


def _interleaved(base: Any, other: Any) -> list[dict[str, float]]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(_ROUNDS):
        a = np.empty(_CALLS_PER_ROUND)
        b = np.empty(_CALLS_PER_ROUND)
        for i in range(_CALLS_PER_ROUND):
            first, second = (base, other) if i % 2 == 0 else (other, base)
            t0 = clock()
            first()
            t1 = clock()
            second()
            t2 = clock()
            if i % 2 == 0:
                a[i], b[i] = t1 - t0, t2 - t1
            else:
                b[i], a[i] = t1 - t0, t2 - t1
        raw_med, other_med = float(np.median(a)) / 1e3, float(np.median(b)) / 1e3
        out.append({"raw_us": raw_med, "other_us": other_med, "added_us": other_med - raw_med})
    return out


def _profile(fn: Any, calls: int = 5000) -> list[dict[str, Any]]:
    """Where an agent call spends its time, by own time per function (cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).parent.name}/{Path(file).name}:{line}({func})"
                if file != "~"
                else func,
                "calls_per_infer": ncalls / calls,
                "own_us_per_infer": tottime / calls * 1e6,
                "cumulative_us_per_infer": cumtime / calls * 1e6,
            }
        )
    rows.sort(key=lambda r: -r["own_us_per_infer"])
    return rows[:12]


def _python(code: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=_REPO, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


_TIME_IMPORT = """
import json, time
t = time.perf_counter()
{imports}
print(json.dumps({{"s": time.perf_counter() - t}}))
"""


def _import_times() -> dict[str, Any]:
    base, both = [], []
    for _ in range(_IMPORT_REPEATS):  # alternate, so disk-cache warmth favours neither
        base.append(_python(_TIME_IMPORT.format(imports="import onnxruntime"))["s"])
        both.append(_python(_TIME_IMPORT.format(imports="import onnxruntime, edge_agent"))["s"])
    alone = [_python(_TIME_IMPORT.format(imports="import edge_agent"))["s"] for _ in range(3)]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import onnxruntime; import edge_agent"],
        capture_output=True,
        text=True,
        cwd=_REPO,
        check=True,
    )
    return {
        "onnxruntime_s": statistics.median(base),
        "onnxruntime_and_agent_s": statistics.median(both),
        "agent_beyond_runtime_s": statistics.median(both) - statistics.median(base),
        "edge_agent_alone_s": statistics.median(alone),
        "top_after_runtime": _importtime_top(done.stderr),
    }


def _importtime_top(stderr: str, after: str = "onnxruntime", n: int = 8) -> list[list[Any]]:
    """Largest self times among modules imported once onnxruntime is in (the agent's)."""
    rows: list[list[Any]] = []
    seen = False
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = (p.strip() for p in line[len("import time:") :].split("|"))
        if seen:
            rows.append([name.strip(), int(self_us), int(cum_us)])
        if name.strip() == after:
            seen = True
    rows.sort(key=lambda r: -r[1])
    return rows[:n]


_MEMORY = """
import json, numpy as np
def status():
    return {{l.split(':')[0]: int(l.split()[1]) / 1024 for l in open('/proc/self/status')
             if l.startswith(('VmRSS', 'VmHWM'))}}
start = status()
{load}
x = np.zeros((1, 1, 28, 28), np.float32)
for _ in range(100):
    {call}
end = status()
print(json.dumps({{"start_mb": start["VmRSS"], "rss_mb": end["VmRSS"], "peak_mb": end["VmHWM"]}}))
"""


def _memory(model: Path) -> dict[str, Any]:
    agent = _python(
        _MEMORY.format(
            load="from edge_agent import EdgeAgent, OffloadPolicy\n"
            f"agent = EdgeAgent({str(model)!r}, device_id='m', "
            "policy=OffloadPolicy.always_local())",
            call="agent.infer(x)",
        )
    )
    raw = _python(
        _MEMORY.format(
            load=f"import onnxruntime as ort\ns = ort.InferenceSession({str(model)!r})\n"
            "name = s.get_inputs()[0].name",
            call="s.run(None, {name: x})",
        )
    )
    return {"agent": agent, "raw_onnxruntime": raw}


def _tflite(model: Path) -> dict[str, Any]:
    candidates = sorted(model.parent.glob("*.tflite"))
    if not candidates:
        return {
            "skipped": (
                "no .tflite of the edge model exists: the demo's pipeline exports ONNX only, and "
                "converting needs ai-edge-torch or TensorFlow, neither installed here"
            )
        }
    return {"skipped": f"found {candidates[0].name}, but this part does not time TFLite yet"}


def _fixes(profile: list[dict[str, Any]], met: bool) -> list[str]:
    """Fixes the profile points at (not applied: bench/ does not change the agent)."""
    if met:
        return []
    by_name = {r["function"].rsplit("(", 1)[-1].rstrip(")"): r for r in profile}
    fixes = []
    validate = by_name.get("validate")
    if validate and validate["calls_per_infer"] >= 2:
        fixes.append(
            "Suggested fix: `ModelRuntime.validate` runs twice per call (the agent checks the "
            "request in `_begin`, then `runtime.run` checks it again); let the agent call a "
            "no-check run on inputs it has validated."
        )
    if "__init__" in by_name and "uuid" in by_name["__init__"]["function"]:
        fixes.append(
            "Suggested fix: a `uuid.UUID` is built for every local request; a per-agent "
            "counter (or an id made only when a request leaves the device) avoids it."
        )
    fixes.append(
        "What is left per local call: building the three objects a call needs (the call "
        "state, `LatencyBreakdown`, `InferenceResult`: about a fifth of the Python opcodes), "
        "one lock for the counters, three ring-buffer appends, the latency estimator's "
        "update and the request id. Below that, the remaining lever is a leaner result "
        "(no per-call `LatencyBreakdown` object) — an API change, not taken."
    )
    return fixes


def _rounds_table(
    raw_us: list[float], agent_us: list[float], added: dict[str, list[float]]
) -> list[list[Any]]:
    columns = zip(
        raw_us,
        agent_us,
        added["agent"],
        added["runtime"],
        added["cxx_run"],
        added["traced"],
        strict=True,
    )
    return [[i + 1, *(f"{v:.1f}" for v in values)] for i, values in enumerate(columns)]


def _tracing_table(added: dict[str, list[float]], iqr: Any) -> dict[str, Any]:
    """The agent's added time with tracing off (the targets' agent) and on."""
    return {
        "title": "Tracing off and on (agent added per local call, median over rounds, µs)",
        "columns": ["agent", "added µs", "IQR"],
        "rows": [
            [
                "tracing off (`tracing=False`, as with no `OTEL_*` variable set)",
                f"{statistics.median(added['agent']):.1f}",
                iqr(added["agent"]),
            ],
            [
                "tracing on: spans `tandem.infer`, `tandem.decision`, `tandem.local_run` per "
                "call, BatchSpanProcessor, OTLP/HTTP to a loopback receiver",
                f"{statistics.median(added['traced']):.1f}",
                iqr(added["traced"]),
            ],
            [
                f"tracing on, `sample_ratio={_SAMPLE_RATIO}`: the calls left out build their "
                "root span only",
                f"{statistics.median(added['sampled']):.1f}",
                iqr(added["sampled"]),
            ],
        ],
    }


def _result(
    raw_us: list[float],
    agent_us: list[float],
    added: dict[str, list[float]],
    added_us: float,
    profile: list[dict[str, Any]],
    imports: dict[str, Any],
    memory: dict[str, Any],
    tflite: dict[str, Any],
) -> dict[str, Any]:
    def iqr(values: list[float]) -> str:
        q1, _, q3 = statistics.quantiles(values, n=4)
        return f"{q1:.1f} to {q3:.1f}"

    met_call = added_us <= TARGET_ADDED_US
    cxx_us = statistics.median(added["cxx_run"])  # negative: what session.run's Python costs
    python_side = [r for r in profile if "onnxruntime" not in r["function"]]
    top = ", ".join(f"{r['function']} {r['own_us_per_infer']:.1f} µs" for r in python_side[:4])
    rss = memory["agent"]["rss_mb"]
    beyond = imports["agent_beyond_runtime_s"]
    slow_imports = ", ".join(
        f"{n} {s / 1e3:.0f} ms" for n, s, _ in imports["top_after_runtime"][:3]
    )
    targets = [
        {
            "name": "added per local call (median over rounds, IQR)",
            "target": f"<= {TARGET_ADDED_US:.0f} µs",
            "measured": f"{added_us:.1f} µs (IQR {iqr(added['agent'])}) on a raw "
            f"{statistics.median(raw_us):.1f} µs",
            "met": met_call,
            "limited_by": None if met_call else f"Python work per call; largest own times: {top}",
        },
        {
            "name": "resident memory, agent + model after 100 calls",
            "target": f"<= {TARGET_RSS_MB:.0f} MB",
            "measured": f"{rss:.1f} MB (peak {memory['agent']['peak_mb']:.1f}; raw onnxruntime "
            f"{memory['raw_onnxruntime']['rss_mb']:.1f})",
            "met": rss <= TARGET_RSS_MB,
            "limited_by": None
            if rss <= TARGET_RSS_MB
            else "onnxruntime and numpy dominate; compare with the raw-onnxruntime process",
        },
        {
            "name": "import time beyond onnxruntime's own",
            "target": f"<= {TARGET_IMPORT_S} s",
            "measured": f"{beyond:.3f} s (onnxruntime alone {imports['onnxruntime_s']:.3f} s)",
            "met": beyond <= TARGET_IMPORT_S,
            "limited_by": None if beyond <= TARGET_IMPORT_S else f"slowest: {slow_imports}",
        },
        {
            "name": "TFLite invoke overhead",
            "target": f"<= {TARGET_ADDED_US:.0f} µs",
            "measured": tflite["skipped"],
            "met": None,
            "limited_by": None,
        },
    ]
    rounds_table = _rounds_table(raw_us, agent_us, added)
    traced_us = statistics.median(added["traced"])
    return {
        "title": "(d) Edge overhead",
        "summary": (
            f"The demo's INT8 edge model, batch 1, {_ROUNDS} rounds of {_CALLS_PER_ROUND} "
            "interleaved raw/agent call pairs. The runtime wrapper alone (`agent.runtime.run`) "
            f"adds {statistics.median(added['runtime']):.1f} µs: it calls the C++ `run` under "
            "`session.run` directly, skipping the Python-side input checks that its own "
            "`validate` has already made, which alone is "
            f"{-cxx_us:.1f} µs faster than `session.run`. Measured from that C++ call "
            "(a difference of two interleavings' medians, so rougher), the agent's own work "
            f"(validation, routing, result, telemetry) is about {added_us - cxx_us:.0f} µs. "
            f"With tracing on (every call's three spans exported over OTLP/HTTP to a loopback "
            f"receiver) the agent adds {traced_us:.1f} µs (IQR {iqr(added['traced'])}); "
            f"recording one call in {1 / _SAMPLE_RATIO:.0f}, "
            f"{statistics.median(added['sampled']):.1f} µs."
        ),
        "targets": targets,
        "tables": [
            {
                "title": "Per round (medians, µs)",
                "columns": [
                    "round",
                    "raw session.run",
                    "agent.infer",
                    "agent added",
                    "runtime wrapper added",
                    "C++ run added",
                    "agent traced added",
                ],
                "rows": rounds_table,
            },
            _tracing_table(added, iqr),
            {
                "title": "Where an agent call spends its time (cProfile, own time per infer; "
                "the profiler inflates absolute figures, read them as shares)",
                "columns": ["function", "calls / infer", "own µs / infer", "cumulative µs / infer"],
                "rows": [
                    [
                        f"`{r['function']}`",
                        f"{r['calls_per_infer']:.0f}",
                        f"{r['own_us_per_infer']:.1f}",
                        f"{r['cumulative_us_per_infer']:.1f}",
                    ]
                    for r in profile
                ],
            },
            {
                "title": "Slowest imports the agent adds (python -X importtime, self time)",
                "columns": ["module", "self ms", "cumulative ms"],
                "rows": [
                    [f"`{n}`", f"{s / 1e3:.1f}", f"{c / 1e3:.1f}"]
                    for n, s, c in imports["top_after_runtime"]
                ],
            },
        ],
        "plots": [],
        "notes": [
            *_fixes(profile, met_call),
            "The agent's ONNX runtime calls `InferenceSession`'s C++ `run` (`session._sess`, "
            "onnxruntime's attribute, not public API) once its own `validate` has checked "
            "names, dtypes and shapes; an execution-provider failure still goes through "
            "`session.run` for onnxruntime's provider fallback, and an onnxruntime without "
            "`_sess` gets the public call. The saving is real per-call work, but it is "
            "onnxruntime's, not the agent's: the agent's own cost is in the summary.",
            "The box is shared and noisy (raw session.run medians move between rounds); the "
            "interleaving makes both sides see the same noise, and the profiler agrees on "
            "where the added time goes. Profiled with cProfile rather than py-spy: "
            "deterministic per-function counts need no ptrace permission.",
            f"Import times are medians of {_IMPORT_REPEATS} fresh interpreters each; "
            f"`import edge_agent` alone (it does not import onnxruntime until a model loads) "
            f"takes {imports['edge_agent_alone_s']:.3f} s.",
            f"TFLite: skipped — {tflite['skipped']}.",
            "Tracing: the agent measured for the targets runs with tracing off, the default "
            "when no `OTEL_*` variable asks for it; its only tracing work per call is one "
            "`is None` check (docs/tracing.md). The traced agent is the SDK's cost: three "
            "spans built per call and the BatchSpanProcessor's thread encoding and posting "
            "them (it shares the GIL with the calls); a sampler "
            "(`OTEL_TRACES_SAMPLER=parentbased_traceidratio`) makes unsampled calls cheap.",
        ],
        "data": {
            "raw_us": raw_us,
            "agent_us": agent_us,
            "added_us": added,
            "profile": profile,
            "imports": imports,
            "memory": memory,
            "tflite": tflite,
        },
    }
