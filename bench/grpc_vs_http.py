"""(c2) The hub's KServe v2 gRPC API against its HTTP API with binary tensors (issue 24 item 1).

One multi-process hub (``python -m cloud_hub --workers 1 --http-workers 1
--grpc-port P``: one HTTP ingress process serving both protocols, one
executor) with one small model: ``logits = x @ W + b`` over a 28x28 FP32
image (3 KiB in, 40 bytes out; ~10 µs of compute per row), batching with the
hub's defaults (``max_batch_size`` 64, ``max_queue_delay_ms`` 2), so the
protocols' own per-request work is what differs. Before measuring, one
request over each protocol must give the same logits.

Load, closed loop, from this process: HTTP through N keep-alive HTTP/1.1
connections posting a prepared binary-tensor body (``bench._load.HttpLoad``,
what part c uses for "HTTP binary"); gRPC through N channels, each its own
TCP connection, calling ModelInfer with a prepared serialized request, input
in ``raw_input_contents`` as ``tritonclient.grpc`` sends it
(``bench._load_grpc.GrpcLoad``). A second hub, the same but without
``--grpc-port``, answers the same HTTP load: what turning gRPC on costs the
HTTP path. N is 1 and 64. Every round runs the six points, interleaved (the
order alternates between rounds);
figures are the medians over rounds. The hub's CPU (all its processes, from
/proc) and of its ingress process over each point's whole run, divided by the
answers of that run, give their CPU per request: what the protocol costs the
server, whatever the client costs. No target is set: the figures are reported.

``TANDEM_BENCH_QUICK=1``: one short round.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._load import HttpLoad, Window, binary_infer_request
from ._load_grpc import GrpcLoad, infer_request_bytes
from ._procs import (
    BrokerProcess,
    HubProcess,
    cpu_ns,
    free_port,
    hub_processes,
    tree_cpu_ns,
    write_model,
)

__all__ = ["run"]

QUICK = os.environ.get("TANDEM_BENCH_QUICK") == "1"
ROUNDS = 1 if QUICK else 9
WARM_S = 0.3 if QUICK else 0.5
WINDOW_S = 0.5 if QUICK else 2.0
CONNECTIONS = (1, 64)
CONFIG = {"max_batch_size": 64, "max_queue_delay_ms": 2}
MODEL = "tiny"
INPUT = "x"
PROTOCOLS = ("http", "grpc", "http-alone")  # http-alone: a second hub, without --grpc-port
_LABELS = {
    "http": "HTTP binary tensors",
    "grpc": "gRPC (raw_input_contents)",
    "http-alone": "HTTP binary, hub without gRPC",
}


def run() -> dict[str, Any]:
    image = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-grpc-") as tmp:
        work = Path(tmp)
        repo = work / "repo"
        write_model(repo, MODEL, _tiny_model(), CONFIG)
        grpc_port = free_port()
        args = ["--workers", "1", "--http-workers", "1"]
        with (
            BrokerProcess(work).start() as broker,
            HubProcess(
                repo, broker_url := f"mqtt://127.0.0.1:{broker.port}", work,
                args=[*args, "--grpc-port", str(grpc_port)],
            ).start() as hub,
            HubProcess(repo, broker_url, work, args=args).start() as alone,
        ):  # fmt: skip
            target = f"127.0.0.1:{grpc_port}"
            _wait_grpc_ready(target)
            body, headers = binary_infer_request(INPUT, image)
            path = f"/v2/models/{MODEL}/infer"
            loads = {
                "http": (HttpLoad(hub.http_port, path, body, headers), hub.pid),
                "grpc": (GrpcLoad(target, infer_request_bytes(MODEL, INPUT, image)), hub.pid),
                "http-alone": (HttpLoad(alone.http_port, path, body, headers), alone.pid),
            }
            checked = _check_same_answer(hub.http_port, target, image)
            points = _measure(loads)
    return _result(points, checked, load_before, os.getloadavg())


def _tiny_model() -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    weight = rng.normal(size=(784, 10)).astype(np.float32) / 28.0
    bias = rng.normal(size=(10,)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "flat"], ["rows"]),
            helper.make_node("MatMul", ["rows", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(bias, "b"),
            numpy_helper.from_array(np.array([-1, 784], dtype=np.int64), "flat"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def _wait_grpc_ready(target: str, timeout_s: float = 60.0) -> None:
    import tritonclient.grpc as tritongrpc

    client = tritongrpc.InferenceServerClient(target)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                if client.is_server_ready():
                    return
            except tritongrpc.InferenceServerException:
                pass
            time.sleep(0.1)
    finally:
        client.close()
    raise TimeoutError(f"the hub's gRPC API on {target} was not ready within {timeout_s} s")


def _check_same_answer(http_port: int, target: str, image: np.ndarray) -> bool:
    """One request each way, with Triton's clients: the logits must be equal."""
    import tritonclient.grpc as tritongrpc
    import tritonclient.http as tritonhttp

    answers = []
    for module, url in ((tritonhttp, f"127.0.0.1:{http_port}"), (tritongrpc, target)):
        client = module.InferenceServerClient(url)
        try:
            tensor = module.InferInput(INPUT, list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            answers.append(client.infer(MODEL, [tensor]).as_numpy("logits"))
        finally:
            client.close()
    if not np.array_equal(answers[0], answers[1]):
        raise AssertionError(f"gRPC and HTTP answer differently: {answers}")
    return True


def _measure(loads: dict[str, tuple[Any, int]]) -> dict[str, list[dict[str, float]]]:
    """Every point in every round; ``loads``: protocol -> (load, the hub's supervisor PID)."""
    points: dict[str, list[dict[str, float]]] = {
        f"{p}@{n}": [] for p in PROTOCOLS for n in CONNECTIONS
    }
    ingresses = {pid: hub_processes(pid)["http 0"][0] for _, pid in loads.values()}
    for round_ in range(ROUNDS):
        order = PROTOCOLS if round_ % 2 == 0 else PROTOCOLS[::-1]
        for n in CONNECTIONS:
            for protocol in order:
                load, hub_pid = loads[protocol]
                ingress = ingresses[hub_pid]  # with --grpc-port: serves both protocols
                cpu0, ingress0 = tree_cpu_ns(hub_pid), cpu_ns(ingress)
                window: Window = load.run(n, WARM_S, WINDOW_S)
                cpu, ingress_cpu = tree_cpu_ns(hub_pid) - cpu0, cpu_ns(ingress) - ingress0
                answered = max(1, window.answered)
                latencies = sorted(window.latencies_ms)
                points[f"{protocol}@{n}"].append(
                    {
                        "req_s": window.throughput,
                        "p50_ms": _quantile(latencies, 0.50),
                        "p99_ms": _quantile(latencies, 0.99),
                        "errors": window.errors,
                        "hub_cpu_us_per_request": cpu / 1e3 / answered,
                        "ingress_cpu_us_per_request": ingress_cpu / 1e3 / answered,
                    }
                )
    return points


def _quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _median(points: list[dict[str, float]], key: str) -> float:
    return statistics.median(p[key] for p in points)


def _result(
    points: dict[str, list[dict[str, float]]],
    checked: bool,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    rows = []
    for n in CONNECTIONS:
        for protocol in PROTOCOLS:
            runs = points[f"{protocol}@{n}"]
            rows.append([
                _LABELS[protocol],
                n,
                f"{_median(runs, 'req_s'):.0f}",
                f"{min(r['req_s'] for r in runs):.0f}-{max(r['req_s'] for r in runs):.0f}",
                f"{_median(runs, 'p50_ms'):.2f}",
                f"{_median(runs, 'p99_ms'):.2f}",
                f"{_median(runs, 'ingress_cpu_us_per_request'):.0f}",
                f"{_median(runs, 'hub_cpu_us_per_request'):.0f}",
                sum(int(r["errors"]) for r in runs),
            ])  # fmt: skip
    ratios = []  # no target is set: the ratios are reported in a table, not as targets
    for a, b, what in (
        ("grpc", "http", "gRPC / HTTP binary, one hub"),
        ("http", "http-alone", "HTTP binary, hub with gRPC on / without"),
    ):
        for n in CONNECTIONS:
            rate_a, rate_b = (_median(points[f"{p}@{n}"], "req_s") for p in (a, b))
            cpu_a, cpu_b = (
                _median(points[f"{p}@{n}"], "ingress_cpu_us_per_request") for p in (a, b)
            )
            ratios.append(
                [
                    what,
                    n,
                    f"{rate_a / rate_b:.2f}x",
                    f"{rate_a:.0f} vs {rate_b:.0f}",
                    f"{cpu_a:.0f} vs {cpu_b:.0f}",
                ]
            )
    return {
        "part": "grpc",
        "title": "(c2) Hub: KServe v2 gRPC against HTTP binary tensors",
        "summary": (
            "python -m cloud_hub --workers 1 --http-workers 1 --grpc-port: one HTTP ingress "
            "process serving both protocols, one executor process (and a second hub without "
            "--grpc-port, for HTTP alone); a linear model over a "
            f"28x28 FP32 image, max_batch_size {CONFIG['max_batch_size']}, max_queue_delay_ms "
            f"{CONFIG['max_queue_delay_ms']}. Closed-loop load from one process on the same "
            f"machine; {ROUNDS} rounds of {WINDOW_S:g} s windows (after {WARM_S:g} s warm-up), "
            "protocols interleaved, medians over rounds. Both protocols gave the same logits "
            f"for the same image: {checked}."
        ),
        "targets": [],
        "tables": [
            {
                "title": "Throughput ratios (medians of rounds; no target is set)",
                "columns": [
                    "comparison",
                    "connections",
                    "req/s ratio",
                    "req/s",
                    "ingress CPU µs/request",
                ],
                "rows": ratios,
            },
            {
                "title": "Per protocol and connections (median of rounds)",
                "columns": [
                    "protocol",
                    "connections",
                    "req/s",
                    "req/s, rounds' range",
                    "p50 ms",
                    "p99 ms",
                    "ingress CPU µs/request",
                    "hub CPU µs/request",
                    "errors",
                ],
                "rows": rows,
            },
        ],
        "plots": [],
        "notes": [
            "The load generator shares the machine's cores with the hub; grpc.aio's client "
            "costs more per call than the hand-rolled HTTP/1.1 client, so at 64 connections "
            "the client can bound gRPC's figure before the hub does. CPU per request is the "
            "server-side comparison: of the HTTP ingress process (which serves both protocols), "
            "and of the whole hub (its idle polling included, so higher at low rates).",
            f"Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, on "
            f"{os.cpu_count()} cores shared with other work: the rounds' range shows how far "
            "one window's figure moves; ratios inside that spread are not differences.",
        ],
        "data": {"points": points, "load_before": load_before, "load_after": load_after},
    }


if __name__ == "__main__":
    from ._report import publish

    raise SystemExit(publish(run))
