"""What every edge agent decides, without I/O: ``BaseAgent``.

``BaseAgent`` holds all the logic that does no I/O (input checks, the offload
decision, deadline arithmetic, fallback rules, building the result, stats);
its twins in ``_agent``, ``EdgeAgent`` (blocking) and ``AsyncEdgeAgent``
(asyncio), only run the model and wait for the hub, each in its own way, as
httpx's Client/AsyncClient do.

Invariants: every valid call returns an ``InferenceResult`` (the only error
for a valid request is ``NoAnswerError``, when the model is not on the device
and the cloud failed); an invalid one raises ``InvalidInputError`` naming
the problem, before anything runs (names, dtype, shape, size, an empty
batch, NaN or infinity unless ``allow_non_finite``), or, with no local model
to check it, when the hub refuses it for what it carries; the wait for the
cloud ends early enough to run the local model within the deadline when it
has not run yet (a slow run's time and how late waits wake are reserved,
see ``_cloud_wait_ms``); the cloud answer wins when
it arrives in time; a timeout, a lost broker, an open circuit breaker or an
``overloaded`` reply yields the local answer marked ``edge-fallback``.

Why the local answer stood in for the cloud's is a ``FallbackReason`` (see
``_outcome``); one try of the cloud ends in a typed ``CloudOutcome``.

Counting: ``stats`` counts answered calls of the whole agent; ``_serving``
(``ServingStats``) counts calls that ended on the edge model now serving,
answered or raised (``errors``: any exception ``infer`` raises, from invalid
input to a runtime failure to ``NoAnswerError``; not a cancelled async call),
offloads and agreement. Setting ``runtime`` (``swap_model`` does) starts new
counters; a call counts towards the model it started with. ``snapshot()``
is the public view of all counters that telemetry reads. The number of calls
running the local model (the queue depth that predicts local latency) is an
``InflightCounter``: every entry and exit counted under concurrent calls, no lock.

The local path is the hot path (its Python work is what the agent adds to a
runtime call): it builds only the objects it returns, reuses constant
decisions, takes one lock, and leaves sums and percentiles to the readers.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from shared import Limits, Message, MqttSettings, Topics, TracingSettings, TransferOptions

from ._breaker import CircuitBreaker
from ._call import Call
from ._cloud_probe import CloudProbe
from ._device_link import DeviceLink
from ._errors import EdgeError, InvalidInputError
from ._estimator import DecayingMax, LatencyEstimator, NetworkEstimator
from ._inflight import InflightCounter
from ._input_values import check_deadline, check_values
from ._outcome import (
    CloudAnswer,
    CloudOutcome,
    Fallback,
    FallbackReason,
    hub_unavailable,
    no_answer_error,
)
from ._policy import Decision, OffloadPolicy, RequestFacts
from ._report import AgentMetrics
from ._result import InferenceResult, LatencyBreakdown, Source
from ._sharing import ExampleSharing
from ._telemetry import AgentSnapshot, AgentStats, ServingStats, TelemetryRecorder, check_labels
from ._tracing import EdgeTracer, open_tracer, traced_send
from ._uplink import MqttUplink
from .language import LanguageRuntime, load_language_runtime
from .language._cloud import CloudTextSettings, TextLink
from .language._turn import CloudAccess
from .runtimes import ModelRuntime, load_runtime

__all__ = ["AgentStats", "BaseAgent", "Call"]

log = logging.getLogger("tandem.edge")

_EDGE = Source.EDGE
_CLOUD = Source.CLOUD
_now = time.perf_counter


class BaseAgent:
    """Everything an agent decides, without doing I/O."""

    def __init__(
        self,
        model: ModelRuntime | str | Path | None,
        *,
        device_id: str,
        broker: str | MqttSettings | None = None,
        policy: OffloadPolicy | None = None,
        cloud_model: str | None = None,
        cloud_version: str | None = None,
        input_name: str | None = None,
        default_deadline_ms: float = 1000.0,
        topics: Topics | None = None,
        transfer: TransferOptions | None = None,
        limits: Limits | None = None,
        breaker: CircuitBreaker | None = None,
        local_estimator: LatencyEstimator | None = None,
        network_estimator: NetworkEstimator | None = None,
        safety_margin_ms: float = 1.0,
        latency_window: int = 1024,
        labels: Mapping[str, str] | None = None,
        allow_non_finite: bool = False,
        probe_cloud: bool = True,
        share_answers: ExampleSharing | None = None,
        language_model: LanguageRuntime | str | Path | None = None,
        cloud_language_model: str | None = None,
        cloud_text: CloudTextSettings | None = None,
        tracing: TracingSettings | bool | None = None,
    ) -> None:
        self.labels = check_labels(labels)  # reported in telemetry, e.g. {"site": "factory-a"}
        self.share_answers = share_answers  # may be set or cleared while the agent runs
        self._latency_window = latency_window
        self.runtime = load_runtime(model) if isinstance(model, str | Path) else model
        # The text model (generate/chat); None on an agent that serves tensors only.
        self.language: LanguageRuntime | None = (
            load_language_runtime(language_model)
            if isinstance(language_model, str | Path)
            else language_model
        )
        no_cloud = cloud_model is None or broker is None
        if self.runtime is None and self.language is None and no_cloud:
            raise ValueError(
                "no local model (on a fresh device, ModelUpdater.bootstrap returns None until "
                "the first install), so the agent answers from the cloud: give broker= and "
                "cloud_model= (the hub's model name), and input_name= to call it with an array"
            )
        default_deadline_ms = check_deadline(default_deadline_ms, "default_deadline_ms")
        self.device_id = device_id
        # Without cloud_model the hub is asked for the edge model's name; the probe sent on
        # connect says so in one line if the hub serves no such model.
        self.cloud_model = cloud_model or (self.runtime.name if self.runtime else "")
        self.allow_non_finite = allow_non_finite  # NaN/inf inputs pass (models that take them)
        self.cloud_version = cloud_version
        self.input_name = input_name
        self.default_deadline_ms = default_deadline_ms
        self.safety_margin_ms = safety_margin_ms
        if policy is None:
            policy = (
                OffloadPolicy.budget(0.2) if broker is not None else OffloadPolicy.always_local()
            )
        self.policy = policy
        self.breaker = breaker or CircuitBreaker()
        self.local_estimator = local_estimator or LatencyEstimator()
        # How much later than asked a wait for the cloud returned (ms): the thread must be
        # scheduled again and take the GIL, which on a busy device costs milliseconds.
        self.wake_lateness_ms = DecayingMax(half_life_s=2.0)
        self.network_estimator = network_estimator or NetworkEstimator()
        # Answered calls by (source, reason, deadline met): one increment per call; the
        # totals ``stats`` reports are summed when read.
        self._answers: Counter[tuple[Source, str, bool]] = Counter()
        self._offload_attempts = 0
        self._stats_lock = threading.Lock()
        # Request ids: a random per-instance prefix and a counter (a uuid per call cost
        # more than the rest of the local path's bookkeeping); unique on this device's
        # reply topic across restarts, which is all correlation needs.
        self._id_prefix = secrets.token_hex(6)
        self._ids = itertools.count(1)
        self.telemetry = TelemetryRecorder(window=latency_window)
        # Spans of every call (``_tracing``); None: tracing off, and calls skip it entirely.
        self._tracer: EdgeTracer | None = open_tracer(tracing, device_id, self.cloud_model)
        self._local_inflight = InflightCounter()
        self.uplink: MqttUplink | None = None
        self.cloud_probe: CloudProbe | None = None
        if broker is not None:
            settings = broker if isinstance(broker, MqttSettings) else MqttSettings.from_url(broker)
            self._attach_uplink(
                MqttUplink(
                    settings, device_id=device_id, topics=topics, transfer=transfer, limits=limits
                ),
                cloud_model_given=cloud_model is not None,
                probe=probe_cloud and bool(self.cloud_model),  # a text-only agent has none
            )
        # Text offload: the hub's language model by name, over the same link.
        self._cloud_text: CloudAccess | None = None
        if cloud_language_model is not None and self.uplink is not None:
            self._cloud_text = CloudAccess.open(
                self.uplink.link, device_id, cloud_language_model, topics=topics, limits=limits,
                settings=cloud_text,
            )  # fmt: skip

    @property
    def text_link(self) -> TextLink | None:
        """The device's text topics on its link, when text may go to the hub."""
        return None if self._cloud_text is None else self._cloud_text.link

    @property
    def text_offload_available(self) -> bool:
        """Whether text turns may go to the hub (a broker and ``cloud_language_model``)."""
        return self._cloud_text is not None

    def _attach_uplink(self, uplink: MqttUplink, *, cloud_model_given: bool, probe: bool) -> None:
        """Use ``uplink``; late replies heard by the breaker; with ``probe``, hub probes.

        ``probe_cloud=False`` sends none (each costs the hub a failed-request count).
        """
        cloud_probe = CloudProbe(
            uplink,
            self.breaker,
            model=self.cloud_model,
            version=self.cloud_version,
            id_prefix=self._id_prefix,
            defaulted=not cloud_model_given,
        )
        uplink.on_late_reply = self._late_reply
        self.uplink = uplink
        if probe:
            uplink.on_connected = cloud_probe.send
            self.cloud_probe = cloud_probe

    @property
    def link(self) -> DeviceLink | None:
        """The device's one MQTT connection (the uplink's; an updater shares it), or None."""
        return self.uplink.link if self.uplink is not None else None

    @property
    def runtime(self) -> ModelRuntime | None:
        """The edge model serving new calls (``None``: no local model)."""
        return self._serving.runtime

    @runtime.setter
    def runtime(self, runtime: ModelRuntime | None) -> None:
        # One assignment: a call reads the runtime and its counters together.
        self._serving = ServingStats(runtime, window=self._latency_window)

    @property
    def stats(self) -> AgentStats:
        """Counts of answered calls since the agent started; each read is a new snapshot."""
        with self._stats_lock:
            answers = list(self._answers.items())
            stats = AgentStats(offload_attempts=self._offload_attempts)
        for (source, reason, met), n in answers:
            stats.requests += n
            stats.by_source[str(source)] += n
            stats.by_reason[str(reason)] += n  # plain strings: a FallbackReason is one too
            if not met:
                stats.deadline_misses += n
        return stats

    # -- the pure steps ----------------------------------------------------------------------

    def _begin(
        self,
        serving: ServingStats,
        inputs: Mapping[str, np.ndarray] | np.ndarray,
        deadline_ms: float | None,
    ) -> Call:
        started = _now()
        runtime = serving.runtime
        if runtime is None:
            named = self._name_inputs(inputs, None)
        elif type(inputs) is np.ndarray:
            named = runtime.validate_array(inputs)
        else:
            named = runtime.validate(self._name_inputs(inputs, runtime))
        check_values(named, allow_non_finite=self.allow_non_finite)
        deadline = self.default_deadline_ms if deadline_ms is None else check_deadline(deadline_ms)
        return Call(
            f"{self._id_prefix}{next(self._ids):x}", named, deadline, started, runtime, serving
        )

    def _failed(self, serving: ServingStats) -> None:
        """A call on ``serving``'s model raised to its caller."""
        with self._stats_lock:
            serving.requests += 1
            serving.errors += 1

    def _name_inputs(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, runtime: ModelRuntime | None
    ) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if not isinstance(inputs, np.ndarray):
            raise InvalidInputError(
                "inputs must be a numpy array or a mapping of name to array, "
                f"got {type(inputs).__name__}"
            )
        if runtime is not None:
            specs = runtime.inputs
            if len(specs) != 1:
                raise InvalidInputError(
                    f"model {runtime.name!r} has {len(specs)} inputs; pass a mapping of "
                    f"name to array ({', '.join(s.name for s in specs)})"
                )
            return {specs[0].name: inputs}
        if self.input_name is None:
            raise InvalidInputError("pass a mapping of name to array, or set input_name=")
        return {self.input_name: inputs}

    def _route_before(self, call: Call) -> Decision:
        policy = self.policy
        decision = policy.fixed_route(local_model=call.runtime is not None)
        if decision is not None:
            return decision
        facts = RequestFacts(
            payload_bytes=call.payload_bytes,
            deadline_ms=call.deadline_ms,
            local_model=call.runtime is not None,
            queue_depth=self._local_inflight.value,
        )
        return policy.before(facts, self.local_estimator, self.network_estimator)

    def _route_after(self, call: Call) -> Decision:
        assert call.local_outputs is not None
        policy = self.policy
        uncertain = policy.uncertain
        if uncertain is None:
            return policy.after(None)  # no score: call.score stays None
        decision = policy.after(
            uncertain.scores(call.local_outputs, call.inputs if uncertain.uses_inputs else None)
        )
        call.score = decision.score
        return decision

    def _local_done(self, call: Call, outputs: dict[str, np.ndarray], local_ms: float) -> None:
        call.local_outputs = outputs
        call.local_ms = local_ms
        self.local_estimator.observe(local_ms)

    def _cloud_wait_ms(self, call: Call) -> float | Fallback:
        """How long the cloud may take, or why it must not be tried now; sets ``wake_at``.

        Held back from the deadline: the safety margin, how late recent waits
        woke up (the largest, halved every 2 s: a late wake-up means a busy
        device, which lasts a while; capped at a quarter of the deadline, so
        one long stall cannot keep the cloud from being tried), and, when the
        local model has not run yet, a slow local run (the 97th percentile of
        recent ones, not the average: the run after a wait is often slower,
        and a fallback that ends late breaks its deadline).
        """
        if self.uplink is None:
            return Fallback(FallbackReason.NO_UPLINK)
        if not self.breaker.allow():
            if self.cloud_probe is not None:
                self.cloud_probe.on_breaker_open()
            return Fallback(FallbackReason.BREAKER_OPEN)
        lateness = min(self.wake_lateness_ms.get(), call.deadline_ms * 0.25)
        reserve = self.safety_margin_ms + lateness
        if call.local_outputs is None:
            reserve += self.local_estimator.predict_high_ms(self._local_inflight.value)
        now = _now()
        wait_ms = call.deadline_ms - (now - call.started) * 1000.0 - reserve
        if wait_ms <= 0:
            return Fallback(FallbackReason.NO_TIME)
        call.wake_at = now + wait_ms / 1000.0
        return wait_ms

    def _wait_left_s(self, call: Call) -> float:
        """Seconds left to wait once the request is out (sending took some of ``wait_ms``)."""
        return max(0.0, call.wake_at - _now())

    def _woke(self, call: Call) -> None:
        """A wait for the cloud ran out: learn how late this thread got back."""
        self.wake_lateness_ms.observe(max(0.0, (_now() - call.wake_at) * 1000.0))

    def _send(self, call: Call, wait_ms: float) -> Future[Message]:
        assert self.uplink is not None
        with self._stats_lock:
            self._offload_attempts += 1
            call.serving.offloads += 1
        sharing = self.share_answers
        send = functools.partial(
            self.uplink.send,
            model=self.cloud_model,
            tensors=call.inputs,
            timeout_ms=wait_ms,
            request_id=call.request_id,
            model_version=self.cloud_version,
            extra=None
            if sharing is None
            else sharing.header(call.serving.versions, call.local_outputs, call.score),
        )
        return send()[0] if call.trace is None else traced_send(call.trace, send)

    def _cloud_failed(self, call: Call, error: BaseException) -> Fallback:
        if isinstance(error, TimeoutError):
            self._woke(call)
        if self.uplink is not None:
            self.uplink.forget(call.request_id)
        self.breaker.record_failure()
        return Fallback(FallbackReason.for_exception(error))

    def _cloud_answered(self, call: Call, reply: Message, reason: str) -> CloudOutcome:
        """The result for a hub reply, or why the local answer must do when it is an error."""
        if not reply.ok:
            if hub_unavailable(reply.error):
                self.breaker.record_failure(answered=True)
            else:  # the hub is up but cannot take this request
                self.breaker.record_success()
                log.warning(
                    "hub rejected request %s: %s %s",
                    call.request_id,
                    reply.error,
                    reply.error_message,
                )
            return Fallback(FallbackReason.for_error(reply.error), reply.error_message)
        self.breaker.record_success()
        total_ms = call.elapsed_ms()
        timing = reply.reply_timing
        hub_ms = timing.total_ms
        round_trip_ms = total_ms - call.local_ms
        self.network_estimator.observe(
            total_ms=round_trip_ms, hub_ms=hub_ms, payload_bytes=call.payload_bytes
        )
        latency = LatencyBreakdown(
            total_ms=total_ms,
            local_ms=call.local_ms,
            network_ms=max(0.0, round_trip_ms - hub_ms),
            queue_ms=timing.queue_ms,
            cloud_compute_ms=timing.compute_ms,
        )
        versions = self._versions(call)
        versions["cloud"] = f"{reply.model}@{reply.model_version or '?'}"
        self.telemetry.cloud_version = versions["cloud"]
        if call.local_outputs is not None:
            compared, agreed = self.telemetry.compare(call.local_outputs, reply.tensors)
            if compared:
                with self._stats_lock:
                    call.serving.compared += compared
                    call.serving.agreed += agreed
        return CloudAnswer(self._finish(call, reply.tensors, _CLOUD, reason, latency, versions))

    def _fallback_result(self, call: Call, reason: FallbackReason) -> InferenceResult:
        assert call.local_outputs is not None
        latency = LatencyBreakdown(total_ms=call.elapsed_ms(), local_ms=call.local_ms)
        return self._finish(call, call.local_outputs, Source.EDGE_FALLBACK, reason, latency)

    def _no_answer(self, outcome: Fallback) -> EdgeError:
        """The error for a call with no local model whose cloud try failed."""
        return no_answer_error(self.cloud_model, outcome)

    def _late_reply(self, reply: Message) -> None:
        """A hub reply that came after its request gave up: the hub is there again."""
        if reply.ok:
            self.breaker.probe_now()

    def _uplink_started(self) -> None:
        """One line when ``start`` returns without a broker: what happens meanwhile."""
        uplink = self.uplink
        if uplink is None or uplink.connected:
            return
        if self.runtime is not None:
            meanwhile = (
                "answering locally meanwhile: requests that want the cloud get the local "
                "answer (fallback:broker_unavailable)"
            )
        else:
            meanwhile = "no local model, so requests raise NoAnswerError until it connects"
        log.warning(
            "broker %s %s; %s; retrying in the background",
            uplink.settings.url,
            uplink.connect_problem or "not connected yet",
            meanwhile,
        )

    def _edge_result(self, call: Call, reason: str) -> InferenceResult:
        assert call.local_outputs is not None
        latency = LatencyBreakdown((_now() - call.started) * 1000.0, call.local_ms)
        return self._finish(call, call.local_outputs, _EDGE, reason, latency)

    def _finish(
        self,
        call: Call,
        outputs: dict[str, np.ndarray],
        source: Source,
        reason: str,
        latency: LatencyBreakdown,
        versions: dict[str, str] | None = None,
    ) -> InferenceResult:
        total_ms = latency.total_ms
        met = total_ms <= call.deadline_ms
        serving = call.serving
        with self._stats_lock:
            self._answers[source, reason, met] += 1
            serving.requests += 1
        serving.latency.append(total_ms)
        self.telemetry.record_answer(
            total_ms, call.local_ms if call.local_outputs is not None else None, source is _CLOUD
        )
        if versions is None:
            versions = {"edge": serving.versions} if call.runtime is not None else {}
        return InferenceResult(
            outputs, source, call.request_id, reason, latency, versions, call.score, met
        )

    @staticmethod
    def _versions(call: Call) -> dict[str, str]:
        if call.runtime is None:
            return {}
        return {"edge": call.serving.versions}

    def snapshot(self) -> AgentSnapshot:
        """Counts, latency percentiles, agreement, model and link state, as of now."""
        stats = self.stats
        serving = self._serving
        counters = serving.counters(self._stats_lock)
        runtime = serving.runtime
        # A text-only agent reports its language model, so that the fleet (and a rollout's
        # target) knows which package version it runs.
        edge = runtime if runtime is not None else self.language
        recorder = self.telemetry
        latency = recorder.percentiles()
        rate, compared = recorder.agreement()
        uplink = self.uplink
        return AgentSnapshot(
            device_id=self.device_id,
            labels=dict(self.labels),
            stats=stats,
            serving=counters,
            edge_model=None if edge is None else edge.name,
            edge_version=None if edge is None else edge.version,
            edge_runtime=None if edge is None else edge.kind,
            edge_accelerator=None if edge is None else edge.accelerator,
            cloud_version=recorder.cloud_version,
            local_p50_ms=latency["local"][0],
            local_p99_ms=latency["local"][1],
            offloaded_p50_ms=latency["offloaded"][0],
            offloaded_p99_ms=latency["offloaded"][1],
            total_p50_ms=latency["total"][0],
            total_p99_ms=latency["total"][1],
            agreement_rate=rate,
            agreement_samples=compared,
            breaker_state=self.breaker.state,
            uplink_connected=uplink is not None and uplink.connected,
            local_inflight=self._local_inflight.value,
        )

    def metrics(self) -> AgentMetrics:
        """The telemetry document for ``snapshot()`` (what ``TelemetryReporter`` sends)."""
        return AgentMetrics.from_snapshot(self.snapshot())

    def swap_model(self, runtime: ModelRuntime) -> ModelRuntime | None:
        """Serve ``runtime`` from the next call on; returns the one it replaces.

        Calls already running finish on the model they started with, so no
        request sees a half-loaded model and none is dropped. The old runtime
        is not closed here: the caller closes it (or lets it go) once its
        in-flight calls are done.
        """
        old = self.runtime
        self.runtime = runtime  # new counters: telemetry reports this version from zero
        return old

    def swap_language(self, runtime: LanguageRuntime) -> LanguageRuntime | None:
        """Serve ``runtime`` for text from the next turn on; returns the one it replaces.

        As ``swap_model`` for tensors: a turn already streaming finishes on the
        model it started with; a ``Conversation`` whose kept state belongs to
        the old model re-prefills its history on its next turn. The caller
        closes the old runtime (or lets it go).
        """
        old = self.language
        self.language = runtime
        return old

    def calibrate(
        self, samples: np.ndarray | Mapping[str, np.ndarray], *, batch_size: int = 256
    ) -> float:
        """Run the local model on held-out samples and calibrate the policy's threshold."""
        runtime = self.runtime
        if runtime is None:
            raise ValueError("calibration needs a local model")
        named = self._name_inputs(samples, runtime)
        n = next(iter(named.values())).shape[0]
        if n == 0:
            raise ValueError("calibrate() needs at least one sample")
        batches = []
        for start in range(0, n, batch_size):
            chunk = {k: v[start : start + batch_size] for k, v in named.items()}
            batches.append(runtime.run(chunk))
        # One row per request: the outputs of every batch, stacked, score row by row.
        outputs = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
        uncertain = self.policy.uncertain
        inputs = named if uncertain is not None and uncertain.uses_inputs else None
        return self.policy.calibrate(outputs, inputs=inputs)
