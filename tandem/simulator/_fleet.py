"""``FleetSimulator``: many simulated devices on real MQTT connections and real downloads.

Each device has its own paho-mqtt connection (its own client id, its own
subscription to its retained assignment topic); one ``MqttEventLoop``
thread drives all of them. That is why the simulator builds its paho clients
itself, the one place outside ``shared.MqttSession`` that does (see
tests/test_mqtt_clients.py): a session runs a network thread per
connection, and a thousand devices' clients must share one thread here, on
paho's external-loop API. Downloads (the signed manifest, then the blob)
run on a small thread pool sharing keep-alive HTTP connections
(``PooledCdnClient``). The devices' decisions are ``SimulatedDevice``'s; this
module only moves bytes and time.

Threads: the loop thread owns every client and every device; the download
threads only fetch and verify, and hand their result back with
``call_soon``; the caller's thread reads snapshots under a lock. ``stop()``
disconnects every device cleanly (MQTT DISCONNECT), ends the download
threads and the loop thread, and closes every socket.
"""

from __future__ import annotations

import contextlib
import logging
import random
import resource
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from shared import Assignment, Topics, UpdateStatus, create_client, resolve_protocol

from ._cdn_client import PooledCdnClient
from ._config import SimulatorConfig
from ._device import DeviceState, SimulatedDevice, draw_traits
from ._errors import SimulatorError
from ._loop import MqttEventLoop, Timer
from ._snapshot import FleetSnapshot

__all__ = ["FleetSimulator"]

log = logging.getLogger("tandem.simulator")

_CONNECT_BATCH = 32  # connections opened per loop round, so the loop keeps serving the others
_FDS_PER_DEVICE = 2  # its MQTT socket, and as much again to spare
_FDS_SPARE = 256
_DOWNLOAD_RETRIES = 4  # a CDN that restarts is back within 7.5 s
_T = TypeVar("_T")


class _Link:
    """One device and its connection, as the loop thread keeps them."""

    __slots__ = (
        "client",
        "device",
        "planned_offline",
        "reconnect",
        "telemetry",
        "topic_assign",
        "topic_status",
        "topic_telemetry",
    )

    def __init__(self, device: SimulatedDevice, client: Any, topics: Topics) -> None:
        self.device = device
        self.client = client
        self.topic_assign = topics.assign(device.device)
        self.topic_status = topics.status(device.device)
        self.topic_telemetry = topics.telemetry(device.device)
        self.planned_offline = False
        self.telemetry: Timer | None = None
        self.reconnect: Timer | None = None


class FleetSimulator:
    """A fleet of ``config.devices`` simulated devices. Use as a context manager.

    ``start()`` returns at once; the devices connect in the background
    (``wait_until(lambda f: f.online == f.total)`` to wait for them).
    """

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.topics = config.topics
        self._loop = MqttEventLoop()
        self._fetcher = PooledCdnClient(
            config.cdn_url,
            read_token=config.read_token,
            timeout_s=config.http_timeout_s,
            tls=config.cdn_tls,
        )
        self._pool: ThreadPoolExecutor | None = None
        self._cond = threading.Condition()
        self._generation = 0
        self._links: dict[str, _Link] = {}
        self._to_connect: list[_Link] = []
        self._rng = random.Random(f"{config.seed}/fleet")
        self._stopping = False
        self._started = False
        self._status_reports = 0
        self._telemetry_reports = 0
        self._protocol: Literal["5", "3.1.1"] = "5"
        self._last_error: str | None = None

    # -- life ------------------------------------------------------------------------------

    def start(self) -> FleetSimulator:
        """Check the broker, then connect every device in the background."""
        if self._started:
            raise SimulatorError("this simulator was already started")
        self._started = True
        cfg = self.config
        _raise_file_limit(cfg.devices * _FDS_PER_DEVICE + _FDS_SPARE)
        settings = cfg.mqtt
        try:
            with socket.create_connection((settings.host, settings.port), timeout=5):
                pass
        except OSError as e:
            raise SimulatorError(f"cannot reach the MQTT broker at {settings.url}: {e}") from e
        if cfg.passwords is None:
            self._protocol = resolve_protocol(settings)
        else:  # a broker that binds ids to credentials refuses a probe under any other id
            first = cfg.device_id(0)
            self._protocol = resolve_protocol(cfg.device_mqtt(first), client_id=first)
        try:
            self._build()
            self._pool = ThreadPoolExecutor(
                cfg.download_workers, thread_name_prefix="tandem-sim-dl"
            )
            self._loop.start()
            self._loop.call_soon(self._connect_batch)
        except BaseException:
            self.stop()
            raise
        log.info("simulator: %d devices connecting to %s", cfg.devices, settings.url)
        return self

    def _build(self) -> None:
        cfg, now = self.config, time.time()
        traits = draw_traits(cfg)
        for i in range(cfg.devices):
            name = cfg.device_id(i)
            device = SimulatedDevice(
                name, config=cfg, labels=cfg.device_labels(i), traits=traits[i], now=now
            )
            # With its own credentials a device is itself to the broker (client id = username
            # = device id), as a real device; without, one shared user connects them all.
            client_id = name if cfg.passwords is not None else f"tandem-sim-{name}"
            client = create_client(cfg.device_mqtt(name), client_id, protocol=self._protocol)
            link = _Link(device, client, self.topics)
            client.user_data_set(link)
            client.on_connect = self._on_connect
            client.on_disconnect = self._on_disconnect
            client.on_message = self._on_message
            self._links[name] = link
        self._to_connect = list(self._links.values())

    def stop(self, timeout_s: float = 15.0) -> None:
        """Disconnect every device cleanly and end every thread. Safe to call twice."""
        if not self._started or self._stopping:
            return
        self._stopping = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        done = threading.Event()

        def disconnect_all() -> None:
            try:
                self._disconnect_all()
            finally:
                done.set()

        if self._loop.running:
            self._loop.call_soon(disconnect_all)
        else:
            disconnect_all()
        if not done.wait(timeout_s):
            log.warning("simulator: devices did not all disconnect in %.0f s", timeout_s)
        self._loop.stop(timeout_s)
        for link in self._links.values():  # what the loop could not close, closes here
            sock = link.client.socket()
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._fetcher.close()
        with self._cond:
            for link in self._links.values():
                link.device.disconnected()
            self._bump()

    def __enter__(self) -> FleetSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries (any thread) --------------------------------------------------------------

    def device_ids(self) -> list[str]:
        return [self.config.device_id(i) for i in range(self.config.devices)]

    def device(self, device: str) -> DeviceState:
        link = self._links.get(device)
        if link is None:
            raise SimulatorError(f"no simulated device {device!r}")
        with self._cond:
            return link.device.state()

    def snapshot(self) -> FleetSnapshot:
        with self._cond:
            return self._snapshot()

    def wait_until(
        self, predicate: Callable[[FleetSnapshot], bool], timeout_s: float = 30.0
    ) -> FleetSnapshot:
        """Wait until ``predicate(snapshot)`` holds; the snapshot that satisfied it.

        Raises ``SimulatorError`` (with the fleet's summary) after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        seen = -1
        while True:
            with self._cond:
                if self._generation == seen:
                    self._cond.wait(max(0.0, min(deadline - time.monotonic(), 0.5)))
                if self._generation != seen:
                    seen = self._generation
                    snapshot = self._snapshot()
            if predicate(snapshot):
                return snapshot
            if time.monotonic() >= deadline:
                raise SimulatorError(
                    f"the fleet did not get there in {timeout_s:g} s: {snapshot.summary()}"
                )
            time.sleep(0.02)  # a snapshot of a big fleet is not free: at most ~50 a second

    def take_offline(self, device: str, for_s: float) -> None:
        """Disconnect ``device`` now; it reconnects (same client id) after ``for_s``."""
        link = self._links.get(device)
        if link is None:
            raise SimulatorError(f"no simulated device {device!r}")
        self._loop.call_soon(lambda: self._go_offline(link, for_s))

    # -- connecting (loop thread) ----------------------------------------------------------

    def _connect_batch(self) -> None:
        batch = self._to_connect[:_CONNECT_BATCH]
        del self._to_connect[:_CONNECT_BATCH]
        for link in batch:
            self._loop.attach(link.client)
            self._connect(link, first=True)
        if self._to_connect and not self._stopping:
            self._loop.call_soon(self._connect_batch)

    def _connect(self, link: _Link, *, first: bool = False) -> None:
        link.reconnect = None
        if self._stopping:
            return
        settings = self.config.mqtt
        try:
            if not first:
                link.client.reconnect()
            elif self._protocol == "5":
                from paho.mqtt.packettypes import PacketTypes
                from paho.mqtt.properties import Properties

                properties = Properties(PacketTypes.CONNECT)
                # The session (and the QoS 1 messages meanwhile) outlives a planned absence.
                properties.SessionExpiryInterval = int(self.config.offline_for_s) + 60
                link.client.connect(
                    settings.host, settings.port, self.config.keepalive_s, properties=properties
                )
            else:
                link.client.connect(settings.host, settings.port, self.config.keepalive_s)
        except (OSError, ValueError) as e:
            self._last_error = f"{link.device.device} cannot connect: {e}"
            log.debug("simulator: %s", self._last_error)
            self._schedule_reconnect(link)

    def _schedule_reconnect(self, link: _Link) -> None:
        if self._stopping or link.planned_offline or link.reconnect is not None:
            return
        low, high = self.config.reconnect_delay_s
        delay = self._rng.uniform(low, high)
        link.reconnect = self._loop.call_later(delay, lambda: self._connect(link))

    def _on_connect(self, client: Any, link: _Link, _flags: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            # Debug only: a broker that refuses a thousand devices would flood the log.
            self._last_error = f"the broker refused {link.device.device}: {reason}"
            log.debug("simulator: %s", self._last_error)
            return  # the broker closes the connection: on_disconnect retries
        client.subscribe(link.topic_assign, qos=1)
        with self._cond:
            device = link.device
            first = device.connected()
            self._bump()
        self._publish_telemetry(link)
        if first and device.traits.offline_at_s is not None:
            away = self.config.offline_for_s
            self._loop.call_later(device.traits.offline_at_s, lambda: self._go_offline(link, away))

    def _on_disconnect(self, _c: Any, link: _Link, _f: Any, reason: Any, _p: Any) -> None:
        with self._cond:
            link.device.disconnected()
            self._bump()
        if not self._stopping and not link.planned_offline:
            log.debug("simulator: %s lost its connection: %s", link.device.device, reason)
            self._schedule_reconnect(link)

    def _go_offline(self, link: _Link, for_s: float) -> None:
        if self._stopping or link.planned_offline:
            return
        link.planned_offline = True
        if link.reconnect is not None:
            link.reconnect.cancel()
            link.reconnect = None
        link.client.disconnect()
        self._loop.flush(link.client)

        def back() -> None:
            link.planned_offline = False
            self._connect(link)

        self._loop.call_later(for_s, back)

    def _disconnect_all(self) -> None:
        properties = None
        if self._protocol == "5":
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            properties = Properties(PacketTypes.DISCONNECT)
            properties.SessionExpiryInterval = 0  # leave nothing behind on the broker
        for link in self._links.values():
            for timer in (link.telemetry, link.reconnect):
                if timer is not None:
                    timer.cancel()
            if link.client.socket() is not None:
                link.client.disconnect(properties=properties)
                self._loop.flush(link.client)
            self._loop.detach(link.client)

    # -- messages (loop thread) ------------------------------------------------------------

    def _on_message(self, _client: Any, link: _Link, message: Any) -> None:
        if message.topic == link.topic_assign:
            self._handle_assignment(link, bytes(message.payload))

    def _handle_assignment(self, link: _Link, payload: bytes) -> None:
        with self._cond:
            decision = link.device.on_assignment(payload, time.time())
            self._bump()
        if decision.report is not None:
            self._publish_status(link, decision.report)
        if decision.install is not None:
            self._start_download(link, decision.install)

    def _start_download(self, link: _Link, assignment: Assignment) -> None:
        if self._stopping or self._pool is None:
            return
        with contextlib.suppress(RuntimeError):  # shut down meanwhile
            self._pool.submit(self._download, link, assignment)

    def _download(self, link: _Link, assignment: Assignment) -> None:
        """In a download thread: the manifest, verified, then the blob, digest checked."""
        error: str | None = None
        try:
            raw = self._retrying(
                lambda: self._fetcher.manifest(assignment.model, assignment.version)
            )
            manifest = link.device.accept_manifest(raw, assignment)
            self._retrying(lambda: self._fetcher.blob(manifest.blob.digest, manifest.blob.size))
        except SimulatorError as e:
            error = str(e)
        except Exception as e:  # a bug: still a failed report, never a stuck device
            log.exception("simulator: download for %s failed", link.device.device)
            error = f"internal error: {type(e).__name__}: {e}"
        if error is not None:
            self._last_error = f"{link.device.device}: {error}"
        if not self._stopping:
            self._loop.call_soon(lambda: self._download_done(link, error))

    def _retrying(self, fetch: Callable[[], _T]) -> _T:
        """``fetch()``, tried again after 0.5, 1, 2 and 4 s when the CDN fails (a restart)."""
        for attempt in range(_DOWNLOAD_RETRIES + 1):
            try:
                return fetch()
            except SimulatorError:
                if attempt == _DOWNLOAD_RETRIES or self._stopping:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def _download_done(self, link: _Link, error: str | None) -> None:
        with self._cond:
            report, delay = link.device.download_finished(error, time.time())
            self._bump()
        self._publish_status(link, report)
        if delay is None:
            self._install_over(link)
        else:
            self._loop.call_later(delay, lambda: self._install_done(link))

    def _install_done(self, link: _Link) -> None:
        with self._cond:
            report = link.device.install_finished(time.time())
            self._bump()
        self._publish_status(link, report)
        self._install_over(link)

    def _install_over(self, link: _Link) -> None:
        pending = link.device.take_pending()
        if pending is not None:
            self._handle_assignment(link, pending)

    # -- publishing (loop thread) ----------------------------------------------------------

    def _publish_status(self, link: _Link, status: UpdateStatus) -> None:
        # QoS 1: while offline it waits in the client and goes out on reconnect.
        link.client.publish(link.topic_status, status.to_json(), qos=1)
        self._status_reports += 1

    def _publish_telemetry(self, link: _Link) -> None:
        if link.telemetry is not None:
            link.telemetry.cancel()
        if self._stopping:
            return
        if link.device.online:
            with self._cond:
                report = link.device.telemetry(time.time())
            link.client.publish(link.topic_telemetry, report.to_json(), qos=0)
            self._telemetry_reports += 1
        interval = self.config.telemetry_interval_s * self._rng.uniform(0.75, 1.25)
        link.telemetry = self._loop.call_later(interval, lambda: self._publish_telemetry(link))

    # -- inside ----------------------------------------------------------------------------

    def _bump(self) -> None:
        """Call with ``_cond`` held, after a change: wakes ``wait_until``."""
        self._generation += 1
        self._cond.notify_all()

    def _snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(
            at=time.time(),
            devices={name: link.device.state() for name, link in self._links.items()},
            http_requests=self._fetcher.requests,
            status_reports=self._status_reports,
            telemetry_reports=self._telemetry_reports,
            last_error=self._last_error,
        )


def _raise_file_limit(needed: int) -> None:
    """Raise the soft limit on open files to the hard one when ``needed`` exceeds it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SimulatorError(
            f"{needed} open files are needed, but the hard limit is {hard}: "
            "simulate fewer devices or raise it (ulimit -Hn)"
        )
    target = needed if hard == resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        raise SimulatorError(f"cannot raise the open-file limit to {target}: {e}") from e
    log.info("simulator: raised the open-file limit from %d to %d", soft, target)
