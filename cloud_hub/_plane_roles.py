"""What each child process of a multi-process hub runs: an executor, or an ingress.

``run_executor``: loads one model instance on its device, serves it to every
ingress (``ExecutorLoop``) until SIGTERM, then answers what it still queues
("overloaded") and exits.

``run_mqtt_ingress``: one MQTT session in the hub's share group
(``MqttFront``) over the executor pool (``PoolBackend``); the main thread reads
the executors' replies (``ExecutorPool.poll``) while the MQTT client's thread
decodes and submits. On SIGTERM it drains: unsubscribes, waits (up to
``DRAIN_S``) until every request in flight is answered, then disconnects. Each
has its own ``ExampleCollector`` when a model's config collects (its shards
named after the process), closed last so that what it kept is written.

``run_http_ingress``: the Open Inference Protocol over the same pool, on an
asyncio loop that also reads the executors' replies (no thread hand-off per
request); several HTTP ingress processes share the port (``SO_REUSEPORT``).
On SIGTERM uvicorn stops accepting and finishes what is in flight.

Every role dumps its ``MetricsBook`` into the hub's metrics directory about
once a second and when it ends; each calls ``ready()`` once it serves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shared import ApiKeyGuard, Limits, MqttSettings, TlsSettings, Topics, rate_limiter

from ._backend import PoolBackend
from ._collect import ExampleCollector
from ._crt_session import open_session
from ._errors import HubError
from ._executor_loop import ExecutorLoop
from ._executor_pool import ExecutorPool
from ._link import ExecutorLink
from ._metrics_book import BookDumper, MetricsBook
from ._mqtt_front import MqttFront
from ._plane_metrics import BookRecorder, PlaneMetrics
from ._plane_spec import PlaneSpec
from ._repository import ModelRepository, model_configs
from ._routes import RoutesFile

__all__ = ["DRAIN_S", "run_executor", "run_http_ingress", "run_mqtt_ingress"]

log = logging.getLogger(__name__)

DRAIN_S = 10.0  # an ingress waits this long for its requests in flight when told to stop
_CONNECT_S = 120.0  # how long an ingress waits for the executors before serving anyway
_SUBSCRIBED = "tandem_hub_mqtt_ingress_subscribed"  # a gauge: 1 per subscribed ingress
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


def _wait_for_executors(pool: ExecutorPool, expected: int) -> None:
    deadline = time.monotonic() + _CONNECT_S
    while pool.connect_missing() < expected and time.monotonic() < deadline:
        time.sleep(0.05)


def _recorder(book: MetricsBook, pool: ExecutorPool) -> BookRecorder:
    def served() -> dict[str, str]:
        out = {}
        for link in pool.links():
            if link.info is not None:
                out[link.info.model] = link.info.version
        return out

    return BookRecorder(book, served)


def _mqtt_settings(spec: PlaneSpec) -> MqttSettings:
    assert spec.broker is not None
    return MqttSettings.from_url(spec.broker).with_tls(
        ca_certs=spec.mqtt_ca, certfile=spec.mqtt_cert, keyfile=spec.mqtt_key
    )


def run_mqtt_ingress(spec: PlaneSpec, index: int, ready: Callable[[], None]) -> None:
    ingress_id = f"mqtt-{index}-{os.getpid()}"
    routes = _RoutesWatch(spec)
    pool = ExecutorPool(routes.initial, ingress_id=ingress_id, ring_bytes=spec.ring_bytes)
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
        PoolBackend(pool),
        session,
        topics=Topics(spec.prefix),
        share_group=spec.share_group,
        limits=Limits(),
        on_reply=functools.partial(recorder.record, "mqtt"),
        legacy_topics=spec.legacy_topics,
        collector=collector,
    )
    stopping = threading.Event()
    _on_stop_signals(stopping.set)
    _wait_for_executors(pool, len(spec.executors))
    front.start(wait_s=None)  # a broker that is down is waited for in the background
    if not session.subscribed.wait(_SUBSCRIBE_S):  # serving means subscribed, when possible
        log.warning("not subscribed to %s yet; serving once the broker answers", spec.broker)
    ready()
    try:
        while not stopping.is_set():
            pool.poll(0.25)
            routes.apply(pool)
            book.set(_SUBSCRIBED, (), 1.0 if session.subscribed.is_set() else 0.0)
            dumper.tick()
        front.pause()  # no new requests; the ones in flight still get their replies
        deadline = time.monotonic() + DRAIN_S
        while pool.inflight and time.monotonic() < deadline:
            pool.poll(0.05)
        front.stop(timeout_s=2.0)
    finally:
        if collector is not None:
            collector.close(timeout_s=DRAIN_S)
        pool.close()
        dumper.close()


def run_http_ingress(spec: PlaneSpec, index: int, ready: Callable[[], None]) -> None:
    from .http import HttpServer, ServedHub, create_app

    routes = _RoutesWatch(spec)
    pool = ExecutorPool(
        routes.initial,
        ingress_id=f"http-{index}-{os.getpid()}",
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
    app = create_app(
        ServedHub(PoolBackend(pool), sink, Limits()),
        api_keys=guard,
        max_json_bytes=spec.max_json_bytes,
        max_inflight_bytes=spec.max_inflight_bytes,
    )
    tls = TlsSettings.from_files(
        ca_certs=spec.tls_client_ca, certfile=spec.tls_cert, keyfile=spec.tls_key
    )
    server = HttpServer(app, host=spec.http_host, port=spec.http_port, tls=tls, reuse_port=True)
    _wait_for_executors(pool, len(spec.executors))
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve_http(server, pool, dumper, routes, ready))
    finally:
        pool.close()
        dumper.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (about a third less CPU per HTTP request)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class _RoutesWatch:
    """The routes the supervisor keeps in its file (the plan's until it writes one).

    ``apply`` looks at the file at most every ``every_s``: the serving loop calls
    it after each batch of replies, and a ``stat`` per batch was 5% of an
    ingress's time under load.
    """

    def __init__(self, spec: PlaneSpec, *, every_s: float = 0.1) -> None:
        self.file = RoutesFile(spec.routes_file) if spec.routes_file else None
        self.initial = (self.file.read_if_changed() if self.file else None) or spec.routes()
        self.every_s = every_s
        self._next = time.monotonic() + every_s

    def apply(self, pool: ExecutorPool) -> None:
        now = time.monotonic()
        if self.file is None or now < self._next:
            return
        self._next = now + self.every_s
        routes = self.file.read_if_changed()
        if routes is not None:
            pool.update(routes)


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
    routes: _RoutesWatch,
    ready: Callable[[], None],
) -> None:
    from .http import HttpServer

    assert isinstance(server, HttpServer)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.exit)
    readers: dict[ExecutorLink, int] = {}

    def letting_go(link: ExecutorLink) -> None:  # before the pool closes it: descriptor reuse
        if link in readers:
            loop.remove_reader(readers.pop(link))

    pool.on_link_closing = letting_go

    def read(link: ExecutorLink) -> None:
        pool.on_readable(link)
        if not link.connected and link in readers:  # closed: its number may be reused
            loop.remove_reader(readers.pop(link))

    async def keep_links() -> None:
        while True:
            await loop.run_in_executor(None, pool.connect_missing)
            current = set(pool.links())
            for link in list(readers):
                if link not in current:
                    loop.remove_reader(readers.pop(link))
            for link in current - set(readers):
                readers[link] = link.fileno()
                loop.add_reader(readers[link], read, link)
            for link in current:
                if link.wants_write:
                    link.flush()
            routes.apply(pool)
            dumper.tick()
            await asyncio.sleep(0.25)

    keeper = asyncio.create_task(keep_links())
    serving = asyncio.create_task(server.serve())
    try:
        while not serving.done() and not server.started:
            await asyncio.sleep(0.01)
        ready()
        await serving
    except HubError:
        log.exception("the HTTP ingress could not serve")
        raise
    finally:
        keeper.cancel()
        for fd in readers.values():
            loop.remove_reader(fd)
