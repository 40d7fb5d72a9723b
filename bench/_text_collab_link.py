"""The harness of bench part i: a hub, a broker, and a device behind a delayed link.

``CollabHarness`` holds what every row of the part shares: the language pair,
the held-out prompts, a Mosquitto on loopback and one hub (an embedded
``cloud_hub.Hub`` in a process of its own, ``bench._text_stream_server``,
which also logs each turn's time per token at its engine). ``harness.link(
rtt_ms)`` opens a ``Link``: a ``DelayRelay`` holding every byte for half the
round trip each way between the broker and an ``EdgeAgent`` (the device), so
only the device's side of the link is delayed::

    device (EdgeAgent) -> DelayRelay(rtt/2 each way) -> Mosquitto <- hub

Everything runs on loopback in one network namespace: the delay is made in
user space (this kernel has no ``sch_netem``), so namespaces would add nothing.
``Link.turns(preset)`` runs every prompt once under a preset and times it at
the client (``Turn``). A row of the part is a function ``(harness, link) ->
dict``; see ``bench.text_collab``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._delay_relay import DelayRelay

__all__ = ["CollabHarness", "Link", "Turn"]

DEVICE = "bench-phone-collab"


@dataclass(frozen=True)
class Turn:
    """One turn as the device's caller saw it; times in seconds from the call."""

    preset: str
    prompt_tokens: int
    ttft_s: float | None  # to the first text chunk
    e2e_s: float  # to the stream's end (the record is there)
    tokens: int
    edge_tokens: int
    cloud_tokens: int
    text: str
    degraded: bool
    error: str | None
    speculation: dict[str, Any] | None = None  # the record's SpecStats (speculative turns)


@dataclass
class Link:
    """An ``EdgeAgent`` whose broker connection crosses a ``DelayRelay`` of ``rtt_ms``."""

    rtt_ms: float
    agent: Any
    relay: DelayRelay
    max_tokens: int
    prompts: Sequence[Any]
    results: dict[str, Any] = field(default_factory=dict)  # the rows run so far on this link

    def turn(self, prompt: Any, preset: str) -> Turn:
        started = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        stream = self.agent.generate(prompt.text, max_tokens=self.max_tokens, preset=preset)
        for chunk in stream:
            if first is None and chunk.text:
                first = time.perf_counter() - started
            parts.append(chunk.text)
        ended = time.perf_counter() - started
        record = stream.result
        if record is None:
            raise RuntimeError(f"a {preset} turn ended without its record")
        return Turn(
            preset=preset, prompt_tokens=len(prompt.prompt_ids), ttft_s=first, e2e_s=ended,
            tokens=record.edge_tokens + record.cloud_tokens, edge_tokens=record.edge_tokens,
            cloud_tokens=record.cloud_tokens, text="".join(parts), degraded=record.degraded,
            error=record.error, speculation=_spec_stats(record),
        )  # fmt: skip

    def mqtt_round_trips(self, n: int = 20) -> list[float]:
        """Seconds for a message from a client behind the relay to the broker and back to the
        same client (QoS 0, subscribed to its own topic), ``n`` times after one warm-up:
        the link's own round trip, which the relay should lengthen by ``rtt_ms``."""
        import queue
        import threading

        import paho.mqtt.client as mqtt

        topic = f"bench/ping/{uuid.uuid4().hex[:8]}"
        got: queue.SimpleQueue[float] = queue.SimpleQueue()
        client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             client_id=f"bench-ping-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)  # fmt: skip
        subscribed = threading.Event()
        client.on_connect = lambda c, *_: c.subscribe(topic, qos=0)
        client.on_subscribe = lambda *_: subscribed.set()
        client.on_message = lambda *_: got.put(time.perf_counter())
        client.connect("127.0.0.1", self.relay.port)
        client.loop_start()
        try:
            if not subscribed.wait(30):
                raise RuntimeError("the ping client could not subscribe through the relay")
            times = []
            for _ in range(n + 1):
                sent = time.perf_counter()
                client.publish(topic, b"ping", qos=0)
                times.append(got.get(timeout=30) - sent)
            return times[1:]
        finally:
            client.disconnect()
            client.loop_stop()

    def turns(self, preset: str) -> list[Turn]:
        """Every prompt once under ``preset``, after one unmeasured warm-up turn."""
        self.turn(self.prompts[0], preset)
        return [self.turn(p, preset) for p in self.prompts]


def _spec_stats(record: Any) -> dict[str, Any] | None:
    """A speculative turn's ``SpecStats`` as a plain dict (None for other presets)."""
    import dataclasses

    stats = getattr(record, "speculation", None)
    return None if stats is None else dataclasses.asdict(stats)


@dataclass
class CollabHarness:
    """The pair, the prompts and the running broker and hub; ``link(rtt_ms)`` per round trip."""

    models: Any  # tandem.demo.language.LanguageModels
    prompts: Sequence[Any]  # HeldoutPrompt
    max_tokens: int
    broker_url: str
    broker_port: int
    prefix: str
    engine_log: Path
    notes: list[str] = field(default_factory=list)
    quality: dict[str, Any] | None = None  # the handoff+budget measure, link-independent

    @contextlib.contextmanager
    def link(self, rtt_ms: float) -> Iterator[Link]:
        from edge_agent import EdgeAgent
        from shared import Topics

        from ._text_plane import MODEL

        with DelayRelay("127.0.0.1", self.broker_port, rtt_ms / 2e3) as relay:
            agent = EdgeAgent(
                None, device_id=f"{DEVICE}-{uuid.uuid4().hex[:6]}", broker=relay.url,
                language_model=self.models.device_model, cloud_language_model=MODEL,
                topics=Topics(self.prefix),
            )  # fmt: skip
            with agent:
                yield Link(rtt_ms, agent, relay, self.max_tokens, self.prompts)

    def engine_turns(self) -> int:
        """How many turns the hub's engine has finished so far."""
        if not self.engine_log.exists():
            return 0
        return sum(1 for line in self.engine_log.read_text().splitlines() if line.strip())

    def engine_tpots(self, since: int) -> list[float]:
        """Time per token at the hub's engine of the turns after the first ``since``."""
        import json

        if not self.engine_log.exists():
            return []
        lines = [line for line in self.engine_log.read_text().splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines[since:]]
        return [float(r["tpot_s"]) for r in rows if r.get("tpot_s")]


@contextlib.contextmanager
def serving(
    models: Any, prompts: Sequence[Any], max_tokens: int, work: Path
) -> Iterator[CollabHarness]:
    """A Mosquitto and the hub serving ``models.hub_model`` (MQTT chunks coalesced as shipped)."""
    from ._procs import BrokerProcess
    from ._text_plane import language_repo
    from .text_stream_tpot import _StreamServer

    repo = language_repo(work, models.hub_model, max_tokens)
    prefix = f"tandem/{uuid.uuid4().hex[:8]}/v1"
    with BrokerProcess(work).start() as broker:
        server = _StreamServer(repo, broker.url, prefix, 0.02, work)
        with server.start():
            yield CollabHarness(
                models=models, prompts=prompts, max_tokens=max_tokens, broker_url=broker.url,
                broker_port=broker.port, prefix=prefix, engine_log=server.engine_log,
            )  # fmt: skip
