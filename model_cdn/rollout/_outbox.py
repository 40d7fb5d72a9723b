"""How a rollout's actions leave the controller: signed, committed with its state, published.

``RolloutEntry`` is one rollout as the controller holds it, with its
*outbox*: assignments signed (``RolloutOutbox.sign``) but not stored yet.
``commit`` writes the rollout's snapshot, the outbox and (for a command a
follower queued) the command's answer in one registry transaction, fenced by
the leader's lease; only then does it publish the assignments, retained,
without waiting for the broker. So a sent assignment is always one the
stored state knows of: a leader that resumes re-sends stored documents
(``republish``) and never signs a second one for the same wave, and a
paused leader whose lease moved on stores nothing and sends nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._assignment_sender import AssignmentSender
from .._errors import BrokerError
from ..registry import Registry, RolloutRecord
from ..registry._base import AssignmentWrite
from ..registry._leases import Fence, RolloutCommand
from ._commands import view_answer
from ._leader import LeaderLease
from ._machine import DeviceStatus, Rollout

__all__ = ["RolloutEntry", "RolloutOutbox"]

log = logging.getLogger("tandem.cdn.rollout")


@dataclass
class RolloutEntry:
    id: str
    rollout: Rollout
    created_at: float
    updated_at: float
    dirty: bool = False
    outbox: list[AssignmentWrite] = field(default_factory=list)  # signed, not yet stored
    plan: dict[str, Any] | None = None  # what the plan can decide: in create's answer only

    @classmethod
    def of(cls, record: RolloutRecord) -> RolloutEntry:
        rollout = Rollout.from_dict(record.snapshot["rollout"])
        return cls(record.id, rollout, record.created_at, record.updated_at)


class RolloutOutbox:
    """Signs, commits and publishes for one controller (see the module docstring)."""

    def __init__(
        self,
        registry: Registry,
        sender: AssignmentSender,
        lease: LeaderLease | None,
        *,
        clock: Callable[[], float],
        assignment_ttl_days: float,
    ) -> None:
        self.registry, self.sender, self.lease = registry, sender, lease
        self.clock, self.assignment_ttl_days = clock, assignment_ttl_days

    def sign(self, entry: RolloutEntry, device: str, version: int, rollback: bool) -> None:
        model = entry.rollout.spec.model
        doc = self.sender.sign(
            device=device,
            model=model,
            version=version,
            rollback=rollback,
            rollout=entry.id,
            ttl_days=self.assignment_ttl_days,
        )
        entry.outbox.append(AssignmentWrite(device, model, doc))

    def commit(
        self,
        entry: RolloutEntry,
        view: Callable[[RolloutEntry], dict[str, Any]],
        fence: Fence | None,
        command: RolloutCommand | None = None,
    ) -> bool:
        """Store state, outbox and answer at once, then publish; False if ``command`` was
        withdrawn (nothing written). ``LeaseLostError`` when the lease changed hands."""
        entry.updated_at = self.clock()
        r = entry.rollout
        record = RolloutRecord(
            id=entry.id,
            model=r.spec.model,
            version=r.spec.version,
            state=r.state.value,
            snapshot={"rollout": r.to_dict()},
            created_at=entry.created_at,
            updated_at=entry.updated_at,
        )
        answer = None if command is None else view_answer(command, view(entry))
        outbox = list(entry.outbox)
        if not self.registry.commit_rollout(record, outbox, fence=fence, command=answer):
            return False
        entry.outbox.clear()
        entry.dirty = False
        self.publish(outbox, fence)
        return True

    def publish(self, writes: Iterable[AssignmentWrite], fence: Fence | None) -> None:
        """Publish stored assignments, unless the lease lapsed (the next leader sends them)."""
        for w in writes:
            if self.lease is not None and self.lease.current() != fence:
                return
            try:
                self.sender.publish(w.device, w.document, wait=False)
            except BrokerError as e:  # stored: devices poll it, the next leader re-sends it
                log.warning("assignment of %s to %s not published: %s", w.model, w.device, e)

    def republish(self, entry: RolloutEntry, fence: Fence | None) -> None:
        """Send again the stored assignments of devices that have not acted on them."""
        model = entry.rollout.spec.model
        waiting = (DeviceStatus.ASSIGNED, DeviceStatus.ROLLBACK_ASSIGNED)
        for device, d in entry.rollout.devices.items():
            if d.status in waiting:
                doc = self.registry.get_assignment(device, model)
                if doc is not None:
                    self.publish([AssignmentWrite(device, model, doc)], fence)
