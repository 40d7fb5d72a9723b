"""What each child process of a multi-process hub runs: an executor, or an ingress.

``run_executor``: loads one model instance on its device, serves it to every
ingress (``ExecutorLoop``) until SIGTERM, then answers what it still queues
("overloaded") and exits.

``run_mqtt_ingress``: one MQTT session in the hub's share group
(``MqttFront``) over the executor pool (``PoolDispatcher``); the main thread reads
the executors' replies (``ExecutorPool.poll``) while the MQTT client's thread
decodes and submits. On SIGTERM it drains: unsubscribes, waits (up to
``DRAIN_S``) until every request in flight is answered, then disconnects. Each
has its own ``ExampleCollector`` when a model's config collects (its shards
named after the process), closed last so that what it kept is written.

``run_http_ingress``: the Open Inference Protocol over the same pool, served
from the start (liveness answers while models load and the broker is down;
readiness names what is missing: models, or an MQTT ingress subscribed), on an
asyncio loop that also reads the executors' replies (no thread hand-off per
request); several HTTP ingress processes share the port (``SO_REUSEPORT``).
On SIGTERM uvicorn stops accepting and finishes what is in flight. With
``grpc_port`` the same process serves the KServe v2 gRPC API (``cloud_hub.grpc``)
on that loop too, over the same ``ServedHub`` and ``ApiKeyGuard`` (one set of
rate buckets for both protocols), the port shared the same way; on SIGTERM it
stops taking RPCs with uvicorn and gives those in flight up to ``DRAIN_S``.

Every role dumps its ``MetricsBook`` into the hub's metrics directory about
once a second and when it ends; each calls ``ready()`` once it serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shared import (
    Limits,
    MqttSession,
    MqttSettings,
    TlsSettings,
    Topics,
    TracingSettings,
    mqtt_max_packet_bytes,
)
from shared.server import ApiKeyGuard, rate_limiter

from .._dispatch import PoolDispatcher
from .._errors import HubError
from .._tracing import HubTracer, open_hub_tracer
from ..collect._collector import ExampleCollector
from ..language import LanguageModels
from ..metrics._book import BookDumper, MetricsBook, read_books
from ..metrics._plane import BookRecorder, PlaneMetrics
from ..mqtt._crt_session import open_session
from ..mqtt._front import MqttFront
from ..mqtt._spec_front import SpecFront
from ..mqtt._text_front import TextFront
from ..repository._repository import ModelRepository, model_configs
from ._executor_loop import ExecutorLoop
from ._executor_pool import ExecutorPool
from ._ipc import ExecutorConnection
from ._llm_client import LanguageClient
from ._model_control import ControlClient
from ._served_versions import ServedVersionsFile
from ._spec import PlaneSpec

__all__ = ["DRAIN_S", "run_executor", "run_http_ingress", "run_mqtt_ingress"]

log = logging.getLogger(__name__)

DRAIN_S = 10.0  # an ingress waits this long for its requests in flight when told to stop
_CONNECT_S = 120.0  # how long an ingress waits for the executors before serving anyway
_SUBSCRIBED = "tandem_hub_mqtt_ingress_subscribed"  # a gauge: 1 per subscribed ingress
_TEXT_TURNS = "tandem_hub_mqtt_text_turns"  # a gauge: the text turns this ingress took
# A gauge per language model: 1 while this MQTT ingress is connected to its executor.
_LANGUAGE_REACHED = "tandem_hub_mqtt_ingress_language_connected"
_SUBSCRIBE_S = 10.0  # how long it waits for its subscriptions before saying it serves


def run_executor(spec: PlaneSpec, index: int, ready: Callable[[], None]) -> None:
    target = spec.executors[index]
    repository = ModelRepository()
    served = repository.load_model(
        spec.repo, target.model, device=target.device, version=int(target.version)
    )
    book = MetricsBook(f"executor-{target.model}-{target.instance}")
    dumper = BookDumper(book, Path(spec.metrics_dir))
    loop = ExecutorLoop(
        served,
        address=target.address,
        instance=target.instance,
        book=book,
        on_tick=dumper.tick,
    )
    _on_stop_signals(loop.stop)
    signal.signal(signal.SIGUSR1, lambda *_: loop.retire())  # a newer version took over
    ready()
    try:
        loop.run()
    finally:
        dumper.close()
        repository.close()


def _on_stop_signals(stop: Callable[[], None]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop())


def _language_models(spec: PlaneSpec, ingress_id: str) -> LanguageModels:
    """The hub's language models as this ingress reaches them: clients of their executors."""
    models = LanguageModels()
    for target in spec.language:
        client = LanguageClient(target.address, target.model, ingress_id=ingress_id)
        models.add_engine(target.model, client, version=target.version)
    return models


def _spec_front(
    spec: PlaneSpec, index: int, language: LanguageModels, session: MqttSession
) -> SpecFront:
    """Speculative rounds, verified in this ingress process (its own ONNX Runtime session
    over the repository's version folder): the KV caches live here, so the later rounds
    of a session come to this process alone, under a hub id of its own."""
    repo = Path(spec.repo)
    return SpecFront(
        language, session, topics=Topics(spec.prefix), share_group=spec.share_group,
        limits=Limits(), hub_id=f"{spec.hub_id}.m{index}",
        model_dir=lambda served: repo / served.name / served.version,
    )  # fmt: skip


def _language_connected(models: LanguageModels) -> bool:
    return all(m.engine.connected.is_set() for m in models if isinstance(m.engine, LanguageClient))


def _wait_for_executors(
    pool: ExecutorPool,
    expected: int,
    stopping: threading.Event | None = None,
    language: LanguageModels | None = None,
) -> None:
    deadline = time.monotonic() + _CONNECT_S
    while (
        pool.connect_missing() < expected
        or (language is not None and not _language_connected(language))
    ) and time.monotonic() < deadline:
        if stopping is not None and stopping.wait(0.05):
            return
        if stopping is None:
            time.sleep(0.05)


def _broker_missing(spec: PlaneSpec) -> Callable[[], list[str]] | None:
    """Readiness' broker check for an HTTP ingress: does any MQTT ingress say it subscribed?

    Each MQTT ingress dumps its ``_SUBSCRIBED`` gauge into the metrics directory
    about once a second; a probe reads those few small files.
    """
    if spec.broker is None:
        return None
    directory = Path(spec.metrics_dir)
    where = MqttSettings.from_url(spec.broker).url  # without the password

    def missing() -> list[str]:
        for book, alive in read_books(directory):
            if alive and book.gauges.get((_SUBSCRIBED, ())) == 1.0:
                return []
        return [f"broker: no MQTT ingress subscribed on {where}"]

    return missing


def _recorder(book: MetricsBook, pool: ExecutorPool) -> BookRecorder:
    def served() -> dict[str, str]:
        out = {}
        for conn in pool.connections():
            if conn.info is not None:
                out[conn.info.model] = conn.info.version
        return out

    return BookRecorder(book, served)


def _mqtt_settings(spec: PlaneSpec) -> MqttSettings:
    assert spec.broker is not None
    settings = MqttSettings.from_url(spec.broker).with_tls(
        ca_certs=spec.mqtt_ca, certfile=spec.mqtt_cert, keyfile=spec.mqtt_key
    )
    # Advertised in CONNECT (MQTT 5): the broker drops a frame the front would refuse anyway.
    return dataclasses.replace(settings, max_packet_bytes=mqtt_max_packet_bytes(Limits()))


def _tracer(spec: PlaneSpec, ingress_id: str) -> HubTracer | None:
    """This ingress process' tracer: ``--otlp-endpoint``, else the ``OTEL_*`` environment."""
    settings = None if spec.otlp_endpoint is None else TracingSettings(endpoint=spec.otlp_endpoint)
    return open_hub_tracer(settings, {"tandem.hub_id": spec.hub_id, "tandem.ingress": ingress_id})


def run_mqtt_ingress(spec: PlaneSpec, index: int, ready: Callable[[], None]) -> None:
    ingress_id = f"mqtt-{index}-{os.getpid()}"
    served = _ServedWatch(spec)
    pool = ExecutorPool(served.initial, ingress_id=ingress_id, ring_bytes=spec.ring_bytes)
    book = MetricsBook(f"ingress-mqtt-{index}")
    dumper = BookDumper(book, Path(spec.metrics_dir))
    recorder = _recorder(book, pool)
    session = open_session(
        _mqtt_settings(spec),
        f"tandem-hub-{spec.hub_id}-{index}-{os.getpid()}",
        client=spec.mqtt_client,  # type: ignore[arg-type]  # checked by the CLI
    )
    collector = ExampleCollector.for_models(
        model_configs(spec.repo), writer=f"{spec.hub_id}-{ingress_id}", count=book.inc
    )
    if collector is not None:
        collector.start()
    front = MqttFront(
        PoolDispatcher(pool),
        session,
        topics=Topics(spec.prefix),
        share_group=spec.share_group,
        limits=Limits(),
        on_reply=functools.partial(recorder.record, "mqtt"),
        legacy_topics=spec.legacy_topics,
        collector=collector,
        tracer=_tracer(spec, ingress_id),
    )
    language = _language_models(spec, ingress_id)
    text_front = spec_front = None
    if len(language):  # its turns go to the language executors, chunks come back here
        text_front = TextFront(language, session, topics=Topics(spec.prefix),
                               share_group=spec.share_group, limits=Limits(),
                               hub_id=spec.hub_id)  # fmt: skip
        spec_front = _spec_front(spec, index, language, session)
    stopping = threading.Event()
    _on_stop_signals(stopping.set)
    _wait_for_executors(pool, len(spec.executors), stopping, language)
    if text_front is not None:
        text_front.start()
    if spec_front is not None:
        spec_front.start()
    front.start(wait_s=None)  # a broker that is down is waited for in the background
    deadline = time.monotonic() + _SUBSCRIBE_S
    while not session.subscribed.is_set() and not stopping.is_set():
        if time.monotonic() >= deadline or session.subscribed.wait(0.05):
            break
    if not session.subscribed.is_set() and not stopping.is_set():  # serving means subscribed
        failure = session.connect_failure
        why = f" ({failure.explain(session.settings.url)})" if failure is not None else ""
        log.warning("not subscribed to %s yet%s; serving once the broker answers", spec.broker, why)
    ready()
    reached: dict[str, float] = {}
    try:
        while not stopping.is_set():
            pool.poll(0.25)
            served.apply(pool)
            book.set(_SUBSCRIBED, (), 1.0 if session.subscribed.is_set() else 0.0)
            if text_front is not None:
                book.set(_TEXT_TURNS, (), float(text_front.stats().get("turns", 0)))
            if _note_language_reached(book, language, reached):
                dumper.close()  # readiness sees a lost or regained executor now, not in a second
            else:
                dumper.tick()
        front.pause()  # no new requests; the ones in flight still get their replies
        if text_front is not None:
            text_front.pause()
        deadline = time.monotonic() + DRAIN_S
        while (pool.inflight or _streaming(text_front)) and time.monotonic() < deadline:
            pool.poll(0.05)
        if text_front is not None:
            text_front.stop()  # what still streams: "overloaded", finished elsewhere
        if spec_front is not None:
            spec_front.stop()  # rounds in flight time out: their devices finish alone
        front.stop(timeout_s=2.0)
    finally:
        language.close()
        if collector is not None:
            collector.close(timeout_s=DRAIN_S)
        if front.tracer is not None:
            front.tracer.shutdown()  # the last replies' spans
        pool.close()
        dumper.close()


def _note_language_reached(
    book: MetricsBook, language: LanguageModels, last: dict[str, float]
) -> bool:
    """Set ``_LANGUAGE_REACHED`` per language model; whether any changed since ``last``."""
    changed = False
    for served in language:
        if not isinstance(served.engine, LanguageClient):
            continue
        value = 1.0 if served.engine.connected.is_set() else 0.0
        book.set(_LANGUAGE_REACHED, (served.name,), value)
        changed |= last.get(served.name) != value
        last[served.name] = value
    return changed


def _streaming(text_front: TextFront | None) -> bool:
    return text_front is not None and text_front.stats()["streaming"] > 0


def run_http_ingress(spec: PlaneSpec, index: int, ready: Callable[[], None]) -> None:
    from ..http import HttpServer, ServedHub, create_app

    served = _ServedWatch(spec)
    ingress_id = f"http-{index}-{os.getpid()}"
    language = _language_models(spec, ingress_id)
    pool = ExecutorPool(
        served.initial,
        ingress_id=ingress_id,
        ring_bytes=spec.ring_bytes,
        copy_replies=True,  # the response is encoded later, by the request's own task
    )
    book = MetricsBook(f"ingress-http-{index}")
    dumper = BookDumper(book, Path(spec.metrics_dir))
    recorder = _recorder(book, pool)
    metrics = PlaneMetrics(Path(spec.metrics_dir), local=lambda: [book])
    sink = _Sink(recorder, metrics)
    guard = None
    if spec.api_keys is not None:  # with Redis, a key's rate holds across processes
        guard = ApiKeyGuard.from_file(spec.api_keys, limiter=rate_limiter(spec.redis_url))
    tracer = _tracer(spec, ingress_id)
    served_hub = ServedHub(
        PoolDispatcher(pool),
        sink,
        Limits(),
        _missing(spec, language),
        language if len(language) else None,
        metrics.model_counts,
        ControlClient(spec.control_dir) if spec.control_dir else None,
        tracer,
    )
    app = create_app(
        served_hub,
        api_keys=guard,
        max_json_bytes=spec.max_json_bytes,
        max_inflight_bytes=spec.max_inflight_bytes,
    )
    tls = TlsSettings.from_files(
        ca_certs=spec.tls_client_ca, certfile=spec.tls_cert, keyfile=spec.tls_key
    )
    server = HttpServer(app, host=spec.http_host, port=spec.http_port, tls=tls, reuse_port=True)
    grpc_server = None
    if spec.grpc_port:  # the same hub, keys (and rate buckets), limits and TLS as HTTP's
        from ..grpc import GrpcServer

        grpc_server = GrpcServer(
            served_hub,
            host=spec.http_host,
            port=spec.grpc_port,
            api_keys=guard,
            tls=tls,
            budget=app.state.byte_budget,  # one limit on the bytes both protocols hold
        )
    # Served at once (liveness; readiness says what is missing), started by the supervisor
    # before the executors; it says "ready" once connected to all of them, or after _CONNECT_S.
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve_http(server, pool, dumper, served, ready, len(spec.executors),
                                   language, grpc_server))  # fmt: skip
    finally:
        language.close()
        if tracer is not None:
            tracer.shutdown()
        pool.close()
        dumper.close()


def _missing(spec: PlaneSpec, language: LanguageModels) -> Callable[[], list[str]] | None:
    """Readiness' checks besides the tensor models: the broker, the language executors."""
    broker = _broker_missing(spec)
    if not len(language):
        return broker

    directory = Path(spec.metrics_dir)

    def missing() -> list[str]:
        out = broker() if broker is not None else []
        for served in language:
            if isinstance(served.engine, LanguageClient) and not served.engine.connected.is_set():
                out.append(f"language model {served.name}: its executor is not reachable")
        if spec.broker is not None:  # the MQTT ingresses reach it through clients of their own
            lost = {
                labels[0]
                for book, alive in read_books(directory) if alive
                for (name, labels), value in book.gauges.items()
                if name == _LANGUAGE_REACHED and value == 0.0
            }  # fmt: skip
            out += [f"language model {m}: an MQTT ingress cannot reach its executor"
                    for m in sorted(lost)]  # fmt: skip
        return out

    return missing


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (about a third less CPU per HTTP request)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class _ServedWatch:
    """The served versions the supervisor keeps in its file (the plan's until it writes one).

    ``apply`` looks at the file at most every ``every_s``: the serving loop calls
    it after each batch of replies, and a ``stat`` per batch was 5% of an
    ingress's time under load.
    """

    def __init__(self, spec: PlaneSpec, *, every_s: float = 0.1) -> None:
        self.file = ServedVersionsFile(spec.served_file) if spec.served_file else None
        self.initial = (
            self.file.read_if_changed() if self.file else None
        ) or spec.served_versions()
        self.every_s = every_s
        self._next = time.monotonic() + every_s

    def apply(self, pool: ExecutorPool) -> None:
        now = time.monotonic()
        if self.file is None or now < self._next:
            return
        self._next = now + self.every_s
        served = self.file.read_if_changed()
        if served is not None:
            pool.update(served)


class _Sink:
    """``record`` into this process's book, ``render`` the whole hub's metrics."""

    def __init__(self, recorder: BookRecorder, metrics: PlaneMetrics) -> None:
        self.record = recorder.record
        self.render = metrics.render
        self.content_type = metrics.content_type


async def _serve_http(
    server: object,
    pool: ExecutorPool,
    dumper: BookDumper,
    served: _ServedWatch,
    ready: Callable[[], None],
    executors: int,
    language: LanguageModels,
    grpc_server: object = None,
) -> None:
    from ..grpc import GrpcServer
    from ..http import HttpServer

    assert isinstance(server, HttpServer)
    assert grpc_server is None or isinstance(grpc_server, GrpcServer)
    loop = asyncio.get_running_loop()
    grpc_stopping: list[asyncio.Task[None]] = []

    def stop() -> None:  # both stop taking requests; both finish what is in flight
        server.exit()
        if grpc_server is not None and not grpc_stopping:
            grpc_stopping.append(asyncio.create_task(grpc_server.stop(DRAIN_S)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    readers: dict[ExecutorConnection, int] = {}

    def letting_go(conn: ExecutorConnection) -> None:  # before the pool closes it: descriptor reuse
        if conn in readers:
            loop.remove_reader(readers.pop(conn))

    pool.on_connection_closing = letting_go

    def read(conn: ExecutorConnection) -> None:
        pool.on_readable(conn)
        if not conn.connected and conn in readers:  # closed: its number may be reused
            loop.remove_reader(readers.pop(conn))

    async def keep_connections() -> None:
        while True:
            await loop.run_in_executor(None, pool.connect_missing)
            current = set(pool.connections())
            for conn in list(readers):
                if conn not in current:
                    loop.remove_reader(readers.pop(conn))
            for conn in current - set(readers):
                readers[conn] = conn.fileno()
                loop.add_reader(readers[conn], read, conn)
            for conn in current:
                if conn.wants_write:
                    conn.flush()
            served.apply(pool)
            dumper.tick()
            await asyncio.sleep(0.25)

    keeper = asyncio.create_task(keep_connections())
    serving = asyncio.create_task(server.serve())
    try:
        if grpc_server is not None:  # on this loop: it submits to the pool this loop reads
            await grpc_server.start()
        while not serving.done() and not server.started:
            await asyncio.sleep(0.01)
        deadline = loop.time() + _CONNECT_S
        while (
            not serving.done()
            and (len(pool.connections()) < executors or not _language_connected(language))
            and loop.time() < deadline
        ):
            await asyncio.sleep(0.05)  # keep_connections connects them; the clients their own
        ready()
        await serving
        stop()  # uvicorn ended (a signal, or it failed): gRPC goes with it
        if grpc_stopping:
            await grpc_stopping[0]
    except HubError:
        log.exception("the HTTP ingress could not serve")
        raise
    finally:
        if grpc_server is not None:
            await grpc_server.stop(0)  # what is left (a failure above): cancelled now
        keeper.cancel()
        for fd in readers.values():
            loop.remove_reader(fd)
