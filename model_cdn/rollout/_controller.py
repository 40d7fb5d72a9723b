"""The rollout controller: drives ``Rollout`` machines with a clock, the registry and MQTT.

A thin loop around the pure state machine (``_machine``). One worker thread
owns the time-driven part; every change happens under one lock:

- events (``submit``): device heartbeats (``DeviceReport``) and update reports
  (``UpdateStatus``) arrive from the fleet link's network thread and are
  queued; the worker folds them into the ``FleetView`` (which believes labels
  only from the operator) and feeds them to the rollouts of that model (new
  devices join a running rollout's current wave; a heartbeat showing the
  version the rollout assigned counts as installed, which also recovers a
  report lost while the server was down; every heartbeat goes to the
  rollout's health judgement, which counts it only for a device of the
  wave's cohorts);
- every ``tick_s``: ``tick`` (timeouts, health looks, next wave, completion);
- commands (``create``, ``pause``, ``resume``, ``abort``, ``rollback``,
  ``skip-gate``) come from the admin API's threads and act at once; each is
  recorded in the rollout's ``history`` with who asked (``by``) and why.

``create`` first works out what the plan can decide (``_feasibility``) and
refuses a wave that cannot decide before the max soak unless
``accept_inconclusive``; ``dry_run`` answers the plan only. The baseline and
each device's own previous version are what the devices run (``_requests``).

The machines' actions are carried out through the ``AssignmentSender``
(the one way assignments leave the CDN): ``Assign`` signs an assignment with
the sender's key (``rollback`` for the way back); ``Unassign`` (abort)
re-assigns the previous version as a rollback, which a device still on it
ignores. Signed assignments wait in the rollout's outbox (``_outbox``)
until they are committed to the registry in one transaction with the
rollout's new snapshot (devices poll them over HTTP), and only then are
published retained without waiting for the broker (offline devices find
them when they reconnect). So whoever resumes re-sends stored documents and
never signs a second one for the same wave.

Persistence: a rollout's snapshot (``Rollout.to_dict``) is written to the
registry after every command and every action, and at most every
``flush_s`` after events; device records likewise, in one batch. A
restarted controller loads every rollout, re-publishes the assignments of
devices that have not reported, and goes on where it was: time in the
machine is wall-clock seconds, so device timeouts and soak times span the
restart.

Several replicas (``lease``, a ``LeaderLease``): only the holder of the
registry's rollout lease leads. The leader does all of the above with every
write fenced by its lease's token (``LeaseLostError`` once another server
took over: it then steps down and drops its in-memory rollouts). A follower
hears the fleet into its ``FleetView`` (``devices`` answers from it) but
writes nothing; it answers rollout reads from the registry and queues
commands there for the leader (``_commands``). On taking over, a controller
loads every rollout from the registry, re-publishes what devices have not
acted on, and counts devices its fleet view already shows on the new version
as installed. Without a lease the controller always leads (one server).

Exceptions (defined in ``model_cdn._errors``, re-exported here)::

    model_cdn.CdnError
    ├── RolloutStateError      the rollout's state does not allow the command (409)
    ├── RolloutConflictError   the model already has an active rollout (409)
    ├── RolloutRequestError    (ValueError) a request that cannot start a rollout (400):
    │                          bad fields, malformed waves, a 0-device wave, no device
    ├── NoRolloutLeaderError   a follower's command got no answer from a leader (503)
    └── RegistryError
        └── LeaseLostError     this server lost the rollout lease meanwhile (503)
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shared import DeviceReport, UpdateState, UpdateStatus

from .._assignment_sender import AssignmentSender
from .._errors import (
    LeaseLostError,
    RolloutConflictError,
    RolloutNotFoundError,
    RolloutRequestError,
)
from ..fleet._view import FleetView
from ..registry import DeviceRecord, Registry
from ..registry._leases import Fence, RolloutCommand
from ._commands import CommandQueue, apply_queued, apply_verb, view_answer
from ._feasibility import TrafficRates, describe_plan
from ._leader import LeaderLease
from ._machine import Action, Assign, DeviceStatus, Notify, Rollout, RolloutState, Unassign
from ._outbox import RolloutEntry, RolloutOutbox
from ._requests import (
    OPTIONS,
    explain_empty,
    plan_for,
    running_versions,
    spec_from,
    undecidable,
)
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


class RolloutController:
    """See the module docstring. ``start()`` the worker, ``stop()`` it (flushes state)."""

    def __init__(
        self,
        registry: Registry,
        sender: AssignmentSender,
        *,
        clock: Callable[[], float] = time.time,
        tick_s: float = 0.5,
        flush_s: float = 1.0,
        trust_claimed_labels: bool = False,
        assignment_ttl_days: float = 30,
        lease: LeaderLease | None = None,
        command_timeout_s: float = 15.0,
    ) -> None:
        if sender.key is None:
            raise ValueError(
                "the rollout controller signs assignments: give the assignment sender a key"
            )
        self.registry, self.sender = registry, sender
        self.clock, self.tick_s, self.flush_s = clock, tick_s, flush_s
        self.assignment_ttl_days = assignment_ttl_days
        self.lease = lease
        self.commands = CommandQueue(registry, timeout_s=command_timeout_s)
        self.outbox = RolloutOutbox(
            registry, sender, lease, clock=clock, assignment_ttl_days=assignment_ttl_days
        )
        self.fleet = FleetView(registry.list_devices(), trust_claimed_labels=trust_claimed_labels)
        self._entries: dict[str, RolloutEntry] = {}
        self.rates = TrafficRates()  # per-device traffic, for what a plan can decide
        self._published: dict[str, set[int]] = {}  # model -> versions, cached per create
        self._lock = threading.RLock()
        self._events: queue.SimpleQueue[DeviceReport | UpdateStatus] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events_seen = 0
        # Without a lease this controller always leads, unfenced; with one, from take-over on.
        self._leading = lease is None
        self._fence: Fence | None = None
        if self._leading:
            self._load_entries()

    @property
    def leading(self) -> bool:
        """Whether this controller is the rollout leader now."""
        with self._lock:
            self._sync_leadership()
            return self._leading

    # -------------------------------------------------------------- lifecycle

    def start(self) -> RolloutController:
        """Take the lease if free, re-publish what devices have not acted on, run the worker."""
        if self.lease is not None:
            self.lease.start()
        with self._lock:
            if self.lease is None:
                self._republish_all()
            else:
                self._sync_leadership()
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
            self._sync_leadership()
            if self._leading:
                self._flush(force=True)
        if self.lease is not None:
            self.lease.stop()  # releases it: a follower takes over at its next try

    def submit(self, event: DeviceReport | UpdateStatus) -> None:
        """Queue a heartbeat or an update report (any thread; never blocks)."""
        self._events.put(event)

    # --------------------------------------------------------------- commands

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a rollout from the admin API's JSON body; nothing changes if it fails.

        On a follower the command goes to the leader through the registry.
        """
        if not self.leading:
            return self.commands.submit("create", body=body)
        return self._create(body)

    def _create(self, body: Mapping[str, Any], command: RolloutCommand | None = None) -> Any:
        if not isinstance(body, Mapping):
            raise RolloutRequestError("the body is a JSON object")
        for option in OPTIONS & set(body):
            if not isinstance(body[option], str if option == "by" else bool):
                raise RolloutRequestError(
                    f"'{option}' is " + ("text" if option == "by" else "true or false")
                )
        with self._lock:
            self._drain()  # every device heard so far is a candidate
            spec = spec_from(body, self.registry, self.fleet)
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
            published = {v.version for v in self.registry.list_versions(spec.model)}
            self._published[spec.model] = published
            versions = running_versions(self.fleet, spec.model, published, spec.version)
            rollout = Rollout(spec)
            now = self.clock()
            try:
                actions = rollout.start(candidates, now, versions)
            except ValueError as e:
                raise RolloutRequestError(explain_empty(spec, str(e), self.fleet)) from e
            planned = plan_for(rollout, self.fleet, self.rates)
            if body.get("dry_run"):
                answer = {"dry_run": True, **self._view(RolloutEntry("", rollout, now, now))}
                answer.update(plan=planned, plan_text=describe_plan(planned))
                if command is not None:
                    self.registry.commit_rollout(
                        None, fence=self._fence, command=view_answer(command, answer)
                    )
                return answer
            if planned["undecidable"] and not body.get("accept_inconclusive"):
                raise RolloutRequestError(undecidable(planned))
            entry = RolloutEntry(f"ro-{secrets.token_hex(6)}", rollout, now, now, dirty=True)
            entry.plan = planned
            rollout.note("start", now, by=str(body.get("by", "")))
            self._entries[entry.id] = entry
            self._carry_out(entry, actions)
            if not self._persist(entry, command):
                return None  # the command was withdrawn: _persist forgot the rollout
            log.info(
                "rollout %s: %s@%d to %d devices in %d waves",
                entry.id,
                spec.model,
                spec.version,
                len(rollout.order),
                len(rollout.wave_ends),
            )
            view = self._view(entry)
            entry.plan = None
            return view

    def command(
        self, rollout_id: str, verb: str, args: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """``pause``, ``resume``, ``abort``, ``rollback`` or ``skip-gate``
        (``RolloutStateError`` if not now). ``args``: ``by`` (who asks, for the
        history) and, for ``skip-gate``, ``reason`` (required).

        On a follower the command goes to the leader through the registry.
        """
        if not self.leading:
            return self.commands.submit(verb, rollout_id=rollout_id, body=dict(args or {}))
        return self._command(rollout_id, verb, args=args)

    def _command(
        self,
        rollout_id: str,
        verb: str,
        command: RolloutCommand | None = None,
        *,
        args: Mapping[str, Any] | None = None,
    ) -> Any:
        if args is None and command is not None:
            args = command.body
        with self._lock:
            entry = self._entry(rollout_id)
            self._drain()  # act on every report that arrived before the command
            actions = apply_verb(entry.rollout, verb, self.clock(), args or {})
            entry.dirty = True
            self._carry_out(entry, actions)
            if not self._persist(entry, command):
                return None  # the command was withdrawn: _persist reloaded the rollout
            return self._view(entry)

    def _apply_queued(self) -> None:
        """Apply the commands followers queued (``_commands``)."""
        apply_queued(self.registry, self._fence, create=self._create, command=self._command)

    # ---------------------------------------------------------------- queries

    def get(self, rollout_id: str) -> dict[str, Any]:
        with self._lock:
            self._sync_leadership()
            if not self._leading:
                record = self.registry.get_rollout(rollout_id)
                return self._view(RolloutEntry.of(record))
            return self._view(self._entry(rollout_id))

    def rollouts(self) -> list[dict[str, Any]]:
        """Every rollout's status, newest first (a follower reads them from the registry)."""
        with self._lock:
            self._sync_leadership()
            if not self._leading:
                return [self._view(RolloutEntry.of(r)) for r in self.registry.list_rollouts()]
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
            dirty = self.fleet.take_dirty()
            if dirty:
                self.registry.upsert_devices(dirty)
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
            self._sync_leadership()
            if self._leading and tick:
                self._apply_queued()
                self._tick()
            if self._leading and flush:
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
                    self._sync_leadership()
                    now_m = time.monotonic()
                    if now_m >= next_tick:
                        if self._leading:
                            self._apply_queued()
                            self._tick()
                        next_tick = now_m + self.tick_s
                    if now_m >= next_flush:
                        if self._leading:
                            self._flush()
                        next_flush = now_m + self.flush_s
            except LeaseLostError as e:  # another server leads now: follow
                log.warning("rollout controller: %s", e)
                with self._lock:
                    self._step_down()
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
        if event.version is not None:
            self.rates.observe(event.device, now, event.requests, event.agreement_samples)
        for entry in self._active(event.model):
            r = entry.rollout
            published = self._versions_of(r.spec.model)
            version = event.version if event.version in published else None
            if version == r.spec.version:
                version = None
            actions = r.device_joined(event.device, record.labels, now, version)
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
            status in back and version == r.return_version(device)
        ):
            self.fleet.confirm_version(device, r.spec.model, version)
            return r.report(device, UpdateState.INSTALLED, version, now)
        return []

    def _after_event(self, entry: RolloutEntry, actions: list[Action]) -> None:
        if actions or entry.rollout.devices:
            entry.dirty = True
        self._carry_out(entry, actions)
        if entry.outbox or any(isinstance(a, Notify) for a in actions):
            self._persist(entry)  # state changes and assignments are written at once

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
                if entry.outbox or any(isinstance(a, Notify) for a in actions):
                    self._persist(entry)

    def _flush(self, *, force: bool = False) -> None:
        dirty = self.fleet.take_dirty()
        if dirty:
            self.registry.upsert_devices(dirty)
        for entry in list(self._entries.values()):
            if entry.dirty or entry.outbox or force:
                self._persist(entry)

    # ----------------------------------------------------------------- helpers

    def _active(self, model: str) -> Iterable[RolloutEntry]:
        return [
            e
            for e in self._entries.values()
            if e.rollout.spec.model == model and e.rollout.state in _ACTIVE
        ]

    def _versions_of(self, model: str) -> set[int]:
        """The model's published versions (read once, again at each create)."""
        if model not in self._published:
            self._published[model] = {v.version for v in self.registry.list_versions(model)}
        return self._published[model]

    def _entry(self, rollout_id: str) -> RolloutEntry:
        entry = self._entries.get(rollout_id)
        if entry is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r:.40}")
        return entry

    def _view(self, entry: RolloutEntry) -> dict[str, Any]:
        view = status_view(
            entry.id,
            entry.rollout,
            created_at=entry.created_at,
            updated_at=entry.updated_at,
            now=self.clock(),
        )
        if entry.plan is not None:  # the answer to create: what the plan can decide
            view.update(plan=entry.plan, plan_text=describe_plan(entry.plan))
        return view

    def _persist(self, entry: RolloutEntry, command: RolloutCommand | None = None) -> bool:
        """Commit the rollout with its outbox (``_outbox``); False: the command was withdrawn
        and the rollout is back as stored. ``LeaseLostError``: this server follows now."""
        try:
            done = self.outbox.commit(entry, self._view, self._fence, command)
        except LeaseLostError:
            self._step_down()
            raise
        if not done:
            self._reload(entry.id)
        return done

    def _carry_out(self, entry: RolloutEntry, actions: Iterable[Action]) -> None:
        r = entry.rollout
        for action in actions:
            if isinstance(action, Assign):
                self.outbox.sign(entry, action.device, action.version, action.rollback)
            elif isinstance(action, Unassign):
                self.outbox.sign(entry, action.device, r.return_version(action.device), True)
            elif isinstance(action, Notify):
                log.info(
                    "rollout %s: %s (wave %d) %s",
                    entry.id,
                    action.state.value,
                    action.wave + 1,
                    action.reason,
                )

    def _republish_all(self) -> None:
        for entry in list(self._entries.values()):
            if entry.rollout.state in _ACTIVE:
                self.outbox.republish(entry, self._fence)

    # ------------------------------------------------------------- leadership

    def _load_entries(self) -> None:
        self._entries = {r.id: RolloutEntry.of(r) for r in self.registry.list_rollouts()}

    def _reload(self, rollout_id: str) -> None:
        """Forget in-memory changes to one rollout: back to what the registry holds."""
        try:
            self._entries[rollout_id] = RolloutEntry.of(self.registry.get_rollout(rollout_id))
        except RolloutNotFoundError:
            self._entries.pop(rollout_id, None)

    def _sync_leadership(self) -> None:
        """Follow the lease: take over when it became ours, step down when it lapsed."""
        if self.lease is None:
            return
        fence = self.lease.current()
        if fence == self._fence:
            return
        if self._leading:
            self._step_down()
        if fence is not None:
            self._take_over(fence)

    def _take_over(self, fence: Fence) -> None:
        """Lead: every rollout as the registry holds it, then catch up with the fleet."""
        self._fence = fence
        self._load_entries()
        self._leading = True
        active = [e for e in self._entries.values() if e.rollout.state in _ACTIVE]
        log.info("rollout leader (token %d): resuming %d active rollouts", fence.token, len(active))
        for entry in active:
            self.outbox.republish(entry, self._fence)
            now, r, actions = self.clock(), entry.rollout, []
            for record in self.fleet.select(model=r.spec.model):
                d = r.devices.get(record.device)
                if d is not None:
                    version = record.models[r.spec.model]
                    actions += self._heartbeat_report(r, record.device, d.status, version, now)
            self._after_event(entry, actions)

    def _step_down(self) -> None:
        if self.lease is None:
            return  # one server, unfenced: nobody else can lead
        if self._leading:
            log.warning("rollout controller: not the leader any more; following")
        if self._fence is not None:
            self.lease.forfeit(self._fence)  # refused once: never trusted again
        self._leading, self._fence, self._entries = False, None, {}
