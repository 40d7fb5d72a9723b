"""What a new user did in their first hour with the edge SDK, each mistake staged for real.

Every case here reproduces one report of issue 14 against a real hub or a
real broker: NaN and infinity in the input, an empty batch, a wrongly shaped
input on a device without a local model, a forgotten or mistyped
``cloud_model``, a broker that is not there when ``start()`` runs, and a hub
that comes back while the breaker is open.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud_hub import Hub
from edge_agent import (
    AsyncEdgeAgent,
    BreakerState,
    CircuitBreaker,
    EdgeAgent,
    InferenceResult,
    InvalidInputError,
    NoAnswerError,
    OffloadPolicy,
    Source,
)
from edge_agent.runtimes import load_runtime
from shared import MqttSettings, Topics

from ._brokers import MosquittoProcess, free_port
from ._models import write_linear_classifier
from ._responder import Responder
from .test_edge_agent import cloud_answer, sample


def _wait_for(condition: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``condition()`` until true (a condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def hub(tmp_path: Path, mosquitto: MosquittoProcess) -> Iterator[tuple[MqttSettings, Topics]]:
    """A real hub serving ``linear`` (x FP32[?, 16] -> logits FP32[?, 4]) on its own prefix."""
    repo = tmp_path / "repo"
    write_linear_classifier(repo / "linear" / "1" / "model.onnx", seed=1)
    (repo / "linear" / "config.json").write_text(json.dumps({"max_queue_delay_ms": 0}))
    settings = MqttSettings.from_url(mosquitto.url)
    topics = Topics(f"first-hour/{tmp_path.name}")
    with Hub(repo, mqtt=settings, topics=topics, share_group=None):
        yield settings, topics


# -- NaN, infinity, empty batches: refused before anything runs --------------------------------


@pytest.mark.parametrize(
    ("poison", "count", "nan"),
    [
        (lambda x: x.__setitem__((0, 3), np.nan), 1, 1),  # one NaN pixel
        (lambda x: x.fill(np.nan), 16, 16),  # an all-NaN image
        (lambda x: x.__setitem__((0, slice(0, 2)), [np.inf, -np.inf]), 2, 0),
    ],
    ids=["one-nan", "all-nan", "inf"],
)
def test_non_finite_input_is_refused_naming_the_tensor_and_the_count(
    linear_onnx: Path, poison: object, count: int, nan: int
) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    x = sample()
    poison(x)  # type: ignore[operator]
    with EdgeAgent(runtime, device_id="nan-1", policy=OffloadPolicy.budget(0.2)) as agent:
        with pytest.raises(InvalidInputError) as caught:
            agent.infer(x)
        with pytest.raises(InvalidInputError):  # the mapping form too
            agent.infer({"x": x})
        assert agent.stats.requests == 0
    message = str(caught.value)
    assert "'x'" in message and f"{count} non-finite" in message and f"{nan} NaN" in message


def test_non_finite_input_passes_when_the_agent_allows_it(linear_onnx: Path) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    x = sample()
    x[0, 0] = np.nan
    with EdgeAgent(
        runtime, device_id="nan-2", policy=OffloadPolicy.always_local(), allow_non_finite=True
    ) as agent:
        result = agent.infer(x)
    assert result.source is Source.EDGE and np.isnan(result.output).any()


def test_a_cloud_only_device_refuses_nan_without_sending_it(
    mosquitto: MosquittoProcess,
) -> None:
    x = sample()
    x[0, 5] = np.nan
    agent = EdgeAgent(
        None, device_id="nan-3", broker=mosquitto.url, cloud_model="linear", input_name="x"
    )
    with (
        Responder(mosquitto.url, cloud_answer) as responder,
        agent,
        pytest.raises(InvalidInputError, match="1 non-finite"),
    ):
        agent.infer(x, deadline_ms=2000)
    assert responder.requests == []


def test_an_empty_batch_is_a_typed_error_not_a_numpy_one(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    empty = np.zeros((0, 16), np.float32)
    empty_error = r"'x' is empty \(shape \[0, 16\]\)"
    local = EdgeAgent(runtime, device_id="empty-1", policy=OffloadPolicy.budget(0.2))
    with local, pytest.raises(InvalidInputError, match=empty_error):
        local.infer(empty)
    cloud_only = EdgeAgent(
        None, device_id="empty-2", broker=mosquitto.url, cloud_model="linear", input_name="x"
    )
    with (
        Responder(mosquitto.url, cloud_answer) as responder,
        cloud_only,
        pytest.raises(InvalidInputError, match=empty_error),
    ):
        cloud_only.infer(empty, deadline_ms=2000)
    assert responder.requests == []


def test_calibrating_on_no_samples_says_so(linear_onnx: Path) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(runtime, device_id="empty-3", policy=OffloadPolicy.budget(0.2))
    with agent, pytest.raises(ValueError, match="at least one sample"):
        agent.calibrate(np.zeros((0, 16), np.float32))


# -- errors that blame the right thing --------------------------------------------------------


def test_wrong_shape_without_a_local_model_is_an_input_error_from_the_hub(
    hub: tuple[MqttSettings, Topics],
) -> None:
    settings, topics = hub
    agent = EdgeAgent(
        None,
        device_id="shape-1",
        broker=settings,
        topics=topics,
        cloud_model="linear",
        input_name="x",
    )
    with agent:
        right = agent.infer(sample(), deadline_ms=5000)
        with pytest.raises(InvalidInputError, match="refused the input for model 'linear'") as e:
            agent.infer(np.zeros((1, 15), np.float32), deadline_ms=5000)
    assert right.source is Source.CLOUD
    assert "15" in str(e.value)  # the hub's own words about the shape reach the caller
    assert not isinstance(e.value, NoAnswerError)


def test_a_mistyped_cloud_model_is_reported_once_at_start(
    linear_onnx: Path, hub: tuple[MqttSettings, Topics], caplog: pytest.LogCaptureFixture
) -> None:
    settings, topics = hub
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(
        runtime, device_id="typo-1", broker=settings, topics=topics, cloud_model="lineer"
    )
    with caplog.at_level(logging.ERROR, logger="tandem.edge"), agent:
        assert agent.cloud_probe is not None
        assert agent.cloud_probe.answered.wait(10)
        results = [agent.infer(sample(), deadline_ms=5000) for _ in range(2)]
    assert agent.cloud_probe.served is False
    errors = [r for r in caplog.records if "does not serve model 'lineer'" in r.getMessage()]
    assert len(errors) == 1 and "as cloud_model= says" in errors[0].getMessage()
    # Requests still get answers (the uncertain ones fall back), never an exception.
    assert all(r.source in (Source.EDGE, Source.EDGE_FALLBACK) for r in results)


def test_a_forgotten_cloud_model_says_which_name_it_used(
    tmp_path: Path, hub: tuple[MqttSettings, Topics], caplog: pytest.LogCaptureFixture
) -> None:
    settings, topics = hub
    # The user's edge model file is called mnist-int8.onnx; the hub serves "linear".
    edge = write_linear_classifier(tmp_path / "mnist-int8.onnx")
    agent = EdgeAgent(edge, device_id="forgot-1", broker=settings, topics=topics)
    with caplog.at_level(logging.ERROR, logger="tandem.edge"), agent:
        assert agent.cloud_probe is not None and agent.cloud_probe.answered.wait(10)
    (line,) = [r.getMessage() for r in caplog.records if "does not serve" in r.getMessage()]
    assert "'mnist-int8'" in line and "cloud_model was not given" in line


def test_a_served_cloud_model_passes_the_probe_silently(
    linear_onnx: Path, hub: tuple[MqttSettings, Topics], caplog: pytest.LogCaptureFixture
) -> None:
    settings, topics = hub
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(runtime, device_id="ok-1", broker=settings, topics=topics)
    with caplog.at_level(logging.WARNING, logger="tandem.edge"), agent:
        assert agent.cloud_probe is not None and agent.cloud_probe.answered.wait(10)
    assert agent.cloud_probe.served is True
    assert not [r for r in caplog.records if r.name == "tandem.edge"]


def test_probe_cloud_false_sends_no_probe(linear_onnx: Path, mosquitto: MosquittoProcess) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(
        runtime,
        device_id="quiet-1",
        broker=mosquitto.url,
        policy=OffloadPolicy.always_cloud(),
        probe_cloud=False,
    )
    with Responder(mosquitto.url, cloud_answer) as responder, agent:
        assert agent.infer(sample(), deadline_ms=5000).source is Source.CLOUD
    assert agent.cloud_probe is None
    assert responder.probes == [] and len(responder.requests) == 1


def test_a_cloud_only_call_for_a_model_the_hub_lacks_says_so(
    hub: tuple[MqttSettings, Topics],
) -> None:
    settings, topics = hub
    agent = EdgeAgent(
        None, device_id="lack-1", broker=settings, topics=topics, cloud_model="nope", input_name="x"
    )
    with agent, pytest.raises(NoAnswerError, match="hub does not serve it"):
        agent.infer(sample(), deadline_ms=5000)


def test_a_fresh_device_without_cloud_settings_is_told_what_to_give(tmp_path: Path) -> None:
    from edge_agent import ModelUpdater
    from shared import SigningKey

    keys = [SigningKey.generate().public_key]  # pinned at provisioning
    runtime = ModelUpdater.bootstrap(tmp_path / "models", keys, "mnist-edge")
    assert runtime is None  # nothing installed yet
    with pytest.raises(ValueError, match=r"broker= and cloud_model=") as e:
        EdgeAgent(runtime, device_id="fresh-1")
    assert "ModelUpdater.bootstrap returns None" in str(e.value)


# -- a broker that is not there at start -----------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("local_model", [True, False], ids=["local-model", "cloud-only"])
def test_start_without_a_broker_returns_at_the_first_failed_try_and_says_so(
    linear_onnx: Path, caplog: pytest.LogCaptureFixture, local_model: bool
) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    runtime = load_runtime(linear_onnx, name="linear") if local_model else None
    agent = EdgeAgent(
        runtime,
        device_id="away-1",
        broker=url,
        cloud_model="linear",
        input_name="x",
        policy=OffloadPolicy.always_cloud(),
    )
    with caplog.at_level(logging.WARNING, logger="tandem.edge"):
        agent.start(wait_s=600)  # returns when the first attempt fails, not after 600 s
    try:
        (line,) = [r.getMessage() for r in caplog.records if url in r.getMessage()]
        assert "unreachable" in line and "retrying in the background" in line
        if local_model:
            assert "answering locally meanwhile" in line
            assert agent.infer(sample(), deadline_ms=200).source is Source.EDGE_FALLBACK
        else:
            assert "NoAnswerError until it connects" in line
            with pytest.raises(NoAnswerError):
                agent.infer(sample(), deadline_ms=200)
    finally:
        agent.close()


@pytest.mark.timeout(60)
def test_async_start_without_a_broker_says_so_too(
    linear_onnx: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    url = f"mqtt://127.0.0.1:{free_port()}"
    runtime = load_runtime(linear_onnx, name="linear")

    async def main() -> None:
        agent = AsyncEdgeAgent(runtime, device_id="away-2", broker=url, cloud_model="linear")
        await agent.start(wait_s=600)
        await agent.close()

    with caplog.at_level(logging.WARNING, logger="tandem.edge"):
        asyncio.run(main())
    assert [r for r in caplog.records if "answering locally meanwhile" in r.getMessage()]


# -- fallbacks by the deadline, without locking the cloud out ------------------------------------


def test_one_long_stall_does_not_keep_the_cloud_from_being_tried(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(
        runtime, device_id="stall-1", broker=mosquitto.url, policy=OffloadPolicy.always_cloud()
    )
    with Responder(mosquitto.url, cloud_answer) as responder, agent:
        agent.wake_lateness_ms.observe(10_000.0)  # a wait once woke ten seconds late
        result = agent.infer(sample(), deadline_ms=2000)
    assert result.source is Source.CLOUD  # not fallback:no_time: the reserve is capped
    assert 0 < (responder.requests[0].timeout_ms or 0) <= 2000 * 0.75


def test_how_late_waits_woke_fades_with_time() -> None:
    from edge_agent._estimator import DecayingMax

    now = [0.0]
    high = DecayingMax(half_life_s=2.0, clock=lambda: now[0])
    assert high.get() == 0.0
    high.observe(40.0)
    high.observe(1.0)  # smaller: the 40 stands, fading
    now[0] = 2.0
    assert high.get() == pytest.approx(20.0)
    now[0] = 20.0
    assert high.get() < 0.1  # ten half-lives: gone, with no sample needed to push it out


# -- a hub that comes back while the breaker is open -------------------------------------------


def _opened_breaker() -> CircuitBreaker:
    # A cool-down far longer than the test: only hearing from the hub can end it.
    return CircuitBreaker(failure_threshold=2, cooldown_s=300.0, max_cooldown_s=300.0)


def test_a_broker_restart_ends_the_breakers_cool_down_at_a_probe_reply(
    linear_onnx: Path, own_mosquitto: MosquittoProcess
) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(
        runtime,
        device_id="back-1",
        broker=own_mosquitto.url,
        policy=OffloadPolicy.always_cloud(),
        breaker=_opened_breaker(),
    )
    uplink = agent.uplink
    assert uplink is not None
    with agent:
        with Responder(own_mosquitto.url, cloud_answer):
            assert agent.infer(sample(), deadline_ms=5000).source is Source.CLOUD
            own_mosquitto.stop()
            _wait_for(lambda: not uplink.connected, "the agent to notice")
            during = [agent.infer(sample(), deadline_ms=100).reason for _ in range(4)]
            assert agent.breaker.state is BreakerState.OPEN
            own_mosquitto.start()
            assert uplink.wait_connected(20)  # the device is back before the hub
        with Responder(own_mosquitto.url, cloud_answer):
            # The app keeps calling; a probe goes out at most every half second meanwhile.
            after: list[InferenceResult] = []
            _wait_for(
                lambda: (
                    after.append(agent.infer(sample(), deadline_ms=1000))
                    or after[-1].source is Source.CLOUD
                ),
                "an answer from the cloud",
            )
    assert during[-1] == "fallback:breaker_open"
    # Until then the local answer: every call answered, none raised.
    assert all(r.source is Source.EDGE_FALLBACK for r in after[:-1]), [r.reason for r in after]
    assert after[-1].source is Source.CLOUD and agent.breaker.state is BreakerState.CLOSED


def test_a_frozen_broker_thawing_ends_the_cool_down_at_the_first_late_reply(
    linear_onnx: Path, own_mosquitto: MosquittoProcess
) -> None:
    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(
        runtime,
        device_id="thaw-1",
        broker=own_mosquitto.url,
        policy=OffloadPolicy.always_cloud(),
        breaker=_opened_breaker(),
    )
    process = own_mosquitto.process
    assert process is not None
    with Responder(own_mosquitto.url, cloud_answer), agent:
        assert agent.infer(sample(), deadline_ms=5000).source is Source.CLOUD
        os.kill(process.pid, signal.SIGSTOP)  # frozen: connections stay up, nothing moves
        try:
            frozen = [agent.infer(sample(), deadline_ms=100).reason for _ in range(3)]
            assert agent.breaker.state is BreakerState.OPEN
        finally:
            os.kill(process.pid, signal.SIGCONT)
        uplink = agent.uplink
        assert uplink is not None
        _wait_for(lambda: uplink.stats.late_replies >= 1, "the hub's late replies")
        assert agent.breaker.state is BreakerState.HALF_OPEN
        after = agent.infer(sample(), deadline_ms=5000)
    assert frozen[:2] == ["fallback:timeout"] * 2 and frozen[2] == "fallback:breaker_open"
    assert after.source is Source.CLOUD


def test_an_overloaded_hub_keeps_its_cool_down_when_heard_from(
    linear_onnx: Path, mosquitto: MosquittoProcess
) -> None:
    from .test_edge_agent import overloaded

    runtime = load_runtime(linear_onnx, name="linear")
    agent = EdgeAgent(
        runtime,
        device_id="busy-1",
        broker=mosquitto.url,
        policy=OffloadPolicy.always_cloud(),
        breaker=_opened_breaker(),
    )
    with Responder(mosquitto.url, overloaded) as responder, agent:
        assert agent.cloud_probe is not None and agent.cloud_probe.answered.wait(10)
        reasons = [agent.infer(sample(), deadline_ms=2000).reason for _ in range(3)]
        agent.cloud_probe.answered.clear()
        agent.cloud_probe.send()  # the hub answers the probe: it is there, but busy
        assert agent.cloud_probe.answered.wait(10)
        assert agent.breaker.state is BreakerState.OPEN
    assert len(responder.probes) == 2
    assert reasons == ["fallback:overloaded"] * 2 + ["fallback:breaker_open"]
