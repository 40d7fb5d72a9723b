"""A hub as processes: an executor per model instance, ingress processes in front of them.

``HubSupervisor`` is what ``tandem hub`` runs. It starts, in this order:

1. one executor process per model instance (``PlaneSpec.executors``: the
   ``instance_group`` of each model's config, expanded on this machine), each
   loading its model on its device and holding that model's batching queue,
   and one language executor per language model (``PlaneSpec.language``:
   its engine, its kept conversations; ``_llm_executor``);
2. ``mqtt_workers`` MQTT ingress processes, all in the hub's share group, and
   ``http_workers`` HTTP ingress processes sharing the API's port;

each one only after the previous ones said they serve, so the first request
finds everything loaded; except that the HTTP ingress processes start
first, so that ``/v2/health/live`` answers while models load and while the
broker is down (``/v2/health/ready`` says what is missing), and say they
serve once connected to the executors. Ingress processes pass tensors to the executors
through shared memory (``_ring``, ``_ipc``), so more of them add
throughput without splitting batches.

A child that dies while the hub runs is started again, after a back-off
that doubles (from ``RESTART_MIN_S`` up to the spec's ``restart_max_s``,
``RESTART_MAX_S`` by default) while the same slot keeps dying young;
restarts are counted in the hub's metrics (``tandem_hub_process_restarts{role}``).
What a dead child held is answered by the others (an executor's requests in
flight: ``overloaded``, by their ingress) or left to the devices' deadlines
(an ingress's): never answered with another request's outputs.

New versions come in without a restart: every ``repo_poll_s`` the
supervisor reads the repository (``plan_executors``: each model's served
version is ``default_version`` or the highest version directory), starts the
executors of a new version and waits until they have loaded and warmed the
model; only then does it point the served versions (``_served_versions``) at them, and the
ingress processes move new requests over while the old version answers
what it holds; the old executors retire (SIGUSR1) once no ingress uses them.
A version that fails to load leaves the old one serving (it is not tried
again until its directory changes). Copy a new version into place
atomically (write it beside, then rename the directory).

An operator can also choose (Triton's repository ``load`` and ``unload``,
asked through an HTTP ingress: ``_model_control``): a load pins a version
(pulled first through ``fetch``, the hub's CDN puller, when the repository
lacks it) and swaps it in the same way, an unload retires the model's
executors; each request is looked at within one watch tick, and answered once
done or with why it cannot be.

A signal stops restarts at once and ends a start still waiting for its
children. ``stop`` (SIGTERM or SIGINT to ``run_forever``) drains in reverse: the
ingress processes first (they unsubscribe and wait for their requests in
flight), then the executors (they answer what they still queue), each sent
SIGTERM, and SIGKILL after a grace period. Children also ask the kernel for
SIGTERM when the supervisor dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from .._errors import HubError
from ..metrics._book import BookDumper, MetricsBook
from ._child import READY_FD_ENV
from ._executor_pool import ServedVersion
from ._model_control import ModelControl
from ._roles import DRAIN_S
from ._served_versions import ServedVersionsFile, served_changes
from ._spec import ENV, ExecutorSpec, PlaneSpec, plan_executors

__all__ = ["RESTART_MAX_S", "RESTART_MIN_S", "Child", "HubSupervisor", "next_backoff"]

log = logging.getLogger(__name__)

RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0
_STABLE_S = 30.0  # a child that lived this long restarts without back-off
_WATCH_S = 0.2
# Big request buffers go straight back to the kernel when freed (glibc otherwise raises
# its mmap threshold after the first large free and keeps later ones in the heap).
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 * 1024), "MALLOC_TRIM_THRESHOLD_": str(1 << 20)}


@dataclass
class Child:
    """One slot of the hub: its role, index, the process now filling it, and its history."""

    role: str  # executor | llm | mqtt | http
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = RESTART_MIN_S
    due_at: float = 0.0  # when a dead child may be started again
    retiring: bool = False  # an executor whose version was replaced: not restarted

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class HubSupervisor:
    """Starts, watches, restarts and stops the processes of one hub (see module docstring)."""

    def __init__(
        self,
        spec: PlaneSpec,
        *,
        mqtt_workers: int = 1,
        http_workers: int = 1,
        ready_timeout_s: float = 600.0,
        repo_poll_s: float = 2.0,
        device: str | None = None,
        fetch: Callable[[str, str], None] | None = None,
    ) -> None:
        if mqtt_workers < 0 or http_workers < 0:
            raise ValueError("worker counts must be >= 0")
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"tandem-hub-{spec.hub_id}-"))
        self.metrics_dir = self.run_dir / "metrics"
        self.metrics_dir.mkdir()
        self.spec = dataclasses.replace(
            spec,
            metrics_dir=str(self.metrics_dir),
            served_file=str(self.run_dir / "routes.json"),  # the file name kept from older releases
            control_dir=str(self.run_dir / "control"),
            parent_pid=os.getpid(),
        )
        self.control = ModelControl(self.spec.control_dir)
        self.fetch = fetch  # (model, version): into the repository, from the CDN (--cdn)
        self._load_errors: dict[str, tuple[str, str]] = {}  # model -> (version, why it failed)
        self.served = dict(self.spec.served_versions())
        self._served_file = ServedVersionsFile(self.spec.served_file)
        self.repo_poll_s = repo_poll_s
        self.device = device
        self._failed: dict[tuple[str, str], float] = {}  # (model, version) -> its dir's mtime
        self._next_poll = 0.0
        self.ready_timeout_s = ready_timeout_s
        self.children = [Child("executor", i) for i in range(len(spec.executors))]
        self.children += [Child("llm", i) for i in range(len(spec.language))]
        if spec.broker is not None:
            self.children += [Child("mqtt", i) for i in range(mqtt_workers)]
        if spec.http_port:
            self.children += [Child("http", i) for i in range(http_workers)]
        self.book = MetricsBook("supervisor")
        self._dumper = BookDumper(self.book, self.metrics_dir)
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> HubSupervisor:
        """Start every child in order, each waited for; raises ``HubError`` (after cleanup)."""
        waiting: list[tuple[Child, int]] = []  # started, their "ready" not read yet
        try:
            self._served_file.write(self.served)
            # HTTP first, so that liveness answers while models load and the broker is down.
            waiting += [(c, self._launch(c)) for c in self._role("http")]
            for child in [*self._role("executor"), *self._role("llm")]:
                self._await(child, self._launch(child))
            waiting += [(c, self._launch(c)) for c in self._role("mqtt")]
            while waiting:
                child, read_fd = waiting.pop(0)
                self._await(child, read_fd)
        except BaseException:
            for _, read_fd in waiting:
                os.close(read_fd)
            self.stop()
            raise
        self._dumper.close()
        self._watcher = threading.Thread(target=self._watch, name="hub-supervisor", daemon=True)
        self._watcher.start()
        log.info(
            "hub %s serving: %s",
            self.spec.hub_id,
            ", ".join(f"{c.name} (pid {c.pid})" for c in self.children),
        )
        return self

    def stop(self, timeout_s: float = DRAIN_S + 5.0) -> None:
        """Drain and stop: ingress processes, then executors. Safe to call twice."""
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(2 * _WATCH_S + 1)
        for roles in (("mqtt", "http"), ("executor", "llm")):
            group = [c for c in list(self.children) if c.role in roles]
            _terminate([c.process for c in group if c.alive], timeout_s)
        self._dumper.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def run_forever(self) -> None:
        """Start, serve until SIGINT or SIGTERM (or ``request_stop``), then stop."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            if self._watcher is None:
                try:
                    self.start()
                except HubError:
                    if self._stop_requested.is_set():  # told to stop while starting: done
                        return
                    raise
            while not self._stop_requested.wait(1.0):
                pass
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def request_stop(self) -> None:
        self._stop_requested.set()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("got %s; stopping the hub", signal.Signals(signum).name)
        self._stopping.set()  # from now on no child is restarted, nor waited for to start
        self._stop_requested.set()

    # -- children -------------------------------------------------------------------------

    def _role(self, role: str) -> list[Child]:
        return [c for c in self.children if c.role == role]

    def _spawn(self, child: Child, *, wait: bool) -> None:
        read_fd = self._launch(child)
        if wait:
            self._await(child, read_fd)
        else:
            os.close(read_fd)
            log.info("hub %s started (pid %d)", child.name, child.pid)

    def _await(self, child: Child, read_fd: int) -> None:
        """Wait for ``child``'s "ready" on ``read_fd`` (closed here); ``HubError`` if none."""
        try:
            self._wait_ready(child, read_fd)
        finally:
            os.close(read_fd)
        log.info("hub %s started (pid %d)", child.name, child.pid)

    def _launch(self, child: Child) -> int:
        """Start ``child``'s process; returns the pipe it writes "ready" to."""
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env.update(_MALLOC_ENV)
        env[ENV] = self.spec.to_json()
        env[READY_FD_ENV] = str(write_fd)
        try:
            child.process = subprocess.Popen(
                [sys.executable, "-m", "cloud_hub.plane._child", child.role, str(child.index)],
                env=env,
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        child.started_at = time.monotonic()
        return read_fd

    def _wait_ready(self, child: Child, read_fd: int) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._stopping.is_set():
                raise HubError(f"hub stopped while {child.name} was starting")
            readable, _, _ = select.select([read_fd], [], [], 0.2)
            if readable and os.read(read_fd, 64).startswith(b"ready"):
                return
            if not child.alive:
                code = None if child.process is None else child.process.returncode
                raise HubError(f"hub {child.name} exited with {code} while starting (see its log)")
        raise HubError(f"hub {child.name} did not start within {self.ready_timeout_s:.0f}s")

    def _watch(self) -> None:
        while not self._stopping.wait(_WATCH_S):
            now = time.monotonic()
            for child in list(self.children):
                if child.alive or self._stopping.is_set():
                    continue
                if child.retiring:  # its version was replaced, and it has finished
                    with self._lock:
                        self.children.remove(child)
                    continue
                if child.due_at == 0.0:  # just found dead
                    self._schedule_restart(child, now)
                if now >= child.due_at:
                    child.due_at = 0.0
                    child.restarts += 1
                    self.book.inc("tandem_hub_process_restarts", (child.role,))
                    self._dumper.close()
                    try:
                        self._spawn(child, wait=False)
                    except OSError:
                        log.exception("cannot restart hub %s", child.name)

            asked = self.control.poll()  # an operator's load or unload: at once
            if asked:  # a load asked for by name is tried again, even if it failed before
                loading = self.control.loading()
                self._failed = {k: t for k, t in self._failed.items() if k[0] not in loading}
            due = bool(self.repo_poll_s) and now >= self._next_poll
            if (asked or due) and not self._stopping.is_set():
                self._next_poll = now + self.repo_poll_s
                self._fetch_wanted()
                self._refuse_unloadable()
                self._check_repository()

    # -- versions -------------------------------------------------------------------------

    def _check_repository(self) -> None:
        try:
            desired = self.control.restrict(
                plan_executors(
                    self.spec.repo, self.spec.hub_id, device=self.device, pinned=self.control.pinned
                )
            )
        except (HubError, OSError) as e:  # a config being edited, a directory being copied
            log.warning("repository %s not read this time: %s", self.spec.repo, e)
            return
        changes = served_changes(self.served, desired)
        for model, specs in changes.incoming.items():
            stamp = _mtime(Path(self.spec.repo) / model / specs[0].version)
            if self._failed.get((model, specs[0].version)) == stamp:
                continue  # failed to load, and nothing changed since
            if not self._swap_in(model, specs):
                self._failed[(model, specs[0].version)] = stamp
        for model in changes.gone:
            log.info("model %s left the repository; its executors retire", model)
            del self.served[model]
            self._served_file.write(self.served)
            self._retire(model, keep=None)
        self.control.settle(
            {m: v.version for m, v in self.served.items()}, self._not_loadable, self._load_error
        )

    def _fetch_wanted(self) -> None:
        """Pull each version an operator asked to load that the repository lacks (--cdn)."""
        for model, version in self.control.wanted():
            if self.fetch is None or (Path(self.spec.repo) / model / version).is_dir():
                continue
            try:
                self.fetch(model, version)
            except Exception as e:  # the CDN's answer, whatever it is, becomes the load's
                self._load_errors[model] = (version, f"version {version} not pulled: {e}")

    def _refuse_unloadable(self) -> None:
        """Answer the loads that cannot be done before planning, so none moves what serves."""
        self.control.settle(
            {m: v.version for m, v in self.served.items()}, self._not_loadable, lambda m, v: None
        )

    def _not_loadable(self, model: str, version: str | None) -> str | None:
        folder = Path(self.spec.repo) / model
        if not folder.is_dir():
            return f"model {model} is not in the repository"
        if version is not None and not (folder / version).is_dir():
            if model in self._load_errors and self._load_errors[model][0] == version:
                return self._load_errors[model][1]
            return f"version {version} of model {model} is not in the repository"
        return None

    def _load_error(self, model: str, version: str | None) -> str | None:
        failed = self._load_errors.get(model)
        if failed is None or version not in (None, failed[0]):
            return None
        return failed[1]

    def _swap_in(self, model: str, specs: list[ExecutorSpec]) -> bool:
        """Start ``specs`` (one model's new version), then serve from them; False if they fail."""
        version = specs[0].version
        old = self.served.get(model)
        first = len(self.spec.executors)
        self.spec = dataclasses.replace(self.spec, executors=(*self.spec.executors, *specs))
        fresh = [Child("executor", first + i) for i in range(len(specs))]
        try:
            for child in fresh:
                self._spawn(child, wait=True)  # loaded and warmed up before any request
        except HubError as e:
            self._load_errors[model] = (version, f"version {version} did not load: {e}")
            _terminate([c.process for c in fresh], 5.0)
            self.book.inc("tandem_hub_version_load_failures", (model,))
            self._dumper.close()
            log.error(
                "model %s version %s did not load (%s); %s",
                model,
                version,
                e,
                "it is not served" if old is None else f"version {old.version} keeps serving",
            )
            return False
        self._load_errors.pop(model, None)
        with self._lock:
            self.children += fresh
        self.served[model] = ServedVersion(version, tuple(s.address for s in specs))
        self._served_file.write(self.served)
        self.book.inc("tandem_hub_version_swaps", (model,))
        self._dumper.close()
        self._retire(model, keep=version)
        log.info(
            "model %s: version %s serves%s",
            model,
            version,
            "" if old is None else f" (was {old.version})",
        )
        return True

    def _retire(self, model: str, keep: str | None) -> None:
        """SIGUSR1 to ``model``'s executors of versions other than ``keep``."""
        for child in list(self.children):
            if child.role != "executor" or child.retiring:
                continue
            spec = self.spec.executors[child.index]
            if spec.model == model and spec.version != keep:
                child.retiring = True
                if child.alive and child.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGUSR1)

    def _schedule_restart(self, child: Child, now: float) -> None:
        code = None if child.process is None else child.process.returncode
        lived = now - child.started_at
        child.backoff_s = next_backoff(child.backoff_s, lived, cap_s=self.spec.restart_max_s)
        child.due_at = now + child.backoff_s
        log.error(
            "hub %s (pid %s) exited with %s after %.1fs; restarting it in %.1fs",
            child.name,
            child.pid,
            code,
            lived,
            child.backoff_s,
        )


def next_backoff(backoff_s: float, lived_s: float, *, cap_s: float = RESTART_MAX_S) -> float:
    """The wait before a dead child's restart: the last one doubled (up to ``cap_s``) while
    it keeps dying young, ``RESTART_MIN_S`` again once it lived past ``_STABLE_S``."""
    if lived_s > _STABLE_S:
        return RESTART_MIN_S
    return max(RESTART_MIN_S, min(cap_s, backoff_s * 2))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _terminate(processes: list[subprocess.Popen[bytes] | None], timeout_s: float) -> None:
    running = [p for p in processes if p is not None and p.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("hub process %d outlived its stop; killing it", process.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
