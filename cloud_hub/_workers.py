"""Extra hub processes for ``tandem hub --workers N``: one machine, several GILs.

A hub process answers MQTT requests on one core at most: paho's network
thread reads, acknowledges and decodes every request in Python, and the
batcher encodes every reply, all under one GIL. ``HubWorkers`` starts N - 1
more hub processes beside the one running the command; each loads the model
repository, runs its own batchers and executors, and subscribes to the same
shared subscription group, so the broker spreads requests over all of them
(each request reaches one). Only the first process serves the HTTP API and
``/metrics``; the counters there are its own.

Lifecycle: ``start`` spawns the workers (``python -m cloud_hub._workers``,
their settings in an environment variable so broker credentials stay out of
``ps``); a monitor thread restarts a worker that dies while the pool runs,
at most once every ``_RESTART_DELAY_S`` per worker; ``stop`` sends SIGTERM
(each worker stops as ``tandem hub`` does: queued requests answered, replies
flushed) and SIGKILL to any still running after ``timeout_s``. A worker
whose parent dies (SIGKILL) stops by itself: it watches its parent's PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HubWorkers", "WorkerSpec"]

log = logging.getLogger(__name__)

_ENV = "TANDEM_HUB_WORKER_SPEC"
_RESTART_DELAY_S = 5.0
_WATCH_S = 1.0


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What a worker needs to serve like the command that started it."""

    repo: str
    broker: str  # the URL as given, credentials included
    share_group: str
    prefix: str = "tandem/v1"
    mqtt_ca: str | None = None
    mqtt_cert: str | None = None
    mqtt_key: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    parent_pid: int = 0  # set by HubWorkers: the worker stops when this process is gone


class HubWorkers:
    """``count`` hub processes beside this one, serving MQTT in the same share group."""

    def __init__(self, count: int, spec: WorkerSpec) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.count = count
        self.spec = dataclasses.replace(spec, parent_pid=os.getpid())
        self._processes: list[subprocess.Popen[bytes] | None] = [None] * count
        self._started_at = [0.0] * count
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p is not None and p.poll() is None]

    def start(self) -> HubWorkers:
        for slot in range(self.count):
            self._spawn(slot)
        if self.count:
            self._monitor = threading.Thread(target=self._watch, name="hub-workers", daemon=True)
            self._monitor.start()
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every worker, wait for them, SIGKILL those that outlive ``timeout_s``."""
        self._stopping.set()
        running = [p for p in self._processes if p is not None and p.poll() is None]
        for process in running:
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("hub worker %d outlived stop(); killing it", process.pid)
                _signal(process, signal.SIGKILL)
                process.wait()
        if self._monitor is not None:
            self._monitor.join(_WATCH_S * 2)

    def _spawn(self, slot: int) -> None:
        env = dict(os.environ, **{_ENV: json.dumps(dataclasses.asdict(self.spec))})
        process = subprocess.Popen(
            [sys.executable, "-m", "cloud_hub._workers"], env=env, stdin=subprocess.DEVNULL
        )
        self._processes[slot] = process
        self._started_at[slot] = time.monotonic()
        log.info("hub worker %d started (pid %d)", slot + 1, process.pid)

    def _watch(self) -> None:
        while not self._stopping.wait(_WATCH_S):
            for slot, process in enumerate(self._processes):
                if process is None or process.poll() is None or self._stopping.is_set():
                    continue
                if time.monotonic() - self._started_at[slot] < _RESTART_DELAY_S:
                    continue  # it died young: wait before trying again
                log.error(
                    "hub worker %d (pid %d) exited with %s; restarting it",
                    slot + 1,
                    process.pid,
                    process.returncode,
                )
                self._spawn(slot)


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has just exited
        os.kill(process.pid, sig)


def _watch_parent(parent_pid: int, stop: threading.Event, request_stop: Callable[[], None]) -> None:
    while not stop.wait(_WATCH_S):
        if os.getppid() != parent_pid:
            log.warning("the hub that started this worker is gone; stopping")
            request_stop()
            return


def main() -> None:
    """``python -m cloud_hub._workers``: one worker, its settings in ``TANDEM_HUB_WORKER_SPEC``."""
    from shared import Limits, MqttSettings, Topics
    from shared._logging import configure_logging

    from ._server import Hub

    spec = WorkerSpec(**json.loads(os.environ.pop(_ENV)))
    configure_logging(spec.log_level, json=spec.log_format == "json", stream=sys.stderr)
    hub = Hub(
        Path(spec.repo),
        mqtt=MqttSettings.from_url(spec.broker).with_tls(
            ca_certs=spec.mqtt_ca, certfile=spec.mqtt_cert, keyfile=spec.mqtt_key
        ),
        topics=Topics(spec.prefix),
        share_group=spec.share_group,
        limits=Limits(),
        connect_timeout_s=None,
    )
    watching = threading.Event()
    watcher = threading.Thread(
        target=_watch_parent,
        args=(spec.parent_pid, watching, hub.request_stop),
        name="hub-parent-watch",
        daemon=True,
    )
    watcher.start()
    try:
        hub.run_forever()
    finally:
        watching.set()


if __name__ == "__main__":
    main()
