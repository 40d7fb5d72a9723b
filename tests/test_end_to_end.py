"""Edge agents and a real hub over real brokers: answers, fallbacks, a hub that dies."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from cloud_hub import Hub
from edge_agent import CircuitBreaker, EdgeAgent, InferenceResult, OffloadPolicy, Source
from edge_agent.runtimes import load_runtime
from shared import MqttSettings, Topics, create_client

from ._brokers import MosquittoProcess
from ._hubs import HubProcess
from ._models import linear_classifier_weights, write_linear_classifier

W_EDGE, B_EDGE = linear_classifier_weights(seed=0)
W_CLOUD, B_CLOUD = linear_classifier_weights(seed=1)


def write_repo(root: Path, **config: object) -> Path:
    write_linear_classifier(root / "linear" / "1" / "model.onnx", seed=1)
    (root / "linear" / "config.json").write_text(json.dumps(config))
    return root


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)


def agent_for(
    linear_onnx: Path, settings: MqttSettings | str, device: str, topics: Topics, **kw: object
) -> EdgeAgent:
    runtime = load_runtime(linear_onnx, name="linear", version="e1")
    return EdgeAgent(
        runtime,
        device_id=device,
        broker=settings,
        topics=topics,
        policy=OffloadPolicy.always_cloud(),
        **kw,
    )  # type: ignore[arg-type]


def test_agents_get_the_hubs_answers_through_mosquitto(
    linear_onnx: Path, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    topics = Topics("e2e/mosq")
    settings = MqttSettings.from_url(mosquitto.url)
    repo = write_repo(tmp_path / "repo", max_batch_size=16, max_queue_delay_ms=2.0)
    x = rows(24)
    with Hub(repo, mqtt=settings, topics=topics, share_group="e2e") as hub:
        agents = [agent_for(linear_onnx, settings, f"d{i}", topics).start() for i in range(4)]
        results: list[InferenceResult | None] = [None] * len(x)

        def run(k: int) -> None:
            for i in range(k, len(x), len(agents)):
                results[i] = agents[k].infer(x[i : i + 1], deadline_ms=5000)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(agents))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for agent in agents:
            agent.close()
        stats = hub.metrics()
    assert all(r is not None and r.source is Source.CLOUD for r in results)
    got = np.concatenate([r.output for r in results if r is not None])
    np.testing.assert_allclose(got, x @ W_CLOUD + B_CLOUD, rtol=1e-4, atol=1e-4)
    assert {r.model_versions["cloud"] for r in results if r is not None} == {"linear@1"}
    assert sum(s.completed for s in stats.values()) == len(x)


def test_agents_and_hub_work_over_the_embedded_broker(linear_onnx: Path, tmp_path: Path) -> None:
    from tandem.broker import EmbeddedBroker

    topics = Topics("e2e/amqtt")
    repo = write_repo(tmp_path / "repo")
    with EmbeddedBroker() as broker:
        settings = MqttSettings.from_url(broker.url, protocol="3.1.1")
        # amqtt has no shared subscriptions: the hub subscribes plainly.
        with (
            Hub(repo, mqtt=settings, topics=topics, share_group=None),
            agent_for(linear_onnx, settings, "amqtt-dev", topics) as agent,
        ):
            x = rows(5, seed=2)
            results = [agent.infer(x[i : i + 1], deadline_ms=5000) for i in range(len(x))]
    assert [r.source for r in results] == [Source.CLOUD] * len(x)
    np.testing.assert_allclose(
        np.concatenate([r.output for r in results]), x @ W_CLOUD + B_CLOUD, rtol=1e-4, atol=1e-4
    )


@pytest.mark.slow
def test_hub_killed_mid_batch_requests_fall_back_and_a_restarted_hub_serves(
    linear_onnx: Path, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    topics = Topics("e2e/kill")
    repo = write_repo(tmp_path / "repo", max_batch_size=64, max_queue_delay_ms=5000.0)
    hub = HubProcess(
        repo, mosquitto.url, tmp_path / "hub.log", "--prefix", topics.prefix, "--no-share"
    )
    settings = MqttSettings.from_url(mosquitto.url)
    breaker = CircuitBreaker(failure_threshold=50, cooldown_s=0.2, max_cooldown_s=0.5)
    agent = agent_for(linear_onnx, settings, "kill-dev", topics, breaker=breaker)
    x = rows(1, seed=4)
    local = x @ W_EDGE + B_EDGE
    hub.start()
    try:
        with agent:
            _wait_until_subscribed(mosquitto, topics)
            # A frozen hub takes the requests off the broker and never answers: they are
            # all in its hands when it dies. (A long batching window no longer holds them
            # in its batcher: a lone request for an idle batcher is computed at once.)
            hub.freeze()
            results: list[InferenceResult] = []
            lock = threading.Lock()

            def call() -> None:
                r = agent.infer(x, deadline_ms=3000)
                with lock:
                    results.append(r)

            threads = [threading.Thread(target=call) for _ in range(8)]
            with _request_spy(mosquitto, topics) as routed:
                for t in threads:
                    t.start()
                # the broker routed all eight: to the spy, and in the same step to the hub
                assert routed.wait(8, timeout_s=30), "the requests never reached the broker"
            hub.kill()
            for t in threads:
                t.join()
            assert len(results) == 8
            assert {r.source for r in results} == {Source.EDGE_FALLBACK}
            assert {r.reason for r in results} == {"fallback:timeout"}
            for r in results:
                np.testing.assert_allclose(r.output, local, rtol=1e-5)

            (repo / "linear" / "config.json").write_text(json.dumps({"max_queue_delay_ms": 2.0}))
            hub.start()
            source = Source.EDGE_FALLBACK
            for _ in range(300):  # bounded; the new hub needs a moment to load and subscribe
                source = agent.infer(x, deadline_ms=1000).source
                if source is Source.CLOUD:
                    break
                time.sleep(0.1)
            assert source is Source.CLOUD, (tmp_path / "hub.log").read_text()
    finally:
        hub.stop()


class _Counter:
    def __init__(self) -> None:
        self.n = 0
        self._cond = threading.Condition()

    def add(self) -> None:
        with self._cond:
            self.n += 1
            self._cond.notify_all()

    def wait(self, n: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.n >= n, timeout_s)


@contextmanager
def _request_spy(mosquitto: MosquittoProcess, topics: Topics) -> Iterator[_Counter]:
    """A second subscriber to every request topic, counting what the broker routes."""
    settings = MqttSettings.from_url(mosquitto.url)
    client = create_client(settings, f"spy-{uuid.uuid4().hex[:8]}", protocol="3.1.1")
    routed, subscribed = _Counter(), threading.Event()
    filters = [(topics.device_infer_filter(), 0), (topics.infer_filter(), 0)]
    client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(filters)
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = lambda *_: routed.add()
    client.connect("127.0.0.1", settings.port)
    client.loop_start()
    try:
        assert subscribed.wait(30), "the spy never subscribed"
        yield routed
    finally:
        client.disconnect()
        client.loop_stop()


def _wait_until_subscribed(mosquitto: MosquittoProcess, topics: Topics) -> None:
    """Wait until the hub process answers a probe, so the test's requests reach it."""
    from ._hub_probe import wait_for_hub

    wait_for_hub(mosquitto.url, topics, model="linear", features=16)
