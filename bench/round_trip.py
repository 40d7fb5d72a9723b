"""(b) Offload round trip: ``EdgeAgent.infer`` -> Mosquitto -> hub -> answer, on loopback.

The cloud model is an ONNX ``Identity`` on float32[n, 768] (3 KB in, 3 KB
out), made here with ``onnx.helper``, so the transport dominates. The bench
starts its own Mosquitto (``set_tcp_nodelay true``) on a free port, the hub
as users start it (``python -m cloud_hub --repo ... --http-port ...``) with
the model's ``max_queue_delay_ms`` at 0 (a latency setting: a lone request
is dispatched at once instead of waiting for company), and the baselines:

* bare echo: a paho-mqtt client in its own process republishes each request
  frame (the agent's own 3 KB frame) to a reply topic, QoS 1 both ways; the
  requester here times publish -> reply. The limit of this stack.
* the hub's own HTTP API (Open Inference Protocol v2 ``/infer``), one
  keep-alive ``http.client`` connection, with binary tensors (Triton's
  binary tensor data extension, both ways) and with JSON tensors.
* plain JSON-over-HTTP offload: FastAPI + ONNX Runtime, nested lists in
  and out (``bench._baselines``).

Three more variants locate the time: the same request frame published raw
(paho, no agent) to the hub (what the hub adds over the echo; the rest is
the agent's), the agent on MQTT 3.1.1 (what MQTT 5 properties cost), and
the agent against a copy of the model with the default 2 ms queue delay.
The agent's own latency breakdown (the hub's timing in each reply) and the
CPU each process spends per call complete the picture.

The agent runs ``OffloadPolicy.always_cloud()`` without a local model and a
5 s deadline. The variants run interleaved: every round runs a block of
calls of each, in an order that rotates round by round, so drift on the
shared machine hits them alike. Percentiles pool every timed call; the
spread is the IQR of the per-round medians, and the ratio to the echo is
also taken round by round.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._plots import plot_latency
from ._procs import (
    BrokerProcess,
    EchoProcess,
    HubProcess,
    PlainServerProcess,
    cpu_ns,
    mosquitto_version,
    write_model,
)
from ._report import RESULTS_DIR

__all__ = ["identity_model", "run"]

TARGET_RATIO = 1.3
FEATURES = 768
MODEL = "identity"  # max_queue_delay_ms 0: the latency setting
MODEL_DEFAULT_DELAY = "identity_default"  # the same model with the default config (2 ms window)
_ROUNDS = 25
_BLOCK = 100  # calls per variant per round: 2,500 timed calls per variant...
_BLOCK_S = 0.5  # ...unless a block takes longer than this (a slow variant gets fewer)
_WARMUP = 200
_WARMUP_S = 3.0
_PLOT = "round_trip_latency.png"
_HUB_CONFIG = {"max_batch_size": 64, "max_queue_delay_ms": 0.0, "max_queue_size": 1024}
_ECHO_REQUEST = "bench/echo/req"
_ECHO_REPLY = "bench/echo/rep"
_RAW_REPLY = "bench/raw/rep"

_LABELS = {
    "echo": "bare paho echo (MQTT, QoS 1)",
    "raw_to_hub": "raw paho request frame -> hub (MQTT, QoS 1), queue delay 0",
    "agent": "EdgeAgent.infer -> hub (MQTT, QoS 1), queue delay 0",
    "agent_mqtt311": "EdgeAgent.infer -> hub, agent on MQTT 3.1.1 (no v5 properties)",
    "agent_default_delay": "EdgeAgent.infer -> hub, default 2 ms queue delay",
    "hub_http_binary": "hub HTTP /infer, binary tensors",
    "hub_http_json": "hub HTTP /infer, JSON tensors",
    "plain_http_json": "plain FastAPI + ORT, JSON nested lists",
}
_SHORT = {
    "echo": "bare paho echo",
    "raw_to_hub": "raw frame -> hub",
    "agent": "EdgeAgent -> hub",
    "agent_mqtt311": "EdgeAgent -> hub, MQTT 3.1.1",
    "agent_default_delay": "EdgeAgent -> hub, 2 ms queue delay",
    "hub_http_binary": "hub HTTP, binary tensors",
    "hub_http_json": "hub HTTP, JSON tensors",
    "plain_http_json": "plain FastAPI, JSON lists",
}
_HTTP = ("hub_http_binary", "hub_http_json", "plain_http_json")


def identity_model(features: int = FEATURES) -> bytes:
    """An ONNX model that returns its input: float32[n, features] -> float32[n, features]."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", features])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def run() -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((1, FEATURES)).astype(np.float32)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-rt-") as tmp:
        work = Path(tmp)
        model_path = write_model(work / "repo", MODEL, identity_model(), _HUB_CONFIG)
        write_model(work / "repo", MODEL_DEFAULT_DELAY, model_path, {})
        with (
            BrokerProcess(work).start() as broker,
            HubProcess(work / "repo", broker.url, work).start() as hub,
            EchoProcess(broker.url, _ECHO_REQUEST, _ECHO_REPLY, work).start() as echo,
            PlainServerProcess(model_path, work).start() as plain,
        ):
            pids = {
                "requester": os.getpid(),
                "broker": broker.pid,
                "hub": hub.pid,
                "echo": echo.pid,
                "plain server": plain.pid,
            }
            callers = _Callers(broker.url, hub.http_port, plain.port, x)
            try:
                for name, fn in callers.variants.items():
                    _block(fn, _WARMUP, _WARMUP_S)
                    callers.check(name)
                for rows in callers.breakdowns.values():
                    rows.clear()
                measured = _interleaved(callers.variants, pids)
                breakdown = callers.agent_breakdown()
                reconnects = callers.reconnects
            finally:
                callers.close()
    measured["load"] = {"before": load_before, "after": os.getloadavg()}
    measured["http_reconnects"] = reconnects
    return _result(measured, breakdown)


class _Callers:
    """One blocking round trip per variant, each against its own long-lived connection."""

    def __init__(self, broker_url: str, hub_port: int, plain_port: int, x: np.ndarray) -> None:
        from edge_agent import EdgeAgent, OffloadPolicy
        from shared import Message, MqttSettings, Topics, create_client, encode_message

        self.x = x
        settings = MqttSettings.from_url(broker_url)
        self.agents = {
            name: EdgeAgent(
                None,
                device_id=f"bench-rt-{i}",
                broker=broker,
                cloud_model=model,
                input_name="x",
                policy=OffloadPolicy.always_cloud(),
                default_deadline_ms=5000.0,
            ).start(wait_s=10.0)
            for i, (name, model, broker) in enumerate(
                (
                    ("agent", MODEL, settings),
                    ("agent_mqtt311", MODEL, MqttSettings.from_url(broker_url, protocol="3.1.1")),
                    ("agent_default_delay", MODEL_DEFAULT_DELAY, settings),
                )
            )
        }
        self.last: dict[str, Any] = {}
        self.reconnects = 0
        self.breakdowns: dict[str, list[tuple[float, float, float, float]]] = {
            "agent": [],
            "agent_mqtt311": [],
            "agent_default_delay": [],
        }

        # The echo carries the agent's own frame, so both move the same bytes.
        self.frame = encode_message(
            Message(
                kind="request",
                request_id="echo",
                model=MODEL,
                reply_to=_ECHO_REPLY,
                timeout_ms=5000.0,
                device_id="bench-rt",
                tensors={"x": x},
            )
        )
        # The same frame as a device would send it, minus the agent: what the hub alone adds.
        self.raw_topic = Topics().infer(MODEL)
        self.raw_frame = encode_message(
            Message(
                kind="request",
                request_id="raw",
                model=MODEL,
                reply_to=_RAW_REPLY,
                timeout_ms=5000.0,
                device_id="bench-rt-raw",
                tensors={"x": x},
            )
        )
        self._echoed = threading.Event()
        self._subscribed = threading.Event()
        client = create_client(settings, "bench-rt-echo-requester", protocol="5")
        client.on_connect = lambda c, _u, _f, _r, _p: c.subscribe(
            [(_ECHO_REPLY, 1), (_RAW_REPLY, 1)]
        )
        client.on_subscribe = lambda *_a: self._subscribed.set()
        client.on_message = self._on_echo
        client.connect(settings.host, settings.port)
        client.loop_start()
        if not self._subscribed.wait(10.0):
            raise RuntimeError("the echo requester could not subscribe")
        self.echo_client = client
        self._echo_reply = b""

        self.hub = http.client.HTTPConnection("127.0.0.1", hub_port, timeout=10)
        self.plain = http.client.HTTPConnection("127.0.0.1", plain_port, timeout=10)
        header = {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        raw = json.dumps(header).encode()
        self.binary_body = raw + x.tobytes()
        self.binary_headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(raw)),
        }
        self.json_body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "data": x.ravel().tolist(),
                    }
                ]
            }
        ).encode()
        self.plain_body = json.dumps({"data": x.tolist()}).encode()
        self.json_headers = {"Content-Type": "application/json"}
        self.variants: dict[str, Callable[[], None]] = {
            "echo": lambda: self.publish("echo", _ECHO_REQUEST, self.frame),
            "raw_to_hub": lambda: self.publish("raw_to_hub", self.raw_topic, self.raw_frame),
            "agent": lambda: self.agent_call("agent"),
            "agent_mqtt311": lambda: self.agent_call("agent_mqtt311"),
            "agent_default_delay": lambda: self.agent_call("agent_default_delay"),
            "hub_http_binary": self.hub_binary,
            "hub_http_json": self.hub_json,
            "plain_http_json": self.plain_json,
        }

    def _on_echo(self, _c: Any, _u: Any, message: Any) -> None:
        self._echo_reply = message.payload
        self._echoed.set()

    def publish(self, name: str, topic: str, frame: bytes) -> None:
        """Publish a ready frame with QoS 1 and wait for the reply on the requester's topic."""
        self._echoed.clear()
        self.echo_client.publish(topic, frame, qos=1)
        if not self._echoed.wait(5.0):
            raise TimeoutError(f"{name}: no reply within 5 s")
        self.last[name] = self._echo_reply

    def agent_call(self, name: str) -> None:
        from edge_agent import Source

        result = self.agents[name].infer(self.x)
        if result.source is not Source.CLOUD:
            raise RuntimeError(f"the agent answered from {result.source}: {result.reason}")
        lat = result.latency
        self.breakdowns[name].append(
            (lat.total_ms, lat.network_ms, lat.queue_ms, lat.cloud_compute_ms)
        )
        self.last[name] = result.output

    def _post(
        self, conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[bytes, http.client.HTTPResponse]:
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # uvicorn closes a keep-alive connection idle for 5 s (its default); open anew.
            self.reconnects += 1
            conn.close()
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST {path}: {response.status} {data[:200]!r}")
        return data, response

    def hub_binary(self) -> None:
        data, response = self._post(
            self.hub, f"/v2/models/{MODEL}/infer", self.binary_body, self.binary_headers
        )
        json_length = int(response.getheader("Inference-Header-Content-Length") or len(data))
        self.last["hub_http_binary"] = np.frombuffer(data, np.float32, offset=json_length)

    def hub_json(self) -> None:
        data, _ = self._post(
            self.hub, f"/v2/models/{MODEL}/infer", self.json_body, self.json_headers
        )
        out = json.loads(data)["outputs"][0]
        self.last["hub_http_json"] = np.asarray(out["data"], np.float32)

    def plain_json(self) -> None:
        data, _ = self._post(self.plain, "/infer", self.plain_body, self.json_headers)
        self.last["plain_http_json"] = np.asarray(json.loads(data)["outputs"], np.float32)

    def check(self, name: str) -> None:
        """Every variant returns the input unchanged (the echo: the frame it sent)."""
        from shared import decode_message

        got = self.last[name]
        if name == "echo":
            if bytes(got) != self.frame:
                raise RuntimeError("the echo returned other bytes than it was sent")
            return
        if name == "raw_to_hub":
            reply = decode_message(got)
            if not reply.ok:
                raise RuntimeError(f"the hub answered {reply.error}: {reply.error_message}")
            got = next(iter(reply.tensors.values()))
        np.testing.assert_array_equal(np.asarray(got).ravel(), self.x.ravel())

    def agent_breakdown(self) -> dict[str, dict[str, float]]:
        """Medians of the agents' own latency breakdown (the hub reports its part)."""
        out = {}
        for name, rows in self.breakdowns.items():
            a = np.asarray(rows)
            total, network, queue, compute = (float(np.median(a[:, i])) for i in range(4))
            out[name] = {
                "total_ms": total,
                "hub_ms": float(np.median(a[:, 0] - a[:, 1])),
                "outside_hub_ms": network,
                "queue_ms": queue,
                "compute_ms": compute,
            }
        return out

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
        self.echo_client.disconnect()
        self.echo_client.loop_stop()
        self.hub.close()
        self.plain.close()


def _block(fn: Callable[[], None], calls: int, limit_s: float) -> np.ndarray:
    """Time up to ``calls`` calls of ``fn`` (at least 10, and fewer past ``limit_s``), in ms."""
    clock = time.perf_counter_ns
    out = np.empty(calls)
    stop = clock() + int(limit_s * 1e9)
    n = 0
    while n < calls:
        t0 = clock()
        fn()
        t1 = clock()
        out[n] = t1 - t0
        n += 1
        if t1 > stop and n >= 10:
            break
    return out[:n] / 1e6


def _interleaved(variants: dict[str, Callable[[], None]], pids: dict[str, int]) -> dict[str, Any]:
    """Rounds of one block per variant, order rotating; also CPU used per call, by process."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    medians: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, dict[str, float]] = {n: dict.fromkeys(pids, 0.0) for n in names}
    for r in range(_ROUNDS):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            before = {k: cpu_ns(pid) for k, pid in pids.items()}
            block = _block(variants[name], _BLOCK, _BLOCK_S)
            for k, pid in pids.items():
                cpu[name][k] += cpu_ns(pid) - before[k]
            samples[name].extend(block.tolist())
            medians[name].append(float(np.median(block)))
    cpu_us = {n: {k: v / 1e3 / len(samples[n]) for k, v in per.items()} for n, per in cpu.items()}
    return {
        "samples_ms": {n: np.asarray(v) for n, v in samples.items()},
        "round_medians_ms": medians,
        "cpu_us_per_call": cpu_us,
    }


def _iqr(values: list[float]) -> tuple[float, float]:
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def _result(measured: dict[str, Any], breakdown: dict[str, dict[str, float]]) -> dict[str, Any]:
    samples: dict[str, np.ndarray] = measured["samples_ms"]
    medians: dict[str, list[float]] = measured["round_medians_ms"]
    cpu: dict[str, dict[str, float]] = measured["cpu_us_per_call"]
    stats: dict[str, dict[str, Any]] = {}
    for n, v in samples.items():
        ratios = [a / b for a, b in zip(medians[n], medians["echo"], strict=True)]
        stats[n] = {
            "calls": len(v),
            "p50_ms": float(np.percentile(v, 50)),
            "p90_ms": float(np.percentile(v, 90)),
            "p99_ms": float(np.percentile(v, 99)),
            "round_median_iqr_ms": _iqr(medians[n]),
            "ratio_to_echo_median": statistics.median(ratios),
            "ratio_to_echo_iqr": _iqr(ratios),
        }
    echo, agent = stats["echo"], stats["agent"]
    ratio = agent["p50_ms"] / echo["p50_ms"]
    met_ratio = ratio <= TARGET_RATIO
    fastest_http = min(_HTTP, key=lambda n: stats[n]["p50_ms"])
    met_http = agent["p50_ms"] < stats[fastest_http]["p50_ms"]
    raw = stats["raw_to_hub"]
    b = breakdown["agent"]
    hops_ms = b["hub_ms"] - b["queue_ms"] - b["compute_ms"]
    cpu_agent, cpu_raw, cpu_echo = cpu["agent"], cpu["raw_to_hub"], cpu["echo"]
    limited = (
        f"p50s: bare echo {echo['p50_ms']:.2f} ms; the same kind of frame sent raw to the hub "
        f"{raw['p50_ms']:.2f} ms (the hub adds {raw['p50_ms'] - echo['p50_ms']:.2f} ms); "
        f"through EdgeAgent {agent['p50_ms']:.2f} ms (the agent adds "
        f"{agent['p50_ms'] - raw['p50_ms']:.2f} ms). The hub's own timing holds a request "
        f"{b['hub_ms']:.2f} ms from receipt to reply encoded: queue {b['queue_ms']:.2f} (the "
        f"hand-off from paho's thread to the batcher), compute {b['compute_ms']:.2f} (ONNX "
        f"Runtime's own call for an Identity), and {hops_ms:.2f} ms for the rest (taking the "
        "result off the batch and encoding the reply, on the batcher's thread); then a "
        "hand-off back to paho's network thread, which writes it. CPU per call "
        f"(all threads): hub {cpu_raw['hub']:.0f} µs vs the echo process "
        f"{cpu_echo['echo']:.0f} µs; requester {cpu_agent['requester']:.0f} µs through the "
        f"agent vs {cpu_raw['requester']:.0f} µs raw. On 2 cores shared with the broker, the "
        "requester and other work, each of those two thread hand-offs waits for the GIL "
        "and a core, and code that ran a millisecond ago runs cold; the agent's own share is "
        "its bookkeeping in edge_agent/_agent.py, the envelope codec and paho"
    )
    http_slow = stats["hub_http_binary"]["p50_ms"] - stats["plain_http_json"]["p50_ms"] > 30
    targets = [
        {
            "name": "agent round trip p50 against the bare paho echo (same broker, same frame)",
            "target": f"<= {TARGET_RATIO}x",
            "measured": f"{ratio:.2f}x ({agent['p50_ms']:.2f} vs {echo['p50_ms']:.2f} ms; by "
            f"round {agent['ratio_to_echo_median']:.2f}x, IQR "
            f"{agent['ratio_to_echo_iqr'][0]:.2f} to {agent['ratio_to_echo_iqr'][1]:.2f})",
            "met": met_ratio,
            "limited_by": None if met_ratio else limited,
        },
        {
            "name": "agent round trip p50 below every HTTP variant",
            "target": f"< {stats[fastest_http]['p50_ms']:.2f} ms ({_LABELS[fastest_http]})",
            "measured": f"{agent['p50_ms']:.2f} ms",
            "met": met_http,
            "limited_by": None if met_http else limited,
        },
    ]
    rows = []
    for n, st in stats.items():
        lo, hi = st["round_median_iqr_ms"]
        rlo, rhi = st["ratio_to_echo_iqr"]
        rows.append(
            [
                _LABELS[n],
                st["calls"],
                f"{st['p50_ms']:.2f}",
                f"{st['p99_ms']:.2f}",
                f"{lo:.2f} to {hi:.2f}",
                f"{st['ratio_to_echo_median']:.2f}x ({rlo:.2f} to {rhi:.2f})",
                f"{cpu[n]['requester']:.0f}",
                f"{cpu[n]['hub'] + cpu[n]['echo'] + cpu[n]['plain server']:.0f}",
                f"{cpu[n]['broker']:.0f}",
            ]
        )
    split_rows = [
        [
            _LABELS[n],
            f"{d['total_ms']:.2f}",
            f"{d['hub_ms']:.2f}",
            f"{d['queue_ms']:.3f}",
            f"{d['compute_ms']:.3f}",
            f"{d['outside_hub_ms']:.2f}",
        ]
        for n, d in breakdown.items()
    ]
    plot_latency(
        samples,
        stats,
        _SHORT,
        f"Offload round trip, float32[1, {FEATURES}] in and out, one requester, QoS 1, loopback",
        RESULTS_DIR / _PLOT,
    )
    load = measured["load"]
    default = breakdown["agent_default_delay"]
    v311 = stats["agent_mqtt311"]
    notes = [
        f"MQTT 5 properties: the same agent on MQTT 3.1.1 (correlation travels in the "
        f"envelope; paho builds no Properties objects) takes {v311['p50_ms']:.2f} ms p50 "
        f"against {agent['p50_ms']:.2f} ms on MQTT 5.",
        "Hub batching for latency: the model's config.json sets `max_queue_delay_ms: 0` "
        "(with `max_batch_size: 64`), so a lone request is dispatched at once; concurrent "
        "requests still batch with whatever is queued when the worker is free. With the "
        f"default 2 ms window the same call takes {stats['agent_default_delay']['p50_ms']:.2f} "
        f"ms p50 (queue {default['queue_ms']:.2f} ms): the batcher computes a lone request "
        "for an idle model at once, so the window costs it nothing.",
        "The hub publishes each reply from its batch's completion, on the batcher's thread "
        "(no reply thread); MQTT 5 reply properties are packed by hand, and the agent sends "
        "only a message expiry (reply topic and correlation id travel in the envelope).",
        "HTTP clients: one keep-alive `http.client.HTTPConnection` per server (TCP_NODELAY "
        "on). Binary: Triton's binary tensor data extension both ways "
        "(`Inference-Header-Content-Length`, `binary_data_output`); JSON: flat `data` lists. "
        'The plain server gets `{"data": nested lists}` and answers nested lists.',
        f"Mosquitto {mosquitto_version()} on loopback, `set_tcp_nodelay true`; every MQTT "
        "client here is paho-mqtt 2 with TCP_NODELAY, over MQTT 5 but for the 3.1.1 agent. "
        "The echo requester and the agent both publish from the calling thread (paho "
        "hands the write to its network thread), so they pay the same client-side hops.",
        f"The machine is shared: load average {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after on {os.cpu_count()} cores. Interleaved rounds "
        f"({_ROUNDS} rounds, blocks of up to {_BLOCK} calls or {_BLOCK_S} s per variant) "
        "make the variants see the same noise; p99s carry it.",
        "CPU µs per call comes from /proc/PID/task/*/schedstat of each process around each "
        "block: requester = this process, server = the hub, the echo or the plain server.",
    ]
    if http_slow:
        notes.insert(
            0,
            "The hub's HTTP API answers about 40 ms later than the plain server on every "
            "request, GET /v2/health/live included: the delayed-ACK stall of a socket "
            "without TCP_NODELAY. `cloud_hub/http/_server.py` binds its listening socket as "
            "`socket.socket(family, SOCK_STREAM)` (proto 0), and asyncio sets TCP_NODELAY "
            "only on sockets whose proto is IPPROTO_TCP, so uvicorn's two writes per "
            "response (head, then body) wait for the client's delayed ACK. Fix: "
            "`socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)` there (a probe "
            "with that change measured GET /v2/health/live at ~2.5 ms instead of ~45 ms).",
        )
    return {
        "title": "(b) Offload round trip",
        "summary": (
            f"One requester, float32[1, {FEATURES}] (3 KB) in and out through an ONNX "
            "Identity model, QoS 1, Mosquitto and every server on loopback. The agent's "
            f"offload takes {agent['p50_ms']:.2f} ms p50 / {agent['p99_ms']:.2f} ms p99 "
            f"against {echo['p50_ms']:.2f} / {echo['p99_ms']:.2f} ms for a bare paho echo of "
            f"the same frame ({ratio:.2f}x at p50); the fastest HTTP variant "
            f"({_LABELS[fastest_http]}) takes {stats[fastest_http]['p50_ms']:.2f} ms p50."
        ),
        "targets": targets,
        "tables": [
            {
                "title": "Round trip by variant (ms; IQR over per-round medians; ratio to the "
                "echo taken round by round; CPU µs per call by process)",
                "columns": [
                    "variant",
                    "calls",
                    "p50",
                    "p99",
                    "round p50 IQR",
                    "p50 / echo (IQR)",
                    "requester CPU",
                    "server CPU",
                    "broker CPU",
                ],
                "rows": rows,
            },
            {
                "title": "Where an agent round trip goes (medians, ms; hub = its own timing "
                "from receipt to reply encoded)",
                "columns": ["agent", "total", "in the hub", "queue", "compute", "outside the hub"],
                "rows": split_rows,
            },
        ],
        "plots": [_PLOT],
        "notes": notes,
        "data": {
            "features": FEATURES,
            "hub_config": _HUB_CONFIG,
            "stats": stats,
            "round_medians_ms": medians,
            "cpu_us_per_call": cpu,
            "agent_breakdown_ms": breakdown,
            "load_average": load,
            "http_reconnects": measured["http_reconnects"],
        },
    }
