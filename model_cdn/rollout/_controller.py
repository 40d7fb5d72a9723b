"""The rollout controller: drives ``Rollout`` machines with a clock, the registry and MQTT.

A thin loop around the pure state machine (``_machine``). One worker thread
owns the time-driven part; every change happens under one lock:

- events (``submit``): device heartbeats (``DeviceReport``) and update reports
  (``UpdateStatus``) arrive from the fleet link's network thread and are
  queued; the worker folds them into the ``FleetView`` (which believes labels
  only from the operator, and drops stale heartbeats) and feeds them to the
  rollouts of that model (new devices join a running rollout's current wave;
  a heartbeat showing the version the rollout assigned counts as installed,
  which also recovers a report lost while the server was down; every fresh
  heartbeat goes to the rollout's health judgement, which counts it only for
  a device of the wave's cohorts);
- every ``tick_s``: ``tick`` (timeouts, health looks, next wave, completion);
- commands (``create``, ``pause``, ``resume``, ``abort``, ``rollback``) come
  from the admin API's threads and act at once.

The machines' actions are carried out through the ``AssignmentPublisher``
(the one way assignments leave the CDN): ``Assign`` signs an assignment with
the publisher's key (``rollback`` for the way back), stores it in the
registry (devices poll it over HTTP) and publishes it retained without
waiting for the broker (offline devices find it when they reconnect; paho
sends it again after a reconnect of the CDN's own link); ``Unassign``
(abort) re-assigns the previous version as a rollback, which a device still
on it ignores.

Persistence: a rollout's snapshot (``Rollout.to_dict``) is written to the
registry after every command and at most every ``flush_s`` after events;
device records likewise, in one batch. A restarted controller loads every
rollout, re-publishes the assignments of devices that have not reported, and
goes on where it was: time in the machine is wall-clock seconds, so device
timeouts and soak times span the restart.

Exceptions (defined in ``model_cdn._errors``, re-exported here)::

    model_cdn.CdnError
    ├── RolloutStateError      the rollout's state does not allow the command (409)
    ├── RolloutConflictError   the model already has an active rollout (409)
    └── RolloutRequestError    (ValueError) a request that cannot start a rollout (400):
                               bad fields, malformed waves, a 0-device wave, no device
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import DeviceReport, UpdateState, UpdateStatus

from .._errors import (
    ModelNotFoundError,
    RolloutConflictError,
    RolloutNotFoundError,
    RolloutRequestError,
)
from .._publisher import AssignmentPublisher
from ..fleet._view import FleetView
from ..registry import DeviceRecord, Registry, RolloutRecord
from ._machine import Action, Assign, DeviceStatus, Notify, Rollout, RolloutState, Unassign
from ._spec import RolloutSpec
from ._view import status_view

__all__ = ["RolloutConflictError", "RolloutController", "RolloutRequestError"]

log = logging.getLogger("tandem.cdn.rollout")

_ACTIVE = {
    RolloutState.PENDING,
    RolloutState.RUNNING,
    RolloutState.PAUSED,
    RolloutState.HALTED,
    RolloutState.ROLLING_BACK,
}
# what a request to start a rollout may set, besides model, version and previous_version
_SPEC_FIELDS = {
    "target",
    "waves",
    "max_failure_rate",
    "min_reports",
    "soak_s",
    "device_timeout_s",
    "max_error_rate_increase",
    "max_p99_latency_ratio",
    "max_offload_rate_increase",
    "max_agreement_drop",
    "min_health_samples",
    "confidence",
    "looks",
    "max_soak_s",
    "max_outliers",
    "max_device_rps",
}


@dataclass
class _Entry:
    id: str
    rollout: Rollout
    created_at: float
    updated_at: float
    dirty: bool = False


class RolloutController:
    """See the module docstring. ``start()`` the worker, ``stop()`` it (flushes state)."""

    def __init__(
        self,
        registry: Registry,
        publisher: AssignmentPublisher,
        *,
        clock: Callable[[], float] = time.time,
        tick_s: float = 0.5,
        flush_s: float = 1.0,
        assignment_ttl_days: float = 30,
        trust_claimed_labels: bool = False,
    ) -> None:
        if publisher.key is None:
            raise ValueError("the rollout controller signs assignments: give the publisher a key")
        self.registry, self.publisher = registry, publisher
        self.clock, self.tick_s, self.flush_s = clock, tick_s, flush_s
        self.assignment_ttl_days = assignment_ttl_days
        self.fleet = FleetView(registry.list_devices(), trust_claimed_labels=trust_claimed_labels)
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.RLock()
        self._events: queue.SimpleQueue[DeviceReport | UpdateStatus] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events_seen = 0
        for record in registry.list_rollouts():
            rollout = Rollout.from_dict(record.snapshot["rollout"])
            self._entries[record.id] = _Entry(
                record.id, rollout, record.created_at, record.updated_at
            )

    # -------------------------------------------------------------- lifecycle

    def start(self) -> RolloutController:
        """Re-publish what devices have not acted on yet, then run the worker."""
        with self._lock:
            for entry in self._entries.values():
                if entry.rollout.state in _ACTIVE:
                    self._republish(entry)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tandem-rollouts", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, timeout_s: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout_s)
        with self._lock:
            self._drain()
            self._flush(force=True)

    def submit(self, event: DeviceReport | UpdateStatus) -> None:
        """Queue a heartbeat or an update report (any thread; never blocks)."""
        self._events.put(event)

    # --------------------------------------------------------------- commands

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a rollout from the admin API's JSON body; nothing changes if it fails."""
        spec = self._spec_from(body)
        with self._lock:
            self._drain()  # every device heard so far is a candidate
            busy = [
                e.id
                for e in self._entries.values()
                if e.rollout.spec.model == spec.model and e.rollout.state in _ACTIVE
            ]
            if busy:
                raise RolloutConflictError(
                    f"{spec.model} already has rollout {busy[0]} in progress: "
                    "finish, abort or roll it back first"
                )
            candidates = {r.device: r.labels for r in self.fleet.select(model=spec.model)}
            rollout = Rollout(spec)
            now = self.clock()
            try:
                actions = rollout.start(candidates, now)
            except ValueError as e:
                raise RolloutRequestError(self._explain_empty(spec, str(e))) from e
            entry = _Entry(f"ro-{secrets.token_hex(6)}", rollout, now, now, dirty=True)
            self._entries[entry.id] = entry
            self._carry_out(entry, actions)
            self._persist(entry)
            log.info(
                "rollout %s: %s@%d to %d devices in %d waves",
                entry.id,
                spec.model,
                spec.version,
                len(rollout.order),
                len(rollout.wave_ends),
            )
            return self._view(entry)

    def command(self, rollout_id: str, verb: str) -> dict[str, Any]:
        """``pause``, ``resume``, ``abort`` or ``rollback`` (``RolloutStateError`` if not now)."""
        with self._lock:
            entry = self._entry(rollout_id)
            self._drain()  # act on every report that arrived before the command
            r, now = entry.rollout, self.clock()
            if verb == "pause":
                actions = r.pause()
            elif verb == "resume":
                actions = r.resume(now)
            elif verb == "abort":
                actions = r.abort()
            elif verb == "rollback":
                actions = r.rollback(now)
            else:
                raise ValueError(f"unknown rollout command {verb!r}")
            entry.dirty = True
            self._carry_out(entry, actions)
            self._persist(entry)
            return self._view(entry)

    # ---------------------------------------------------------------- queries

    def get(self, rollout_id: str) -> dict[str, Any]:
        with self._lock:
            return self._view(self._entry(rollout_id))

    def rollouts(self) -> list[dict[str, Any]]:
        """Every rollout's status, newest first."""
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: e.created_at, reverse=True)
            return [self._view(e) for e in entries]

    def devices(
        self,
        labels: Mapping[str, str] | None = None,
        model: str | None = None,
        version: int | None = None,
    ) -> list[DeviceRecord]:
        with self._lock:
            return self.fleet.select(labels, model, version)

    def device(self, device: str) -> DeviceRecord | None:
        with self._lock:
            return self.fleet.devices.get(device)

    def set_labels(self, labels: Mapping[str, Mapping[str, str]]) -> list[DeviceRecord]:
        """The operator's labels for each device named (replacing theirs); written at once."""
        with self._lock:
            now = self.clock()
            records = [self.fleet.set_labels(d, dict(v), now) for d, v in labels.items()]
            self._flush()
            return records

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued event was processed (tests, benchmarks)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._events.empty():
                with self._lock:  # the worker holds the lock while it processes a batch
                    if self._events.empty():
                        return True
            time.sleep(0.01)
        return False

    # ------------------------------------------------------------------ worker

    def step(self, *, tick: bool = True, flush: bool = True) -> None:
        """Process every queued event, then tick and write state (what the worker does)."""
        with self._lock:
            self._drain()
            if tick:
                self._tick()
            if flush:
                self._flush()

    def _run(self) -> None:
        next_tick = next_flush = time.monotonic()
        while not self._stop.is_set():
            try:
                first = self._events.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                first = None
            try:
                with self._lock:
                    if first is not None:
                        self._handle(first)
                        self._drain(limit=5000)
                    now_m = time.monotonic()
                    if now_m >= next_tick:
                        self._tick()
                        next_tick = now_m + self.tick_s
                    if now_m >= next_flush:
                        self._flush()
                        next_flush = now_m + self.flush_s
            except Exception:  # the loop must survive a bug in one event or a DB hiccup
                log.exception("rollout controller step failed")
                self._stop.wait(self.tick_s)

    def _drain(self, limit: int | None = None) -> None:
        n = 0
        while limit is None or n < limit:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)
            n += 1

    def _handle(self, event: DeviceReport | UpdateStatus) -> None:
        self.events_seen += 1
        now = self.clock()
        if isinstance(event, UpdateStatus):
            self.fleet.observe_status(event, now)
            for entry in self._active(event.model):
                actions = entry.rollout.report(event.device, event.state, event.version, now)
                self._after_event(entry, actions)
            return
        heard = self.fleet.observe_report(event, now)
        record = heard.record
        if event.model is None or not heard.fresh or record is None:
            return
        for entry in self._active(event.model):
            r = entry.rollout
            actions = r.device_joined(event.device, record.labels, now)
            d = r.devices.get(event.device)
            if d is not None and event.version is not None:
                actions += self._heartbeat_report(r, event.device, d.status, event.version, now)
            actions += r.telemetry(event.device, record.telemetry or {}, now)
            self._after_event(entry, actions)

    def _heartbeat_report(
        self, r: Rollout, device: str, status: DeviceStatus, version: int, now: float
    ) -> list[Action]:
        """A device running the version it was sent to has installed it, report or not."""
        back = (DeviceStatus.ROLLBACK_ASSIGNED, DeviceStatus.ROLLBACK_FAILED)
        if (status is DeviceStatus.ASSIGNED and version == r.spec.version) or (
            status in back and version == r.spec.previous_version
        ):
            self.fleet.confirm_version(device, r.spec.model, version)
            return r.report(device, UpdateState.INSTALLED, version, now)
        return []

    def _after_event(self, entry: _Entry, actions: list[Action]) -> None:
        if actions or entry.rollout.devices:
            entry.dirty = True
        self._carry_out(entry, actions)
        if any(isinstance(a, Notify) for a in actions):
            self._persist(entry)  # state changes are written at once

    def _tick(self) -> None:
        now = self.clock()
        for entry in self._entries.values():
            r = entry.rollout
            if r.state not in _ACTIVE:
                continue
            actions = r.tick(now)
            if actions:
                entry.dirty = True
                self._carry_out(entry, actions)
                if any(isinstance(a, Notify) for a in actions):
                    self._persist(entry)

    def _flush(self, *, force: bool = False) -> None:
        dirty = self.fleet.take_dirty()
        if dirty:
            self.registry.upsert_devices(dirty)
        for entry in self._entries.values():
            if entry.dirty or force:
                self._persist(entry)

    # ----------------------------------------------------------------- helpers

    def _active(self, model: str) -> Iterable[_Entry]:
        return [
            e
            for e in self._entries.values()
            if e.rollout.spec.model == model and e.rollout.state in _ACTIVE
        ]

    def _entry(self, rollout_id: str) -> _Entry:
        entry = self._entries.get(rollout_id)
        if entry is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r:.40}")
        return entry

    def _view(self, entry: _Entry) -> dict[str, Any]:
        return status_view(
            entry.id,
            entry.rollout,
            created_at=entry.created_at,
            updated_at=entry.updated_at,
            now=self.clock(),
        )

    def _persist(self, entry: _Entry) -> None:
        entry.updated_at = self.clock()
        r = entry.rollout
        self.registry.put_rollout(
            RolloutRecord(
                id=entry.id,
                model=r.spec.model,
                version=r.spec.version,
                state=r.state.value,
                snapshot={"rollout": r.to_dict()},
                created_at=entry.created_at,
                updated_at=entry.updated_at,
            )
        )
        entry.dirty = False

    def _carry_out(self, entry: _Entry, actions: Iterable[Action]) -> None:
        spec = entry.rollout.spec
        for action in actions:
            if isinstance(action, Assign):
                self._assign(entry, action.device, action.version, action.rollback)
            elif isinstance(action, Unassign):
                self._assign(entry, action.device, spec.previous_version, True)
            elif isinstance(action, Notify):
                log.info(
                    "rollout %s: %s (wave %d) %s",
                    entry.id,
                    action.state.value,
                    action.wave + 1,
                    action.reason,
                )

    def _assign(self, entry: _Entry, device: str, version: int, rollback: bool) -> None:
        model = entry.rollout.spec.model
        doc = self.publisher.sign(
            device=device,
            model=model,
            version=version,
            rollback=rollback,
            rollout=entry.id,
            ttl_days=self.assignment_ttl_days,
        )
        self.publisher.deliver(self.registry, device, model, doc, wait=False)

    def _republish(self, entry: _Entry) -> None:
        model = entry.rollout.spec.model
        waiting = (DeviceStatus.ASSIGNED, DeviceStatus.ROLLBACK_ASSIGNED)
        for device, d in entry.rollout.devices.items():
            if d.status in waiting:
                doc = self.registry.get_assignment(device, model)
                if doc is not None:
                    self.publisher.publish(device, doc, wait=False)

    def _spec_from(self, body: Mapping[str, Any]) -> RolloutSpec:
        if not isinstance(body, Mapping):
            raise RolloutRequestError("the body is a JSON object")
        unknown = set(body) - _SPEC_FIELDS - {"model", "version", "previous_version"}
        if unknown:
            raise RolloutRequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
        model, version = body.get("model"), body.get("version")
        if not isinstance(model, str) or not model:
            raise RolloutRequestError("'model' names the model to roll out")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RolloutRequestError("'version' is the positive version number to roll out")
        self.registry.get_version(model, version)  # ModelNotFoundError: 404
        previous = body.get("previous_version")
        if previous is None:
            earlier = [v.version for v in self.registry.list_versions(model) if v.version < version]
            if not earlier:
                raise RolloutRequestError(
                    f"{model} has no version below {version} to fall back to; set previous_version"
                )
            previous = max(earlier)
        elif isinstance(previous, int) and not isinstance(previous, bool):
            try:
                self.registry.get_version(model, previous)
            except ModelNotFoundError as e:
                raise RolloutRequestError(f"previous_version: {e}") from e
        if "waves" not in body:
            raise RolloutRequestError("'waves' is required, e.g. \"5%,25%,100%\"")
        fields = {k: body[k] for k in _SPEC_FIELDS if k in body and body[k] is not None}
        try:
            return RolloutSpec(model=model, version=version, previous_version=previous, **fields)
        except (TypeError, ValueError) as e:
            raise RolloutRequestError(str(e)) from e

    def _explain_empty(self, spec: RolloutSpec, message: str) -> str:
        if "0 devices" in message or "empty" in message or "no device" in message:
            running = len(self.fleet.select(model=spec.model))
            target = ", ".join(f"{k}={v}" for k, v in spec.target.items()) or "(all)"
            return f"{message} (target {target}; {running} known devices run {spec.model})"
        return message
