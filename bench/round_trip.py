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
also taken round by round. The part's settings, targets and the result
built from the timings are in ``bench._round_trip_report``.
"""

from __future__ import annotations

import http.client
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._load import binary_infer_request
from ._procs import (
    BrokerProcess,
    EchoProcess,
    HubProcess,
    PlainServerProcess,
    cpu_ns,
    tree_cpu_ns,
    write_model,
)
from ._round_trip_report import BLOCK, BLOCK_S, FEATURES, HUB_CONFIG, ROUNDS, build_result

__all__ = ["identity_model", "run"]

MODEL = "identity"  # max_queue_delay_ms 0: the latency setting
MODEL_DEFAULT_DELAY = "identity_default"  # the same model with the default config (2 ms window)
_WARMUP = 200
_WARMUP_S = 3.0
_ECHO_REQUEST = "bench/echo/req"
_ECHO_REPLY = "bench/echo/rep"
_RAW_DEVICE = "bench-rt-raw"
_RAW_ID = "raw-%09d"  # fixed width: each call's id is patched into the same frame
_RAW_REPLY = f"tandem/v1/dev/{_RAW_DEVICE}/reply"  # the hub answers on the device's own topic


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
        model_path = write_model(work / "repo", MODEL, identity_model(), HUB_CONFIG)
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
    return build_result(measured, breakdown)


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
        self.raw_topic = Topics().device_infer(_RAW_DEVICE, MODEL)
        self.raw_frame = encode_message(
            Message(
                kind="request",
                request_id=_RAW_ID % 0,
                model=MODEL,
                reply_to=_RAW_REPLY,
                timeout_ms=5000.0,
                device_id=_RAW_DEVICE,
                tensors={"x": x},
            )
        )
        self._raw_calls = 0
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
        self.binary_body, self.binary_headers = binary_infer_request("x", x)
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
            "raw_to_hub": lambda: self.publish("raw_to_hub", self.raw_topic, self._raw_frame()),
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

    def _raw_frame(self) -> bytes:
        """The raw request with a fresh id (the hub computes an id once per device)."""
        self._raw_calls += 1
        fresh = (_RAW_ID % self._raw_calls).encode()
        return self.raw_frame.replace((_RAW_ID % 0).encode(), fresh, 1)

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


def _cpu_of(role: str, pid: int) -> int:
    """The hub's CPU with its processes' (supervisor, ingress, executors); any other
    role's alone: the requester is the parent of every other process here."""
    return tree_cpu_ns(pid) if role == "hub" else cpu_ns(pid)


def _interleaved(variants: dict[str, Callable[[], None]], pids: dict[str, int]) -> dict[str, Any]:
    """Rounds of one block per variant, order rotating; also CPU used per call, by process."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    medians: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, dict[str, float]] = {n: dict.fromkeys(pids, 0.0) for n in names}
    for r in range(ROUNDS):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            before = {k: _cpu_of(k, pid) for k, pid in pids.items()}
            block = _block(variants[name], BLOCK, BLOCK_S)
            for k, pid in pids.items():
                cpu[name][k] += _cpu_of(k, pid) - before[k]
            samples[name].extend(block.tolist())
            medians[name].append(float(np.median(block)))
    cpu_us = {n: {k: v / 1e3 / len(samples[n]) for k, v in per.items()} for n, per in cpu.items()}
    return {
        "samples_ms": {n: np.asarray(v) for n, v in samples.items()},
        "round_medians_ms": medians,
        "cpu_us_per_call": cpu_us,
    }
