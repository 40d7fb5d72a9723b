"""The embedded plane: one process with a model repository, a dynamic batcher per model
(threads) and the MQTT front. The library's quick start, the demo and tests run this one;
``tandem hub`` runs the process plane (``cloud_hub.plane``) over the same parts.

``start`` brings parts up in dependency order (models loaded and warmed up,
then batchers, then the MQTT subscription, so the first request finds
everything ready; language models' turns come over the same session through
the text front, ``cloud_hub.mqtt._text_front``, and speculative rounds through
the spec front beside it, ``cloud_hub.mqtt._spec_front``); ``stop`` takes them down
in reverse: unsubscribe (no new requests; replies keep flowing; text turns
still running are answered ``overloaded``, so their devices finish them),
stop the batchers (queued requests are
answered ``overloaded``, the batch in flight finishes and is answered),
flush replies and disconnect, then release the models. A failure in
``start`` stops whatever had started before it is raised.

``submit`` is the in-process entry point (the MQTT front uses it, and so
do the HTTP API in ``cloud_hub.http`` and benchmarks): requests from every
transport meet in the same batchers and batch together. ``prometheus`` holds
the hub's metrics (``_prometheus``): the transports record their answers
there, and ``submit`` has every request's queue and compute time observed.
Models whose config has ``collection`` get an ``ExampleCollector`` beside
the MQTT front (started before it subscribes, closed after it stopped, so
every kept row is written), its counters in the same registry.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal

import numpy as np

from shared import (
    Limits,
    MqttSettings,
    Topics,
    TracingSettings,
    mqtt_max_packet_bytes,
    validate_name,
)

from ._dispatch import Done, future_outcome
from ._errors import HubStoppingError, ModelNotFoundError
from ._model_info import ModelInfo
from ._tracing import HubTracer, open_hub_tracer
from .batching._batcher import DynamicBatcher, ResultFuture
from .batching._stats import BatcherStats
from .collect._collector import ExampleCollector
from .collect._metrics import CollectionCollector
from .executors import Executor
from .language import LanguageModels, SessionLimits
from .language._metrics import LanguageCollector
from .metrics._book import MetricsBook
from .metrics._prometheus import HubMetrics
from .mqtt._coalesce import Coalescing
from .mqtt._crt_session import open_session
from .mqtt._front import MqttFront
from .mqtt._spec_front import SpecFront
from .mqtt._text_front import TextFront
from .repository._config import ModelConfig
from .repository._repository import ModelRepository, ServedModel

__all__ = ["Hub"]

log = logging.getLogger(__name__)


class Hub:
    """Serves the models of a repository over MQTT (and in process through ``submit``).

    ``repository`` is a directory in the Triton-like layout (loaded at
    ``start``), a ``ModelRepository`` you built (the hub leaves closing it to
    you), or ``None`` for models added with ``add_model``. ``mqtt=None``
    runs without a broker: only ``submit`` serves. ``connect_timeout_s`` is
    how long ``start`` waits for the subscription (``None``: do not wait,
    keep retrying in the background). ``legacy_topics`` also takes requests on
    the first layout (``MqttFront``): a migration opt-in, unsafe (redirectable).
    ``text_over_mqtt`` serves the language models' turns over MQTT (``TextFront``,
    chunks coalesced per ``coalescing``): ``None`` turns it on when the repository
    holds a language model at ``start``. ``hub_id`` names this replica to devices (its
    chunks and finals carry it; a conversation's next turn is sent to it; default: random).
    With the text front comes ``spec_front`` (``SpecFront``): devices' speculative-decoding
    rounds verified against the same language models, their sessions bounded by
    ``verify_sessions`` (``SessionLimits``).
    ``tracing``: spans of every answered
    request over MQTT and HTTP (``cloud_hub._tracing``, docs/tracing.md): a
    ``TracingSettings``, ``True``, ``False`` (off), or ``None``: the standard
    ``OTEL_*`` environment variables decide.
    """

    def __init__(
        self,
        repository: str | Path | ModelRepository | None = None,
        *,
        mqtt: MqttSettings | None = None,
        topics: Topics | None = None,
        share_group: str | None = "hubs",
        limits: Limits | None = None,
        client_id: str | None = None,
        torch_device: str | None = None,
        connect_timeout_s: float | None = 10.0,
        mqtt_client: Literal["auto", "crt", "paho"] = "auto",
        legacy_topics: bool = False,
        text_over_mqtt: bool | None = None,
        coalescing: Coalescing | None = None,
        hub_id: str | None = None,
        tracing: TracingSettings | bool | None = None,
        verify_sessions: SessionLimits | None = None,
    ) -> None:
        if isinstance(repository, ModelRepository):
            self.repository, self._path, self._owns_repository = repository, None, False
        else:
            self.repository = ModelRepository()
            self._path = None if repository is None else Path(repository)
            self._owns_repository = True
        self.mqtt = mqtt
        self.topics = topics or Topics()
        self.share_group = share_group
        self.limits = limits or Limits()
        self.client_id = client_id
        self.torch_device = torch_device
        self.connect_timeout_s = connect_timeout_s
        self.mqtt_client = mqtt_client
        self.legacy_topics = legacy_topics
        self.mqtt_front: MqttFront | None = None
        self.text_over_mqtt = text_over_mqtt
        self.coalescing = coalescing
        self.hub_id = validate_name(hub_id or uuid.uuid4().hex[:8], "hub id")
        self.text_front: TextFront | None = None
        self.spec_front: SpecFront | None = None  # speculative rounds, beside the text front
        self.verify_sessions = verify_sessions
        self.tracing = tracing
        self.tracer: HubTracer | None = None  # opened by start when tracing is on, shut by stop
        self.collector: ExampleCollector | None = None  # set by start when a model collects
        self._batchers: dict[str, DynamicBatcher] = {}
        self._lock = threading.Lock()
        self._running = False
        self._stop_requested = threading.Event()
        self.language = LanguageModels()  # platform onnxruntime_genai (``cloud_hub.language``)
        self.prometheus = HubMetrics(self.batchers)
        self._collection_book = MetricsBook("collect")
        self.prometheus.registry.register(CollectionCollector(self._collection_book))
        self.prometheus.registry.register(LanguageCollector(self.language))

    # -- models ---------------------------------------------------------------------------

    def add_model(
        self,
        name: str,
        executor: Executor,
        *,
        version: str | int = 1,
        config: ModelConfig | None = None,
    ) -> ServedModel:
        """Serve ``executor`` as ``name``; works before and after ``start``."""
        replaced = self.repository.get(name) if name in self.repository else None
        served = self.repository.add(name, executor, version=version, config=config)
        if self._running:
            self._serve(served)  # waits for the old batcher's batch in flight
        if replaced is not None and replaced.executor is not executor:
            replaced.executor.close()
        return served

    def submit(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | None = None,
        deadline: float | None = None,
    ) -> ResultFuture:
        """Queue one request for ``model`` (``deadline``: ``time.monotonic()`` seconds).

        Raises ``ModelNotFoundError``, ``InvalidRequestError``,
        ``OverloadedError``, ``DeadlineExceededError`` or ``HubStoppingError``
        at once; the future carries the result or the batch's error.
        """
        if not self._running:
            raise HubStoppingError("the hub is not running")
        served = self.repository.get(model, version)
        batcher = self._batchers.get(served.name)
        if batcher is None or batcher.version != served.version:
            raise ModelNotFoundError(f"model {served.label} is still being loaded")
        future = batcher.submit(inputs, deadline)
        future.add_done_callback(self.prometheus.observe_computed)
        return future

    def metrics(self) -> dict[str, BatcherStats]:
        """A snapshot of each model's batcher counters, keyed by ``name@version``."""
        return {b.label: b.metrics.snapshot() for b in list(self._batchers.values())}

    def batchers(self) -> list[DynamicBatcher]:
        """The batchers serving now, one per model (for readiness checks and metrics)."""
        with self._lock:
            return list(self._batchers.values())

    @property
    def dispatcher(self) -> LocalDispatcher:
        """This hub as a ``Dispatcher``, for transports (MQTT, HTTP) in this process."""
        return LocalDispatcher(self)

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``: ``submit`` takes requests."""
        return self._running

    # -- lifecycle ------------------------------------------------------------------------

    def missing(self) -> list[str]:
        """What readiness waits for besides models: the broker, when this hub has one."""
        if self.mqtt is None or (
            self.mqtt_front is not None and self.mqtt_front.subscribed.is_set()
        ):
            return []
        return [f"broker: not subscribed on {self.mqtt.url}"]

    def start(self) -> Hub:
        """Load models, start batchers, then subscribe. Raises what failed, after cleanup."""
        if self._running:
            return self
        try:
            if self._path is not None:
                self.repository.load_directory(self._path, torch_device=self.torch_device)
                self.language.load_directory(self._path)
            self._running = True
            if self.tracer is None:
                self.tracer = open_hub_tracer(self.tracing)
            for served in self.repository:
                self._serve(served)
            if self.mqtt is not None:
                client_id = self.client_id or _client_id()
                settings = self.mqtt
                if settings.max_packet_bytes is None:  # a frame the front would refuse anyway
                    limit = mqtt_max_packet_bytes(self.limits)
                    settings = dataclasses.replace(settings, max_packet_bytes=limit)
                session = open_session(settings, client_id, client=self.mqtt_client)
                self.collector = ExampleCollector.for_models(
                    {served.name: served.config for served in self.repository},
                    writer=client_id,
                    count=self._collection_book.inc,
                )
                if self.collector is not None:
                    self.collector.start()
                self.mqtt_front = MqttFront(
                    LocalDispatcher(self),
                    session,
                    topics=self.topics,
                    share_group=self.share_group,
                    limits=self.limits,
                    on_reply=functools.partial(self.prometheus.record, "mqtt"),
                    legacy_topics=self.legacy_topics,
                    collector=self.collector,
                    tracer=self.tracer,
                )
                text = self.text_over_mqtt
                if text or (text is None and len(self.language)):
                    self.text_front = TextFront(
                        self.language,
                        session,
                        topics=self.topics,
                        share_group=self.share_group,
                        limits=self.limits,
                        coalescing=self.coalescing,
                        hub_id=self.hub_id,
                    ).start()
                    self.spec_front = SpecFront(
                        self.language, session, topics=self.topics,
                        share_group=self.share_group, limits=self.limits, hub_id=self.hub_id,
                        session_limits=self.verify_sessions,
                    ).start()  # fmt: skip
                self.mqtt_front.start(wait_s=self.connect_timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info(
            "hub serving %d model(s): %s",
            len(self.repository),
            ", ".join(m.label for m in self.repository) or "none",
        )
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop everything ``start`` started, in reverse order. Safe to call twice."""
        self._running = False
        worker, self.mqtt_front = self.mqtt_front, None
        text_front, self.text_front = self.text_front, None
        spec_front, self.spec_front = self.spec_front, None
        if worker is not None:
            worker.pause()
        if text_front is not None:
            text_front.stop()  # its finals go out before the session stops
        if spec_front is not None:
            spec_front.stop()
        with self._lock:
            batchers = list(self._batchers.values())
            self._batchers.clear()
        for batcher in batchers:
            batcher.stop(timeout_s)
        if worker is not None:
            worker.stop(timeout_s)
        collector, self.collector = self.collector, None
        if collector is not None:
            collector.close(timeout_s)  # what the answered requests left to write
        if self._owns_repository:
            self.repository.close()
        self.language.close()
        tracer, self.tracer = self.tracer, None
        if tracer is not None:
            tracer.shutdown()  # the spans of the last replies go out now

    def run_forever(self) -> None:
        """Start, serve until SIGINT or SIGTERM (or ``request_stop``), then stop."""
        in_main = threading.current_thread() is threading.main_thread()
        previous: dict[signal.Signals, Any] = {}
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            while not self._stop_requested.wait(1.0):  # a timed wait lets signals in
                pass
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def request_stop(self) -> None:
        """Make ``run_forever`` return (thread-safe)."""
        self._stop_requested.set()

    def __enter__(self) -> Hub:
        return self.start()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------

    def _serve(self, served: ServedModel) -> None:
        config = served.config
        batcher = DynamicBatcher(
            served.executor,
            inputs=config.inputs or (),
            max_batch_size=config.max_batch_size or 0,
            max_queue_delay_ms=config.max_queue_delay_ms,
            max_queue_size=config.max_queue_size,
            model=served.name,
            version=served.version,
            allow_non_finite=config.allow_non_finite,
        ).start()
        with self._lock:
            old = self._batchers.get(served.name)
            self._batchers[served.name] = batcher
        if old is not None:
            old.stop()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("got %s; stopping", signal.Signals(signum).name)
        self._stop_requested.set()


def _client_id() -> str:
    return f"tandem-hub-{socket.gethostname()[:24]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LocalDispatcher:
    """A ``Hub`` in this process."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def submit(
        self,
        model: str,
        version: str | None,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None,
        arrival: float,
        done: Done,
    ) -> None:
        future = self.hub.submit(model, inputs, version=version, deadline=deadline)
        future.add_done_callback(lambda f: done(future_outcome(f)))

    def describe(self, model: str, version: str | None = None) -> ModelInfo:
        from .plane._executor_loop import model_info  # the executor's own description, in process

        if not self.hub.running:
            raise HubStoppingError("the hub is not serving; try again shortly")
        return model_info(self.hub.repository.get(model, version))

    def model_names(self) -> list[str]:
        return sorted(m.name for m in self.hub.repository)

    def ready(self) -> bool:
        return self.hub.running and all(self.model_ready(m.name) for m in self.hub.repository)

    def model_ready(self, model: str, version: str | None = None) -> bool:
        return self.hub.running and any(
            b.model == model and (version is None or b.version == version) and b.running
            for b in self.hub.batchers()
        )
