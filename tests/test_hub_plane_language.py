"""Language models served by ``tandem hub``'s process plane: a language executor process.

A real ``tandem hub`` process tree (supervisor, two MQTT ingress processes, an
HTTP ingress, the language executor), a real Mosquitto, real ONNX Runtime
GenAI sessions of the tiny model pair. Answers are compared with
``greedy_generate`` on the hub model, never with stored strings; waits are on
conditions. The executor is found by its command line in the hub's process
tree, stopped (SIGSTOP) to hold a turn where the test needs it, and killed
with SIGKILL for the crash.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import paho.mqtt.client as mqtt
import pytest

from cloud_hub.http._openai_bodies import chat_prompt
from cloud_hub.metrics._book import read_books
from edge_agent import Conversation, EdgeAgent, FinishReason, Source
from shared import (
    GenerateCancel,
    GenerateFinal,
    GenerateFinish,
    GenerateRequest,
    Topics,
    decode_text_message,
    encode_text_message,
)
from tandem.demo.language import build_language_models, greedy_generate, load_model

from ._brokers import MosquittoProcess, free_port
from ._hub_process import process_tree, tandem_hub
from ._language import tiny_recipe
from ._plane import wait_until

pytestmark = pytest.mark.slow

WAIT_S = 60.0
PROMPT = 'The "assert" statement'
LONG = 400  # tokens: a turn long enough to be caught mid-stream on this CPU


@dataclass
class Plane:
    hub: subprocess.Popen[bytes]
    url: str  # the broker
    port: int  # HTTP
    prefix: str
    device_model: Path
    reference: Any
    log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def agent(self, device: str) -> EdgeAgent:
        return EdgeAgent(
            None, device_id=device, broker=self.url, language_model=self.device_model,
            cloud_language_model="tiny", topics=Topics(self.prefix),
        )  # fmt: skip

    def executor_pid(self) -> int:
        """The living language executor's PID (waits for one after a restart)."""
        found: list[int] = []

        def alive() -> bool:
            found[:] = [p for p in process_tree(self.hub.pid) if _is_llm_executor(p)]
            return len(found) == 1

        wait_until(alive, timeout_s=WAIT_S, what="one language executor process")
        return found[0]

    def ready(self) -> None:
        def answered() -> bool:
            try:
                return httpx.get(f"{self.http}/v2/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answered, timeout_s=WAIT_S, what="the hub ready")

    def restarts(self) -> float:
        return self.metric("tandem_hub_process_restarts_total", role="llm")

    def serving_again(self, restarts: float) -> None:
        """After a kill: the supervisor counted a restart beyond ``restarts``, then every
        ingress is connected to the new executor (readiness says so)."""
        wait_until(lambda: self.restarts() > restarts, timeout_s=WAIT_S, what="the restart")
        self.ready()

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the hub's /metrics (every process merged), 0 if absent."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in httpx.get(f"{self.http}/metrics").text.splitlines():
            if line.startswith(f"{name}{{") and want in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def _is_llm_executor(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"cloud_hub.plane._child" in argv and b"llm" in argv


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, mosquitto: MosquittoProcess) -> Iterator[Plane]:
    models = build_language_models(tmp_path_factory.mktemp("lm"), recipe=tiny_recipe(context=512))
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(models.hub_model, repo / "tiny" / "1")
    (repo / "tiny" / "config.json").write_text(json.dumps({
        "platform": "onnxruntime_genai", "engine": "onnxruntime-genai",
        "generation": {"max_output_tokens": LONG},
    }))  # fmt: skip
    # A model whose engine cannot run here: refused in one line, the other one serves.
    shutil.copytree(models.hub_model, repo / "big" / "1")
    (repo / "big" / "config.json").write_text(
        json.dumps({"platform": "onnxruntime_genai", "engine": "vllm"})
    )
    port, log = free_port(), tmp_path_factory.mktemp("log") / "hub.log"
    prefix = f"tandem/{uuid.uuid4().hex[:8]}/v1"
    # The tests kill the executor often and quickly: a short back-off cap keeps each restart
    # within seconds (the default doubles to 30 s while a process keeps dying young).
    extra = ("--workers", "2", "--prefix", prefix, "--log-level", "info", "--restart-max-s", "2")
    with tandem_hub(repo, mosquitto.url, port, log, *extra) as hub:
        yield Plane(hub, mosquitto.url, port, prefix, models.device_model,
                    load_model(models.hub_model), log)  # fmt: skip


def test_a_model_whose_engine_is_missing_is_refused_in_one_line_and_the_others_serve(
    plane: Plane,
) -> None:
    listed = httpx.get(f"{plane.http}/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["tiny"]
    lines = [line for line in plane.log.read_text().splitlines() if "big is not served" in line]
    assert len(lines) == 1 and "engine 'vllm' needs" in lines[0]


def test_a_cloud_only_turn_over_mqtt_is_the_hub_model_s_greedy_text(plane: Plane) -> None:
    with plane.agent("plane-phone-1") as agent:
        stream = agent.generate(PROMPT, max_tokens=40, preset="cloud_only")
        chunks = list(stream)
    record = stream.result
    assert record is not None and record.error is None and not record.degraded
    expected = greedy_generate(plane.reference, PROMPT, 40)
    assert "".join(c.text for c in chunks) == record.text == expected.text
    assert {c.source for c in chunks} == {Source.CLOUD}
    assert record.output_ids == tuple(expected.tokens)  # kills: every update's ids resent
    assert record.prompt_tokens == len(plane.reference[1].encode(PROMPT))


def test_the_openai_client_streams_the_greedy_text_through_the_http_ingress(
    plane: Plane,
) -> None:
    client = openai.OpenAI(base_url=f"{plane.http}/v1", api_key="unused", timeout=WAIT_S)
    messages = [{"role": "user", "content": "import os"}]
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=24, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts, finish, usage = [], None, None
    for event in stream:
        if event.usage is not None:
            usage = event.usage
        for choice in event.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    expected = greedy_generate(plane.reference, chat_prompt(messages), 24)
    assert "".join(parts) == expected.text
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens == len(expected.tokens)


def _books_turns(plane: Plane) -> dict[str, float]:
    """Text turns each living MQTT ingress process says it took (its metrics book)."""
    root = Path(tempfile.gettempdir())
    metrics_dirs = [p for p in root.glob("tandem-hub-*/metrics") if p.is_dir()]
    turns: dict[str, float] = {}
    for directory in metrics_dirs:
        for book, alive in read_books(directory):
            value = book.gauges.get(("tandem_hub_mqtt_text_turns", ()))
            if alive and value is not None and book.pid in process_tree(plane.hub.pid):
                turns[book.role] = value
    return turns


def test_two_mqtt_ingress_processes_reach_one_executor_and_its_kept_conversations(
    plane: Plane,
) -> None:
    """Six conversations of two turns each, through the hub's share group of two ingress
    processes: both take turns, and every second turn continues its kept cache (one
    engine holds them all, whichever process a turn came through)."""
    before = _books_turns(plane)
    seconds = []
    with plane.agent("plane-phone-2") as agent:
        for i in range(6):
            conversation = Conversation()
            for content in (f"Hi {i}", "And?"):
                record = agent.chat([{"role": "user", "content": content}],
                                    conversation=conversation, max_tokens=8,
                                    preset="cloud_only").final()  # fmt: skip
                assert record.error is None and record.cloud_tokens > 0
            seconds.append(record)
    assert all(r.prompt_tokens_reused > 0 for r in seconds)  # kills: conversation not sent
    # Second turns went to this replica's own topic (sticky; its two ingress processes
    # share that subscription too), named by the plane's hub id.
    assert all(r.sticky and r.rerouted is None and r.hub for r in seconds)
    assert len({r.hub for r in seconds}) == 1

    def both_took_turns() -> bool:
        now = _books_turns(plane)
        taken = {r: now.get(r, 0.0) - before.get(r, 0.0) for r in now}
        return len(taken) == 2 and all(v > 0 for v in taken.values())

    wait_until(both_took_turns, timeout_s=WAIT_S, what="both MQTT ingress processes took turns")
    wait_until(  # the executor's book is written about once a second
        lambda: plane.metric("tandem_llm_conversation_turns_total", model="tiny", cache="hit")
        >= 6,
        timeout_s=WAIT_S, what="the engine's conversation hits in /metrics",
    )  # fmt: skip


class _Device:
    """A device without the SDK (paho): publishes generate and cancel frames, keeps finals."""

    def __init__(self, plane: Plane, device: str) -> None:
        self.topics = Topics(plane.prefix)
        self.device = device
        self.finals: dict[str, GenerateFinal] = {}
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"{device}-{uuid.uuid4().hex[:6]}",
                                  protocol=mqtt.MQTTv5)  # fmt: skip
        subscribed = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.on_connect = lambda *a: self.client.subscribe(self.topics.text(device), qos=1)
        host, port = plane.url.removeprefix("mqtt://").split(":")
        self.client.connect(host, int(port))
        self.client.loop_start()
        assert subscribed.wait(WAIT_S)

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        decoded = decode_text_message(message.payload)
        if isinstance(decoded, GenerateFinal):
            self.finals[decoded.request_id] = decoded

    def send(self, frame: GenerateRequest | GenerateCancel, topic: str) -> None:
        self.client.publish(topic, encode_text_message(frame), qos=1).wait_for_publish(WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _held(plane: Plane) -> Callable[[], None]:
    """Stop the language executor (SIGSTOP); returns what lets it go on (SIGCONT)."""
    pid = plane.executor_pid()
    os.kill(pid, signal.SIGSTOP)
    return lambda: os.kill(pid, signal.SIGCONT)


def test_a_cancel_reaches_the_executor_and_frees_the_slot(plane: Plane) -> None:
    device = _Device(plane, "plane-phone-3")
    # The executor writes its counts about once a second: an earlier test's turn may be
    # counted after this baseline (so ">=", and no check that "completed" stays put).
    cancelled = plane.metric("tandem_llm_turns_total", model="tiny", outcome="cancelled")
    resume = _held(plane)  # the turn and its cancel wait in the executor's socket together
    try:
        request = GenerateRequest(request_id="c-1", model="tiny", max_tokens=LONG, prompt=PROMPT)
        topics = Topics(plane.prefix)
        device.send(request, topics.device_generate("plane-phone-3", "tiny"))
        device.send(GenerateCancel(request_id="c-1"), topics.cancel("plane-phone-3"))
    finally:
        resume()
    try:
        wait_until(lambda: "c-1" in device.finals, timeout_s=WAIT_S, what="the final")
    finally:
        device.close()
    assert device.finals["c-1"].finish is GenerateFinish.CANCELLED  # kills: cancel op ignored
    wait_until(
        lambda: plane.metric("tandem_llm_turns_total", model="tiny", outcome="cancelled")
        >= cancelled + 1
        and plane.metric("tandem_llm_active_turns", model="tiny") == 0,
        timeout_s=WAIT_S, what="the engine's stats: one more turn cancelled, no slot held",
    )  # fmt: skip


def test_the_executor_killed_mid_stream_the_device_finishes_and_the_next_turn_works(
    plane: Plane,
) -> None:
    """SIGKILL once the device has the first chunk: the turn ends degraded (the device
    model finishes it) with no text twice; the supervisor restarts the executor and the
    next turn is the hub model's again. A try whose turn ended before the kill landed
    is made again (a long turn takes tens of ms here)."""
    caught = None
    with plane.agent("plane-phone-4") as agent:
        for _ in range(5):
            plane.ready()
            pid, restarts = plane.executor_pid(), plane.restarts()
            stream = agent.generate(PROMPT, max_tokens=LONG, preset="prefer_cloud")
            chunks = [next(stream)]
            os.kill(pid, signal.SIGKILL)
            chunks += list(stream)
            plane.serving_again(restarts)
            record = stream.result
            assert record is not None
            if record.degraded:
                caught = (chunks, record)
                break
        assert caught is not None, "no try was caught mid-stream"
        chunks, record = caught
        cloud = "".join(c.text for c in chunks if c.source is Source.CLOUD)
        local = "".join(c.text for c in chunks if c.source is Source.EDGE)
        assert cloud and record.text == cloud + local
        assert greedy_generate(plane.reference, PROMPT, LONG).text.startswith(cloud)
        assert [c.index for c in chunks] == list(range(len(chunks)))  # none twice
        assert [c.source for c in chunks] == sorted(
            (c.source for c in chunks), key=lambda s: s != Source.CLOUD
        )
        assert record.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        # The hub said so at once (an error final), not the device's stall timer.
        assert any("stopped mid-turn" in f for f in record.fallbacks), record.fallbacks
        stream = agent.generate(PROMPT, max_tokens=30, preset="cloud_only")
        text = "".join(c.text for c in stream)
    assert stream.result is not None and stream.result.error is None
    assert text == greedy_generate(plane.reference, PROMPT, 30).text


def test_the_executor_killed_mid_sse_stream_ends_it_with_an_error_event(plane: Plane) -> None:
    """The openai client's stream ends with the hub's error (no hang, no [DONE] as if whole);
    a try whose turn ended before the kill landed is made again."""
    client = openai.OpenAI(base_url=f"{plane.http}/v1", api_key="unused", timeout=WAIT_S)
    failure = None
    for _ in range(5):
        plane.ready()
        pid, restarts = plane.executor_pid(), plane.restarts()
        stream = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=LONG, temperature=0, stream=True
        )
        events = iter(stream)
        first = next(events)
        os.kill(pid, signal.SIGKILL)
        try:
            parts = [first.choices[0].text] + [e.choices[0].text for e in events if e.choices]
        except openai.APIError as e:  # kills: the lost connection's error update not delivered
            failure = e
            break
        finally:
            plane.serving_again(restarts)
        assert "".join(parts) == greedy_generate(plane.reference, PROMPT, LONG).text
    assert failure is not None, "no try was caught mid-stream"
    assert "stopped mid-turn" in str(failure)
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0)
    assert answer.choices[0].text == greedy_generate(plane.reference, PROMPT, 20).text


def test_readiness_names_the_mqtt_ingress_that_lost_its_language_executor(plane: Plane) -> None:
    """While the executor is dead (its supervisor held, so none is started again) the HTTP
    ingress answers 503 naming the MQTT ingresses' lost connection too, not only its own
    (it used to say ready while the MQTT ingresses still had no executor to send to)."""
    plane.ready()
    pid, restarts = plane.executor_pid(), plane.restarts()
    os.kill(plane.hub.pid, signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)
        said: list[str] = []

        def names_mqtt() -> bool:
            answer = httpx.get(f"{plane.http}/v2/health/ready")
            said[:] = [answer.text]
            return answer.status_code == 503 and "an MQTT ingress cannot reach" in answer.text

        wait_until(names_mqtt, timeout_s=WAIT_S, what="readiness naming the MQTT ingress")
        assert "language model tiny" in said[0]
    finally:
        os.kill(plane.hub.pid, signal.SIGCONT)
    plane.serving_again(restarts)


def test_twenty_turns_with_the_executor_killed_in_five_lose_and_repeat_nothing(
    plane: Plane,
) -> None:
    """A device's prefer_cloud turns in a row, the executor SIGKILLed after the first chunk
    of every fourth: every turn has a result with its text, none an error, no chunk twice
    (indexes unique and contiguous), the hub's text a prefix of its greedy text; a turn
    the kill spared is the hub's whole. Readiness is awaited after each kill only."""
    hub_text = greedy_generate(plane.reference, PROMPT, LONG).text
    turns = []
    with plane.agent("plane-phone-6") as agent:
        for i in range(20):
            kill = i % 4 == 1
            pid, restarts = (plane.executor_pid(), plane.restarts()) if kill else (0, 0.0)
            stream = agent.generate(PROMPT, max_tokens=LONG if kill else 30, preset="prefer_cloud")
            chunks = [next(stream)]
            if kill:
                os.kill(pid, signal.SIGKILL)
            chunks += list(stream)
            if kill:
                plane.serving_again(restarts)
            turns.append((kill, chunks, stream.result))
    for kill, chunks, record in turns:
        assert record is not None and record.error is None and record.text
        assert record.text == "".join(c.text for c in chunks)
        assert [c.index for c in chunks] == list(range(len(chunks)))
        sources = [c.source for c in chunks]
        assert sources == sorted(sources, key=lambda s: s != Source.CLOUD)
        assert hub_text.startswith("".join(c.text for c in chunks if c.source is Source.CLOUD))
        if not kill:
            assert not record.degraded and record.text == hub_text[: len(record.text)]
            assert len(record.output_ids) == 30
    assert any(record.degraded for _, _, record in turns), "no kill caught a turn mid-stream"


def test_a_speculative_turn_over_the_plane_is_the_hub_model_s_greedy_text(plane: Plane) -> None:
    """The MQTT ingress verifies the device's drafts (its own ONNX Runtime session over the
    repository's folder) and keeps the session: the text is the hub model's greedy text."""
    with plane.agent("plane-spec-1") as agent:
        record = agent.generate(PROMPT, max_tokens=30, preset="speculative").final()
    expected = greedy_generate(plane.reference, PROMPT, 30)
    assert record.output_ids == tuple(expected.tokens) and record.text == expected.text
    assert not record.degraded and record.speculation is not None
    assert record.speculation.rounds >= 1 and record.hub is not None
    assert ".m" in record.hub  # the ingress process's own id: its later rounds came to it
