"""OpenTelemetry traces of offloaded requests, device to hub, checked at a real OTLP receiver.

The spans leave through the SDK's own OTLP/HTTP exporter, over real HTTP, to
``tests._otlp.OtlpReceiver``: a loopback server that decodes the protobuf
export requests with ``opentelemetry-proto``, standing in for the
OpenTelemetry Collector, which cannot run here (no binary, none installable
offline). The device and the hub talk over a real Mosquitto.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_hub import Hub
from cloud_hub.http import HttpServer, create_app
from edge_agent import AsyncEdgeAgent, EdgeAgent, OffloadPolicy, Source
from shared import (
    FORMAT_MAJOR,
    MAGIC,
    FrameError,
    Message,
    MqttSettings,
    Topics,
    TracingSettings,
    decode_message,
    encode_message,
    parse_traceparent,
    parse_tracestate,
)

from ._brokers import MosquittoProcess, free_port
from ._models import write_linear_classifier
from ._mqtt_device import Device
from ._otlp import OtlpReceiver, ReceivedSpan
from ._plane import linear_repo, running_hub
from ._responder import Responder

ROOT = Path(__file__).resolve().parents[1]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"
DEVICE_SPANS = {"tandem.infer", "tandem.decision", "tandem.send", "tandem.wait"}
HUB_SPANS = {
    "tandem.hub.ingress",
    "tandem.hub.batch",
    "tandem.hub.queue",
    "tandem.hub.compute",
    "tandem.hub.reply",
}
SPAN_KIND_SERVER = 2  # OTLP's enum
SPAN_KIND_CONSUMER = 5


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture
def topics() -> Topics:
    return Topics(f"t-{uuid.uuid4().hex[:8]}/v1")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_linear_classifier(tmp_path / "repo" / "linear" / "1" / "model.onnx")
    return tmp_path / "repo"


def x_rows(n: int = 2) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, 16)).astype(np.float32)


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans}


def names(spans: list[ReceivedSpan]) -> set[str]:
    return {s.name for s in spans}


# -- the wire ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "garbage",
        f"01-{TRACE_ID}-{SPAN_ID}-01",  # a version this build does not read
        f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id: invalid
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero span id: invalid
        f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",  # upper-case hex
        f"00-{TRACE_ID}-{SPAN_ID}-01-extra",
        f"00-{TRACE_ID}-{SPAN_ID}-1",
        f" {TRACEPARENT}",
        12,
        None,
        ["x"],
    ],
)
def test_a_malformed_traceparent_is_dropped_on_decode_and_the_frame_still_reads(bad: Any) -> None:
    assert parse_traceparent(bad) is None
    header = {"kind": "request", "id": "r1", "model": "m", "tensors": []}
    header |= {"traceparent": bad, "tracestate": "k=v"}
    raw = json.dumps(header).encode()
    frame = struct.pack("<4sBBHI", MAGIC, FORMAT_MAJOR, 0, 0, len(raw)) + raw
    message = decode_message(frame)
    assert message.request_id == "r1"
    assert message.traceparent is None and message.tracestate is None
    assert "traceparent" not in message.extra  # dropped, not kept as an unknown field
    with pytest.raises(FrameError):  # and this build never writes one
        Message(kind="request", request_id="r1", model="m", traceparent=str(bad))


def test_valid_trace_context_goes_round_the_frame_and_is_written_only_when_set() -> None:
    message = Message(
        kind="request", request_id="r1", model="m", traceparent=TRACEPARENT, tracestate="a=1,b@c=2"
    )
    again = decode_message(encode_message(message))
    assert (again.traceparent, again.tracestate) == (TRACEPARENT, "a=1,b@c=2")
    plain = encode_message(Message(kind="request", request_id="r1", model="m"))
    assert b"trace" not in plain


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("a=1", True),
        ("a=1, b=2", True),
        ("tenant@system=x y", True),
        ("A=1", False),  # keys are lower case
        ("a=", False),
        ("a=1,=2", False),
        ("a=1 ", True),  # optional white space around members
        (",".join(f"k{i}=v" for i in range(33)), False),  # at most 32 members
        ("a=" + "x" * 600, False),
    ],
)
def test_tracestate_follows_the_w3c_grammar(value: str, valid: bool) -> None:
    assert (parse_tracestate(value) == value) is valid


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SERVICE_NAME": "cam"}, False),  # a name alone says nothing about exporting
    ],
)
def test_the_standard_environment_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    assert (TracingSettings.from_env(env) is not None) is on


def test_settings_resolve_the_traces_url_and_service_name() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_SERVICE_NAME": "cam"}
    assert TracingSettings().traces_url(env) == "http://c:4318/v1/traces"
    assert TracingSettings().service("tandem-edge", env) == "cam"
    assert TracingSettings().traces_url({}) == "http://localhost:4318/v1/traces"
    explicit = TracingSettings(endpoint="http://x:1/v1/traces", service_name="a")
    assert explicit.traces_url(env) == "http://x:1/v1/traces" and explicit.service("b", env) == "a"
    with pytest.raises(ValueError, match="endpoint"):
        TracingSettings(endpoint="collector:4318")
    with pytest.raises(ValueError, match="sample_ratio"):
        TracingSettings(sample_ratio=1.5)


# -- device -> broker -> hub ---------------------------------------------------------------


def test_an_offloaded_request_is_one_trace_from_the_device_through_the_hub(
    linear_onnx: Path, mosquitto: MosquittoProcess, receiver: OtlpReceiver, repo: Path, topics
) -> None:
    tracing = TracingSettings(endpoint=receiver.url, service_name="camera")
    hub = Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), topics=topics,
              tracing=TracingSettings(endpoint=receiver.url)).start()  # fmt: skip
    try:
        with EdgeAgent(
            linear_onnx, device_id=f"cam-{uuid.uuid4().hex[:6]}", broker=mosquitto.url,
            topics=topics, policy=OffloadPolicy.always_cloud(), cloud_model="linear",
            tracing=tracing,
        ) as agent:  # fmt: skip
            result = agent.infer(x_rows(), deadline_ms=10_000)
    finally:
        hub.stop()  # both flush their spans on close
    assert result.source is Source.CLOUD, result.reason
    spans = receiver.wait_for(lambda got: names(got) >= DEVICE_SPANS | HUB_SPANS)
    mine = [s for s in spans if s.attributes.get("tandem.request_id") == result.request_id]
    assert names(mine) == DEVICE_SPANS | HUB_SPANS  # every span names the request
    assert len(mine) == len(DEVICE_SPANS | HUB_SPANS)  # and each comes once
    span = by_name(mine)
    root = span["tandem.infer"]
    assert {s.trace_id for s in mine} == {root.trace_id}, "one trace"
    assert root.parent_span_id == ""
    for child in ("tandem.decision", "tandem.send", "tandem.wait"):
        assert span[child].parent_span_id == root.span_id, child
    # The frame carried the send span's context: the hub's spans hang under it.
    assert span["tandem.hub.ingress"].parent_span_id == span["tandem.send"].span_id
    assert span["tandem.hub.ingress"].kind == SPAN_KIND_CONSUMER
    for child in ("tandem.hub.batch", "tandem.hub.reply"):
        assert span[child].parent_span_id == span["tandem.hub.ingress"].span_id, child
    for child in ("tandem.hub.queue", "tandem.hub.compute"):
        assert span[child].parent_span_id == span["tandem.hub.batch"].span_id, child
    assert root.attributes["tandem.offloaded"] is True
    assert root.attributes["tandem.source"] == "cloud"
    assert root.attributes["tandem.route"] == "cloud"
    assert root.attributes["tandem.model"] == "linear"
    assert "tandem.fallback" not in root.attributes
    assert span["tandem.send"].attributes["tandem.request_bytes"] > 16 * 2 * 4
    assert span["tandem.decision"].attributes["tandem.route"] == "cloud"
    assert span["tandem.hub.batch"].attributes["tandem.batch_rows"] >= 2
    assert span["tandem.hub.ingress"].attributes["tandem.error"] == "ok"
    assert {s.service for s in mine if s.name in DEVICE_SPANS} == {"camera"}
    assert {s.service for s in mine if s.name in HUB_SPANS} == {"tandem-hub"}
    # Built from the reply's own timings: the queue comes before compute, both in the batch.
    queue, compute = span["tandem.hub.queue"], span["tandem.hub.compute"]
    batch = span["tandem.hub.batch"]
    assert batch.start_ns <= queue.start_ns <= queue.end_ns == compute.start_ns
    assert compute.end_ns == batch.end_ns


def test_a_fallback_is_marked_on_the_root_and_its_wait_ends_in_a_timeout(
    linear_onnx: Path, mosquitto: MosquittoProcess, receiver: OtlpReceiver, topics
) -> None:
    with EdgeAgent(
        linear_onnx, device_id=f"cam-{uuid.uuid4().hex[:6]}", broker=mosquitto.url,
        topics=topics, policy=OffloadPolicy.always_cloud(), cloud_model="linear",
        tracing=TracingSettings(endpoint=receiver.url),
    ) as agent:  # fmt: skip  # no hub listens on these topics
        result = agent.infer(x_rows(), deadline_ms=300)
    assert result.source is Source.EDGE_FALLBACK
    spans = receiver.wait_for(lambda got: "tandem.infer" in names(got))
    span = by_name(spans)
    root = span["tandem.infer"]
    assert root.attributes["tandem.fallback"] == result.reason == "fallback:timeout"
    assert root.attributes["tandem.offloaded"] is True
    assert span["tandem.wait"].attributes["error.type"] == "TimeoutError"
    assert span["tandem.local_run"].parent_span_id == root.span_id  # the fallback's run


def test_both_decisions_are_spans_and_the_second_has_the_local_answers_score(
    linear_onnx: Path, receiver: OtlpReceiver
) -> None:
    with EdgeAgent(
        linear_onnx, device_id="cam-s", policy=OffloadPolicy.threshold(-1.0),
        tracing=TracingSettings(endpoint=receiver.url),
    ) as agent:  # fmt: skip  # every answer is "uncertain"; no broker: it falls back
        result = agent.infer(x_rows(1))
    assert result.source is Source.EDGE_FALLBACK
    spans = receiver.wait_for(lambda got: "tandem.infer" in names(got))
    decisions = sorted((s for s in spans if s.name == "tandem.decision"), key=lambda s: s.start_ns)
    assert [d.attributes["tandem.route"] for d in decisions] == ["local", "cloud"]
    assert "tandem.score" not in decisions[0].attributes
    assert decisions[1].attributes["tandem.score"] == pytest.approx(result.score)
    root = by_name(spans)["tandem.infer"]
    assert root.attributes["tandem.fallback"] == result.reason
    assert root.attributes["tandem.decision"] == decisions[1].attributes["tandem.decision"]


def test_a_call_is_a_child_of_the_apps_current_span(
    linear_onnx: Path, receiver: OtlpReceiver
) -> None:
    from opentelemetry import trace

    app_span = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=int(TRACE_ID, 16),
            span_id=int(SPAN_ID, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    with (
        EdgeAgent(
            linear_onnx, device_id="cam-p", policy=OffloadPolicy.always_local(),
            tracing=TracingSettings(endpoint=receiver.url),
        ) as agent,
        trace.use_span(app_span),
    ):  # fmt: skip
        agent.infer(x_rows(1))
    spans = receiver.wait_for(lambda got: "tandem.infer" in names(got))
    root = by_name(spans)["tandem.infer"]
    assert (root.trace_id, root.parent_span_id) == (TRACE_ID, SPAN_ID)


@pytest.mark.parametrize("how", ["env", "sample_ratio"])
def test_a_sampled_out_call_exports_nothing_but_its_request_still_carries_the_trace(
    linear_onnx: Path,
    mosquitto: MosquittoProcess,
    receiver: OtlpReceiver,
    topics,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    tracing = TracingSettings(endpoint=receiver.url)
    if how == "env":
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")  # read by the SDK's provider
    else:
        tracing = TracingSettings(endpoint=receiver.url, sample_ratio=0.0)

    def answer(request: Message) -> Message:
        return request.reply(tensors={"logits": np.zeros((2, 4), np.float32)})

    with (
        Responder(mosquitto.url, answer, topics) as hub,
        EdgeAgent(
            linear_onnx, device_id=f"cam-{uuid.uuid4().hex[:6]}", broker=mosquitto.url,
            topics=topics, policy=OffloadPolicy.always_cloud(), cloud_model="linear",
            tracing=tracing,
        ) as agent,
    ):  # fmt: skip
        result = agent.infer(x_rows(), deadline_ms=10_000)
    assert result.source is Source.CLOUD, result.reason
    [request] = hub.requests
    assert request.traceparent is not None
    assert int(request.traceparent[-2:], 16) & 1 == 0  # the sampled flag is off
    assert receiver.spans == []  # close flushed: nothing was there to export


def test_the_async_agent_traces_its_local_calls(linear_onnx: Path, receiver: OtlpReceiver) -> None:
    import asyncio

    async def main() -> str:
        async with AsyncEdgeAgent(
            linear_onnx, device_id="cam-a", policy=OffloadPolicy.always_local(),
            tracing=TracingSettings(endpoint=receiver.url),
        ) as agent:  # fmt: skip
            return (await agent.infer(x_rows(1))).request_id

    request_id = asyncio.run(main())
    spans = receiver.wait_for(lambda got: "tandem.infer" in names(got))
    assert names(spans) == {"tandem.infer", "tandem.decision", "tandem.local_run"}
    root = by_name(spans)["tandem.infer"]
    assert root.attributes["tandem.offloaded"] is False
    assert root.attributes["tandem.source"] == "edge"
    assert {s.attributes["tandem.request_id"] for s in spans} == {request_id}


def test_a_malformed_traceparent_in_a_frame_is_dropped_and_the_request_still_answered(
    mosquitto: MosquittoProcess, receiver: OtlpReceiver, repo: Path, topics
) -> None:
    hub = Hub(repo, mqtt=MqttSettings.from_url(mosquitto.url), topics=topics,
              tracing=TracingSettings(endpoint=receiver.url)).start()  # fmt: skip
    device = Device(mosquitto.url, topics)
    try:
        request_id = uuid.uuid4().hex
        tensors = encode_message(
            Message(kind="request", request_id=request_id, model="linear",
                    tensors={"x": x_rows()})
        )  # fmt: skip
        # Rewrite the header by hand: the encoder refuses a bad traceparent.
        (length,) = struct.unpack_from("<I", tensors, 8)
        header = json.loads(tensors[12 : 12 + length])
        header |= {"traceparent": f"00-{TRACE_ID}-zzzz{SPAN_ID[4:]}-01", "tracestate": "a=1",
                   "reply_to": device.reply_topic, "device": device.device_id,
                   "timeout_ms": 10_000}  # fmt: skip
        raw = json.dumps(header).encode()
        frame = struct.pack("<4sBBHI", MAGIC, FORMAT_MAJOR, 0, 0, len(raw)) + raw
        device.publish(
            topics.device_infer(device.device_id, "linear"), frame + tensors[12 + length :]
        )
        reply = device.reply(request_id)
    finally:
        device.close()
        hub.stop()
    assert reply.ok, reply.error_message
    spans = receiver.wait_for(lambda got: "tandem.hub.ingress" in names(got))
    ingress = by_name(spans)["tandem.hub.ingress"]
    assert ingress.attributes["tandem.request_id"] == request_id
    assert ingress.parent_span_id == "" and ingress.trace_id != TRACE_ID  # a trace of its own


# -- HTTP -----------------------------------------------------------------------------------


def infer_body(n: int = 2, request_id: str = "h1") -> dict[str, Any]:
    x = x_rows(n)
    return {
        "id": request_id,
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        ],
    }


def test_http_infer_with_a_traceparent_header_continues_that_trace(
    receiver: OtlpReceiver, repo: Path
) -> None:
    hub = Hub(repo, tracing=TracingSettings(endpoint=receiver.url)).start()
    try:
        with HttpServer(create_app(hub), port=0) as server:
            url = f"{server.url}/v2/models/linear/infer"
            context = {"traceparent": TRACEPARENT, "tracestate": "k=v"}
            traced = httpx.post(url, json=infer_body(request_id="h1"), headers=context, timeout=30)
            bad = httpx.post(url, json=infer_body(request_id="h2"), timeout=30,
                             headers={"traceparent": "00-nonsense"})  # fmt: skip
            missing = httpx.post(
                f"{server.url}/v2/models/nope/infer", json=infer_body(request_id="h3"),
                headers={"traceparent": TRACEPARENT}, timeout=30,
            )  # fmt: skip
    finally:
        hub.stop()
    assert traced.status_code == 200 and bad.status_code == 200, (traced.text, bad.text)
    assert missing.status_code == 404
    spans = receiver.wait_for(
        lambda got: len([s for s in got if s.name == "tandem.hub.ingress"]) == 3
    )
    ingress = {
        s.attributes.get("tandem.request_id"): s for s in spans if s.name == "tandem.hub.ingress"
    }
    first = ingress["h1"]
    assert (first.trace_id, first.parent_span_id) == (TRACE_ID, SPAN_ID)
    assert first.kind == SPAN_KIND_SERVER and first.attributes["tandem.transport"] == "http"
    children = {s.name for s in spans if s.parent_span_id == first.span_id}
    assert children == {"tandem.hub.batch", "tandem.hub.reply"}
    assert ingress["h2"].parent_span_id == "" and ingress["h2"].trace_id != TRACE_ID
    refused = ingress[None]  # refused before its body was read: no request id
    assert refused.trace_id == TRACE_ID and refused.attributes["tandem.error"] == "unknown_model"
    assert "tandem.hub.batch" not in {s.name for s in spans if s.parent_span_id == refused.span_id}


# -- the process plane (tandem hub) ---------------------------------------------------------


@pytest.mark.slow
def test_the_process_planes_ingress_processes_continue_the_devices_trace(
    linear_onnx: Path, mosquitto: MosquittoProcess, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Spans built in the ingress processes from the executor's timings, sent at stop."""
    repo = linear_repo(tmp_path / "repo")
    port = free_port()
    with running_hub(
        repo, mosquitto.url, http_port=port, otlp_endpoint=receiver.url
    ) as hub:  # fmt: skip
        with EdgeAgent(
            linear_onnx, device_id=f"cam-{uuid.uuid4().hex[:6]}", broker=mosquitto.url,
            topics=Topics(hub.spec.prefix), policy=OffloadPolicy.always_cloud(),
            cloud_model="linear", tracing=TracingSettings(endpoint=receiver.url),
        ) as agent:  # fmt: skip
            result = agent.infer(x_rows(), deadline_ms=20_000)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/linear/infer", json=infer_body(request_id="p1"),
            headers={"traceparent": TRACEPARENT}, timeout=30,
        )  # fmt: skip
    assert result.source is Source.CLOUD, result.reason
    assert answer.status_code == 200, answer.text
    spans = receiver.wait_for(
        lambda got: (
            len([s for s in got if s.name == "tandem.hub.ingress"]) == 2
            and "tandem.send" in names(got)
        )
    )
    ingress = {
        s.attributes.get("tandem.request_id"): s for s in spans if s.name == "tandem.hub.ingress"
    }
    send = by_name(spans)["tandem.send"]
    over_mqtt = ingress[result.request_id]
    assert (over_mqtt.trace_id, over_mqtt.parent_span_id) == (send.trace_id, send.span_id)
    assert (ingress["p1"].trace_id, ingress["p1"].parent_span_id) == (TRACE_ID, SPAN_ID)
    computed = [s for s in spans if s.name == "tandem.hub.compute"]
    assert {s.trace_id for s in computed} == {send.trace_id, TRACE_ID}
    assert {s.service for s in spans if s.name.startswith("tandem.hub.")} == {"tandem-hub"}


def test_the_hub_commands_otlp_endpoint_reaches_the_plane_and_a_bad_one_is_refused(
    tmp_path: Path,
) -> None:
    from cloud_hub.plane import HubServeSettings
    from cloud_hub.plane._launch import plan

    settings = HubServeSettings(repo=tmp_path, otlp_endpoint="http://otel:4318")
    assert settings.problem() is None
    assert plan(settings).otlp_endpoint == "http://otel:4318"
    assert plan(HubServeSettings(repo=tmp_path)).otlp_endpoint is None  # the environment's
    problem = HubServeSettings(repo=tmp_path, otlp_endpoint="otel:4318").problem()
    assert problem is not None and problem[0] == "--otlp-endpoint"
    done = subprocess.run(
        [sys.executable, "-m", "cloud_hub", "--repo", str(tmp_path), "--otlp-endpoint", "otel"],
        cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--otlp-endpoint" in done.stderr, done.stderr


# -- tracing off ----------------------------------------------------------------------------

_NO_OTEL = """
import sys, json
import numpy as np
from edge_agent import EdgeAgent, OffloadPolicy
agent = EdgeAgent({model!r}, device_id="d", policy=OffloadPolicy.always_local())
agent.infer(np.zeros((1, 16), np.float32))
agent.close()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return env | extra


def test_with_tracing_off_the_edge_agent_imports_no_opentelemetry(linear_onnx: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_OTEL.format(model=str(linear_onnx))],
        cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_environment_alone_turns_an_agents_tracing_on(
    linear_onnx: Path, receiver: OtlpReceiver
) -> None:
    env = _clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="env-cam")
    done = subprocess.run(
        [sys.executable, "-c", _NO_OTEL.format(model=str(linear_onnx))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "opentelemetry" in done.stdout  # on: the SDK was loaded
    spans = receiver.wait_for(lambda got: "tandem.infer" in names(got))
    assert {s.service for s in spans} == {"env-cam"}
