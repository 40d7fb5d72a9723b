"""The rollout leader's lease and the rollout commands queued for it: records and rows.

No I/O here; ``_sql`` holds the statements, for SQLite and PostgreSQL alike.

Tables::

    leases            (name PRIMARY KEY, holder, token, expires_at)
    rollout_commands  (id PRIMARY KEY, verb, rollout_id, body, state, result,
                       created_at, done_at)               indexed on (state, created_at)

A lease is held by ``holder`` until ``expires_at`` (epoch seconds by the
registry's clock: PostgreSQL's own, so replicas' clocks do not matter;
SQLite is one host's file, and its clock is that host's). ``token`` grows by
one every time the lease changes hands and never otherwise: it is the
fencing token. A writer that presents ``Fence(name, holder, token)`` is
refused (``LeaseLostError``) once anyone else has taken the lease, even if
the old holder was paused and never noticed, because the check and the write
are one transaction and taking the lease waits for (or is serialised after)
it.

A rollout command is what a follower writes for the leader to apply
(``pending``); the leader writes its answer (``done``) in the same
transaction as the rollout's new state, so a command is applied once or not
at all, whichever replica leads when it is taken.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidNameError

__all__ = [
    "COMMAND_COLUMNS",
    "COMMAND_VERBS",
    "Fence",
    "Lease",
    "RolloutCommand",
    "check_lease",
    "command_from_row",
    "command_row",
]

COMMAND_COLUMNS = "id, verb, rollout_id, body, state, result, created_at, done_at"
COMMAND_VERBS = frozenset({"create", "pause", "resume", "abort", "rollback", "skip-gate"})
_COMMAND_ID = re.compile(r"rc-[0-9a-f]{16}")
_LEASE_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_HOLDER = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")


@dataclass(frozen=True)
class Fence:
    """Proof of holding lease ``lease`` as ``holder`` with fencing token ``token``."""

    lease: str
    holder: str
    token: int


@dataclass(frozen=True)
class Lease:
    """A lease as the registry holds it."""

    name: str
    holder: str
    token: int  # grows by one each time the lease changes hands
    expires_at: float  # epoch seconds, by the registry's clock

    @property
    def fence(self) -> Fence:
        return Fence(self.name, self.holder, self.token)


@dataclass(frozen=True)
class RolloutCommand:
    """A rollout command queued for the leader, and (``state == "done"``) its answer.

    ``result`` is ``{"view": …}`` (the rollout's status) or ``{"error": class name,
    "message": …}``.
    """

    id: str  # "rc-" + 16 lowercase hex digits
    verb: str  # one of COMMAND_VERBS
    rollout_id: str | None  # None for "create"
    body: dict[str, Any] | None  # the create request's JSON body
    created_at: float  # epoch seconds
    state: str = "pending"  # "pending" | "done"
    result: dict[str, Any] | None = None
    done_at: float | None = None


def check_lease(name: object, holder: object) -> None:
    if not isinstance(name, str) or not _LEASE_NAME.fullmatch(name):
        raise InvalidNameError(f"a lease name is short lower-case text, got {name!r:.40}")
    if not isinstance(holder, str) or not _HOLDER.fullmatch(holder):
        raise InvalidNameError(f"a lease holder is a short id, got {holder!r:.40}")


def _dump(value: dict[str, Any]) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidNameError(f"a rollout command holds plain JSON only: {e}") from e


def _load(text: str) -> dict[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def command_row(command: RolloutCommand) -> tuple[Any, ...]:
    if not _COMMAND_ID.fullmatch(command.id):
        raise InvalidNameError(f"a rollout command id is rc- and 16 hex digits: {command.id!r:.40}")
    if command.verb not in COMMAND_VERBS:
        raise InvalidNameError(f"unknown rollout command {command.verb!r:.40}")
    return (
        command.id,
        command.verb,
        command.rollout_id,
        None if command.body is None else _dump(command.body),
        command.state,
        None if command.result is None else _dump(command.result),
        float(command.created_at),
        command.done_at,
    )


def command_from_row(row: tuple[Any, ...]) -> RolloutCommand:
    cid, verb, rollout_id, body, state, result, created_at, done_at = row
    return RolloutCommand(
        id=cid,
        verb=verb,
        rollout_id=rollout_id,
        body=None if body is None else _load(body),
        created_at=float(created_at),
        state=state,
        result=None if result is None else _load(result),
        done_at=None if done_at is None else float(done_at),
    )
