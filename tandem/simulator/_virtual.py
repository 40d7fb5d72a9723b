"""Rollouts in virtual time: the rollout machine and the fleet view against simulated devices.

No network and no waiting: ``VirtualFleet`` runs the CDN's own pure parts —
``model_cdn.fleet.FleetView`` (what the server believes of a heartbeat) and
``model_cdn.rollout.Rollout`` (waves, cohorts, health looks) — against
``SimulatedDevice``s (the same devices ``FleetSimulator`` puts on MQTT: the
real updater's trust rules on signed assignments, the same traffic and
telemetry, liars included) on an event queue with a virtual clock. A rollout
that soaks for ten minutes runs in a fraction of a second, so the gates'
error rates can be measured over hundreds of rollouts (``bench/rollout_gates``)
and attacks can be staged in tests.

What it leaves out: MQTT delivery, downloads (an install takes a random
``install_s``) and the controller's thread; what the controller does with a
heartbeat (fold it into the view, then hand the record to the rollout) and
with an update report is done the same way here.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from model_cdn import make_assignment
from model_cdn.fleet import FleetView
from model_cdn.rollout import Assign, Notify, Rollout, RolloutSpec, RolloutState
from shared import SigningKey, UpdateState

from ._config import SimulatorConfig
from ._device import SimulatedDevice, draw_traits

__all__ = ["VirtualFleet", "VirtualOutcome"]

_STOPPED = (RolloutState.COMPLETED, RolloutState.HALTED, RolloutState.ABORTED)


@dataclass
class VirtualOutcome:
    """How one virtual rollout ended."""

    state: str
    wave: int  # 0-based wave it ended in
    reason: str
    seconds: float  # virtual time from start to the end
    wave_decisions_s: list[float] = field(default_factory=list)  # each wave's length
    looks: int = 0  # health looks of the last wave
    compute_s: list[float] = field(default_factory=list)  # CPU time of each judging tick
    status: dict[str, Any] = field(default_factory=dict)


class VirtualFleet:
    """A simulated fleet on a virtual clock; ``rollout(spec)`` runs one rollout to its end.

    ``config.broker`` and the CDN settings are unused. ``key`` signs the
    assignments and must be among ``config.trusted_keys``.
    """

    def __init__(
        self,
        config: SimulatorConfig,
        key: SigningKey,
        *,
        heartbeat_s: float | None = None,
        tick_s: float = 1.0,
        install_s: tuple[float, float] = (1.0, 5.0),
    ) -> None:
        self.config, self.key = config, key
        self.heartbeat_s = heartbeat_s or config.telemetry_interval_s
        self.tick_s, self.install_s = tick_s, install_s
        self.now = 0.0
        self.devices: dict[str, SimulatedDevice] = {}
        self.fleet = FleetView()
        traits = draw_traits(config)
        for i in range(config.devices):
            name = config.device_id(i)
            labels = config.device_labels(i)
            device = SimulatedDevice(name, config=config, labels=labels, traits=traits[i], now=0.0)
            device.connected()
            self.devices[name] = device
            self.fleet.set_labels(name, labels, 0.0)  # the operator's inventory
        self._rng = random.Random(f"{config.seed}/virtual")
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._beating: set[str] = set()
        for name in self.devices:  # every device says hello once: the fleet knows its model
            self._heartbeat(name, self._rng.uniform(0, self.heartbeat_s), once=True)
        self._run_until(self.heartbeat_s)

    # -- the event queue -------------------------------------------------------------------

    def _at(self, when: float, what: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), what))

    def _run_until(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            when, _, what = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            what()
        self.now = max(self.now, until)

    # -- devices ---------------------------------------------------------------------------

    def _heartbeat(self, name: str, when: float, *, once: bool = False) -> None:
        def beat() -> None:
            if not once and name not in self._beating:
                return
            report = self.devices[name].report(self.now)
            heard = self.fleet.observe_report(report, self.now)
            rollout = self._rollout
            if rollout is not None and heard.fresh and heard.record is not None:
                telemetry = heard.record.telemetry or {}
                rollout.device_joined(name, heard.record.labels, self.now)
                rollout.telemetry(name, telemetry, self.now)
            if not once:
                self._heartbeat(name, self.now + self.heartbeat_s * self._rng.uniform(0.75, 1.25))

        self._at(when, beat)

    def _assign(self, action: Assign, rollout_id: str) -> None:
        doc = make_assignment(
            self.key,
            device=action.device,
            model=self.config.model,
            version=action.version,
            rollback=action.rollback,
            rollout=rollout_id,
        )
        device = self.devices[action.device]
        decision = device.on_assignment(json.dumps(doc).encode(), self.now)
        if decision.report is not None:
            self._status(decision.report)
        if decision.install is None:
            return

        def downloaded() -> None:
            report, delay = device.download_finished(None, self.now)
            self._status(report)
            if delay is not None:
                self._at(self.now + delay, lambda: self._status(device.install_finished(self.now)))

        self._at(self.now + self._rng.uniform(*self.install_s), downloaded)

    def _status(self, status: Any) -> None:
        self.fleet.observe_status(status, self.now)
        rollout = self._rollout
        if rollout is not None and status.state in (
            UpdateState.INSTALLED,
            UpdateState.FAILED,
            UpdateState.ROLLED_BACK,
        ):
            self._carry_out(rollout.report(status.device, status.state, status.version, self.now))

    # -- a rollout -------------------------------------------------------------------------

    _rollout: Rollout | None = None
    _rollout_id = "ro-000000000000"

    def _carry_out(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Assign):
                self._assign(action, self._rollout_id)

    def _sync_heartbeats(self, rollout: Rollout) -> None:
        """Only the wave's cohorts need heartbeats (the rest would change nothing)."""
        book = rollout.health.book
        wanted = set(book.windows) if book is not None else set()
        for name in wanted - self._beating:
            self._beating.add(name)
            self._heartbeat(name, self.now + self._rng.uniform(0, self.heartbeat_s))
        self._beating &= wanted

    def rollout(self, spec: RolloutSpec, *, max_s: float = 7200.0) -> VirtualOutcome:
        """Run ``spec`` from now until it completes, halts or ``max_s`` virtual seconds pass."""
        rollout = self._rollout = Rollout(spec)
        began = self.now
        candidates = {r.device: r.labels for r in self.fleet.select(model=spec.model)}
        self._carry_out(rollout.start(candidates, self.now))
        wave, wave_began = 0, self.now
        outcome = VirtualOutcome("running", 0, "", 0.0)
        while rollout.state not in _STOPPED and self.now - began < max_s:
            self._sync_heartbeats(rollout)
            self._run_until(self.now + self.tick_s)
            cpu = time.process_time()
            actions = rollout.tick(self.now)
            if rollout.health.judgements:
                outcome.compute_s.append(time.process_time() - cpu)
            self._carry_out(actions)
            if rollout.wave != wave or any(
                isinstance(a, Notify) and a.state in _STOPPED for a in actions
            ):
                outcome.wave_decisions_s.append(self.now - wave_began)
                wave, wave_began = rollout.wave, self.now
        self._beating.clear()
        self._rollout = None
        outcome.state, outcome.wave = rollout.state.value, rollout.wave
        outcome.reason = rollout.reason
        outcome.seconds = self.now - began
        outcome.looks = rollout.health.looks_done
        from model_cdn.rollout import status_view

        outcome.status = status_view(
            self._rollout_id, rollout, created_at=began, updated_at=self.now, now=self.now
        )
        return outcome
