"""(c) Hub throughput under dynamic batching: the multi-process hub against its bounds.

Two models. The demo's cloud CNN (``tandem.demo.models``, cached in
``~/.cache/tandem``; built through the demo's own code path if missing,
which takes minutes once) is tiny: ~50 µs per sample, so the hub's own
per-request work sets its throughput. The heavier CNN of
``bench._heavy_model`` (fixed random weights; throughput only) takes over a
millisecond per sample at batch 1 and gains several times from batching,
so it shows what batching is worth.

What runs, each variant in windows interleaved with the others
(``bench._hub_throughput_measure``):

* the limit: each model's ``OnnxExecutor`` alone in this process (the hub's
  own session options), swept over batch sizes, then re-measured at its best
  batch size in every round, because the machine's other load moves it;
* hub A, ``python -m cloud_hub --workers 1 --http-workers 1`` with four
  models: the tiny one with batching on (the defaults a user starts from,
  ``max_batch_size`` 64, ``max_queue_delay_ms`` 2) and off (``max_batch_size``
  1), the heavy one likewise; over MQTT (awscrt load generator; one row with
  the paho one) and over HTTP (binary tensors);
* hub W, ``--workers 2 --http-workers 2``, the tiny model batching, on a
  broker of its own: ingress scaling over MQTT, and HTTP with two processes;
* hub P, as hub A with both models batching but ``--mqtt-client paho``,
  under its own topic prefix on hub A's broker: the ingress's other client;
* bare echo consumers on hub A's broker, under their own topic prefixes:
  awscrt's MQTT 5 client (the hub ingress's) and paho, each republishing the
  request frame to the device's reply topic (``bench._baselines``);
* a plain FastAPI + ONNX Runtime server, one request per run, JSON lists;
* the hub's ``DynamicBatcher`` in this process, fed by asyncio tasks;
* then, on hub A: four 15 MiB JSON bodies at once (memory) and MQTT latency
  idle against during a flood of them (``bench._hub_throughput_memory``);
* the GPU entry (``bench._hub_throughput_gpu``), or why it was skipped.

Requesters: MQTT through a few clients, each a device on its own topics
(``bench._load_mqtt``); HTTP through N keep-alive connections on one
asyncio loop (``bench._load``). CPU per process comes from /proc; with
py-spy installed, hub A's MQTT ingress is sampled at 64 requesters.
``TANDEM_BENCH_QUICK=1`` runs short windows once each (for development).
The settings are in ``bench._hub_throughput_settings``, the targets and the
result in ``bench._hub_throughput_report``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._heavy_model import heavy_model
from ._hub_throughput_gpu import gpu_entry
from ._hub_throughput_measure import (
    Variant,
    executor_sweep,
    executor_window,
    hub_counts,
    measure,
)
from ._hub_throughput_memory import memory_and_isolation
from ._hub_throughput_report import build_result
from ._hub_throughput_settings import (
    BATCH_SIZE,
    BATCHED,
    CONCURRENCY,
    ISOLATION_ROUNDS,
    ISOLATION_WINDOW_S,
    QUEUE_DELAY_MS,
    REPEATS,
    SWEEP_ROUNDS,
    TARGET_AT,
    UNBATCHED,
    WARM_S,
    WINDOW_S,
    WORKERS,
)
from ._load import HttpLoad, InProcessLoad, Window, binary_infer_request
from ._load_mqtt import CrtMqttLoad, PahoMqttLoad
from ._procs import (
    BrokerProcess,
    EchoProcess,
    HubProcess,
    PlainServerProcess,
    hub_processes,
    write_model,
)
from ._pyspy import profile, profile_summary

__all__ = ["run"]

_PROFILE_S = 3.0
_ONLY_AT = (TARGET_AT,)  # the rows the issue asks for at 64 requesters only
_TIMES = (WARM_S, WINDOW_S)
_ECHO_CRT = "bench/echo-crt"  # the echo consumers' topic prefixes on hub A's broker
_ECHO_PAHO = "bench/echo-paho"
_PAHO_HUB = "bench/paho-hub"  # the topic prefix of the hub whose ingress uses paho


def run() -> dict[str, Any]:
    from tandem.demo.models import build_demo_models

    tiny = build_demo_models().cloud_onnx
    image = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-tp-") as tmp:
        work = Path(tmp)
        heavy = work / "heavy.onnx"
        heavy.write_bytes(heavy_model())
        models = {"cloud": tiny, "heavy": heavy}
        measured = _measure_all(work, models, image)
        measured["gpu"] = gpu_entry(
            models,
            measured["input_name"],
            image,
            work,
            rounds=SWEEP_ROUNDS,
            repeats=REPEATS,
            window_s=WINDOW_S,
            warm_s=WARM_S,
            hub_config=BATCHED,
        )
    measured["load"] = {"before": load_before, "after": os.getloadavg()}
    return build_result(measured)


@dataclass
class _Rig:
    """What runs while part c measures: brokers, hubs, baselines and their load generators."""

    broker: BrokerProcess
    hub: HubProcess
    broker_w: BrokerProcess
    hub_w: HubProcess
    hub_paho: HubProcess
    echo_crt: EchoProcess
    echo_paho: EchoProcess
    plain: PlainServerProcess
    loads: dict[str, Any] = field(default_factory=dict)
    http: dict[str, HttpLoad] = field(default_factory=dict)


@contextlib.contextmanager
def _rig(work: Path, models: dict[str, Path], feed: dict[str, np.ndarray]) -> Iterator[_Rig]:
    """Start everything (each stopped by its PID on the way out), load generators included."""
    for model, path in models.items():
        write_model(work / "a" / "repo", model, path, BATCHED)
        write_model(work / "a" / "repo", f"{model}_unbatched", path, UNBATCHED)
    write_model(work / "w" / "repo", "cloud", models["cloud"], BATCHED)
    write_model(work / "p" / "repo", "cloud", models["cloud"], BATCHED)
    write_model(work / "p" / "repo", "heavy", models["heavy"], BATCHED)
    (work / "echo").mkdir()
    one = ["--workers", "1", "--http-workers", "1"]
    two = ["--workers", str(WORKERS), "--http-workers", str(WORKERS)]
    paho = [*one, "--mqtt-client", "paho", "--prefix", _PAHO_HUB]
    with contextlib.ExitStack() as stack:
        up = stack.enter_context
        broker = up(BrokerProcess(work / "a").start())
        broker_w = up(BrokerProcess(work / "w").start())
        rig = _Rig(
            broker=broker,
            hub=up(HubProcess(work / "a" / "repo", broker.url, work / "a", args=one).start()),
            broker_w=broker_w,
            hub_w=up(HubProcess(work / "w" / "repo", broker_w.url, work / "w", args=two).start()),
            hub_paho=up(HubProcess(work / "p" / "repo", broker.url, work / "p", args=paho).start()),
            echo_crt=up(
                EchoProcess(
                    broker.url, f"{_ECHO_CRT}/dev/+/infer/+", "-", work / "echo", mode="echo-crt"
                ).start()
            ),
            echo_paho=up(
                EchoProcess(broker.url, f"{_ECHO_PAHO}/dev/+/infer/+", "-", work / "echo").start()
            ),
            plain=up(PlainServerProcess(models["cloud"], work).start()),
        )
        makers: dict[str, Callable[[], Any]] = {
            "a": lambda: CrtMqttLoad(broker.url, name="bench-a"),
            "a_paho": lambda: PahoMqttLoad(broker.url, name="bench-a-paho"),
            "w": lambda: CrtMqttLoad(broker_w.url, name="bench-w"),
            "p": lambda: CrtMqttLoad(broker.url, prefix=_PAHO_HUB, name="bench-p"),
            "echo_crt": lambda: CrtMqttLoad(broker.url, prefix=_ECHO_CRT, name="bench-e1"),
            "echo_paho": lambda: CrtMqttLoad(broker.url, prefix=_ECHO_PAHO, name="bench-e2"),
        }
        for key, make in makers.items():
            rig.loads[key] = load = make()
            stack.callback(load.close)
        ((name, image),) = feed.items()
        body, headers = binary_infer_request(name, image)
        rig.http = {
            "a": HttpLoad(rig.hub.http_port, "/v2/models/cloud/infer", body, headers),
            "w": HttpLoad(rig.hub_w.http_port, "/v2/models/cloud/infer", body, headers),
            "plain": HttpLoad(
                rig.plain.port,
                "/infer",
                json.dumps({"data": image.tolist()}).encode(),
                {"Content-Type": "application/json"},
            ),
        }
        yield rig


def _measure_all(work: Path, models: dict[str, Path], image: np.ndarray) -> dict[str, Any]:
    from cloud_hub import DynamicBatcher, OnnxExecutor, TensorSpec

    executors = {name: OnnxExecutor(path) for name, path in models.items()}
    spec = executors["cloud"].inputs[0]
    feed = {spec.name: image}
    try:
        expected = {m: next(iter(e.run(feed).values())) for m, e in executors.items()}
        swept = {m: executor_sweep(e, spec.name, SWEEP_ROUNDS) for m, e in executors.items()}
        sweeps = {m: rates for m, (rates, _cpu) in swept.items()}
        best = {m: max(s, key=lambda b: statistics.median(s[b])) for m, s in sweeps.items()}
        limits = {
            m: (e, {spec.name: np.repeat(image, best[m], axis=0)}) for m, e in executors.items()
        }
        batcher = DynamicBatcher(
            executors["cloud"],
            inputs=[TensorSpec(spec.name, spec.datatype, spec.shape[1:])],
            max_batch_size=BATCH_SIZE,
            max_queue_delay_ms=QUEUE_DELAY_MS,
            model="cloud",
        ).start()
        try:
            with _rig(work, models, feed) as rig:
                _check(rig, feed, expected)
                points = measure(_variants(rig, limits, batcher, feed), REPEATS)
                hub_profile = _profile(rig.hub.pid, rig.loads["a"], feed)
                isolation = memory_and_isolation(
                    hub_pid=rig.hub.pid,
                    http_port=rig.hub.http_port,
                    model="cloud",
                    input_name=spec.name,
                    feed=feed,
                    mqtt=rig.loads["a"],
                    window_s=ISOLATION_WINDOW_S,
                    rounds=ISOLATION_ROUNDS,
                )
                clients = {k: (v.client_kind, len(v.devices)) for k, v in rig.loads.items()}
        finally:
            batcher.stop()
    finally:
        for executor in executors.values():
            executor.close()
    return {
        "input_name": spec.name,
        "sweeps": sweeps,
        "sweep_cpu_us": {m: cpu for m, (_rates, cpu) in swept.items()},
        "best_batch": best,
        "points": points,
        "hub_profile": hub_profile,
        "memory_isolation": isolation,
        "load_clients": clients,
    }


def _variants(
    rig: _Rig,
    limits: dict[str, tuple[Any, dict[str, np.ndarray]]],
    batcher: Any,
    feed: dict[str, np.ndarray],
) -> dict[str, Variant]:
    """Every row family of part c: how it runs, at which requester counts, against what."""
    in_process = InProcessLoad(lambda: batcher.submit(feed))
    me = {"bench process": [os.getpid()]}
    loads, http = rig.loads, rig.http

    def mqtt(load: str, model: str) -> Callable[[int], Window]:
        return lambda n: loads[load].run(model, feed, n, *_TIMES)

    def alone(model: str) -> Variant:
        executor, batch = limits[model]
        return Variant(
            run=lambda n: executor_window(executor, batch, WINDOW_S),
            concurrency=CONCURRENCY if model == "cloud" else _ONLY_AT,
            processes=lambda: me,
            in_process=True,
        )

    def hub(on: HubProcess, model: str, run: Callable[[int], Window], at: Sequence[int]) -> Variant:
        return Variant(
            run=run,
            concurrency=at,
            processes=lambda: hub_processes(on.pid),
            broker=rig.broker_w.pid if on is rig.hub_w else rig.broker.pid,
            counter=lambda: hub_counts(on.http_port, model),
        )

    def echo(load: str, process: EchoProcess) -> Variant:
        return Variant(
            run=mqtt(load, "echo"),
            concurrency=_ONLY_AT,
            processes=lambda: {"echo": [process.pid]},
            broker=rig.broker.pid,
        )

    def batcher_counts() -> tuple[float, float]:
        stats = batcher.metrics.snapshot()
        return float(stats.rows), float(stats.batches)

    a, w, every = rig.hub, rig.hub_w, CONCURRENCY
    return {
        "executor": alone("cloud"),
        "batcher": Variant(
            run=lambda n: in_process.run(n, *_TIMES),
            concurrency=every,
            processes=lambda: me,
            in_process=True,
            counter=batcher_counts,
        ),
        "hub_mqtt": hub(a, "cloud", mqtt("a", "cloud"), every),
        "hub_mqtt_unbatched": hub(a, "cloud_unbatched", mqtt("a", "cloud_unbatched"), every),
        "hub_mqtt_workers": hub(w, "cloud", mqtt("w", "cloud"), every),
        "hub_mqtt_paho": hub(rig.hub_paho, "cloud", mqtt("p", "cloud"), (1, TARGET_AT)),
        "hub_http": hub(a, "cloud", lambda n: http["a"].run(n, *_TIMES), every),
        "plain_http": Variant(
            run=lambda n: http["plain"].run(n, *_TIMES),
            concurrency=every,
            processes=lambda: {"plain server": [rig.plain.pid]},
        ),
        "echo_crt": echo("echo_crt", rig.echo_crt),
        "echo_paho": echo("echo_paho", rig.echo_paho),
        "hub_mqtt_paho_load": hub(a, "cloud", mqtt("a_paho", "cloud"), _ONLY_AT),
        "hub_http_workers": hub(w, "cloud", lambda n: http["w"].run(n, *_TIMES), _ONLY_AT),
        "executor_heavy": alone("heavy"),
        "heavy_mqtt": hub(a, "heavy", mqtt("a", "heavy"), _ONLY_AT),
        "heavy_mqtt_unbatched": hub(a, "heavy_unbatched", mqtt("a", "heavy_unbatched"), _ONLY_AT),
        "heavy_mqtt_paho": hub(rig.hub_paho, "heavy", mqtt("p", "heavy"), _ONLY_AT),
    }


def _check(rig: _Rig, feed: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Every variant answers, and the hubs compute what the executor alone computes."""
    asks = [("a", m) for m in ("cloud", "cloud_unbatched", "heavy", "heavy_unbatched")]
    asks += [("a_paho", "cloud"), ("w", "cloud"), ("p", "cloud"), ("p", "heavy")]
    asks += [("echo_crt", "echo"), ("echo_paho", "echo")]
    for load, model in asks:
        window = rig.loads[load].run(model, feed, 1, 0.0, 0.3)
        if window.errors or not window.latencies_ms:
            raise RuntimeError(f"no answer from {model} over MQTT ({load}): {window}")
    ((input_name, image),) = feed.items()
    body, headers = binary_infer_request(input_name, image)
    asked = [(rig.hub, model) for model in expected] + [(rig.hub_w, "cloud")]
    for hub, model in asked:
        want = expected[model]
        got = HttpLoad(hub.http_port, f"/v2/models/{model}/infer", body, headers).one()
        tail = np.frombuffer(got, np.float32, offset=len(got) - want.nbytes)
        np.testing.assert_allclose(tail.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    plain = np.asarray(json.loads(rig.http["plain"].one())["outputs"], np.float32)
    np.testing.assert_allclose(plain, expected["cloud"], rtol=1e-4, atol=1e-4)


def _profile(hub_pid: int, load: Any, feed: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """py-spy on hub A's MQTT ingress process at the target load, if py-spy is installed."""
    ingress = hub_processes(hub_pid).get("mqtt 0")
    if not ingress:
        return None
    spy = profile(ingress[0], _PROFILE_S)
    window = load.run("cloud", feed, TARGET_AT, 0.5, _PROFILE_S + 0.5)
    summary = profile_summary(spy) if spy is not None else None
    if summary is not None:
        summary["requests_per_s"] = window.throughput
    return summary
