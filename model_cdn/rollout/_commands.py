"""Rollout commands that a follower hands to the leader through the registry.

A follower cannot act on a rollout (only the leader writes rollout state and
publishes assignments), and it does not need to know where the leader is:
``CommandQueue.submit`` writes the command (``pending``) into the registry's
``rollout_commands`` table and waits for the leader's answer there. The
leader takes pending commands at every tick and applies each one exactly as
it applies its own API's commands, writing the answer in the same
transaction as the rollout's new state (``Registry.commit_rollout``), so a
command is applied once or not at all, even across a failover in the middle.

A follower that gets no answer within ``timeout_s`` (no leader elected, or
one failing over for longer than that) withdraws the command (it will then
never be applied) and raises ``NoRolloutLeaderError`` (503: try again); if
the leader answered just before the withdrawal, that answer is returned.

Answers travel as JSON: ``{"view": status}`` or ``{"error": class name,
"message": text}``; the follower raises the same error class the leader
raised (one of the rollout API's errors), so both answer the same status.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .._errors import (
    CdnError,
    LeaseLostError,
    ModelNotFoundError,
    NoRolloutLeaderError,
    RolloutConflictError,
    RolloutNotFoundError,
    RolloutRequestError,
    RolloutStateError,
)
from ..registry import Registry
from ..registry._leases import Fence, RolloutCommand
from ._machine import Action, Rollout

__all__ = [
    "CommandQueue",
    "answer_of",
    "apply_queued",
    "apply_verb",
    "error_answer",
    "view_answer",
]

# The errors a rollout command may answer with, by name (never arbitrary classes).
_ANSWERABLE: dict[str, type[CdnError]] = {
    cls.__name__: cls
    for cls in (
        RolloutRequestError,
        RolloutConflictError,
        RolloutStateError,
        RolloutNotFoundError,
        ModelNotFoundError,
        LeaseLostError,
    )
}


def apply_verb(r: Rollout, verb: str, now: float, args: Mapping[str, Any]) -> list[Action]:
    """Carry out one command on the machine and record it in its history: ``args`` has
    ``by`` (who asked) and, for ``skip-gate``, ``reason`` (required)."""
    by, reason = str(args.get("by", "")), str(args.get("reason", ""))
    if verb == "pause":
        actions = r.pause()
    elif verb == "resume":
        actions = r.resume(now)
    elif verb == "abort":
        actions = r.abort()
    elif verb == "rollback":
        actions = r.rollback(now)
    elif verb == "skip-gate":
        try:
            return r.skip_gate(now, by=by, reason=reason)  # records itself, with the gate
        except ValueError as e:
            raise RolloutRequestError(str(e)) from e
    else:
        raise ValueError(f"unknown rollout command {verb!r}")
    r.note(verb, now, by=by, reason=reason)
    return actions


def view_answer(command: RolloutCommand, view: Mapping[str, Any]) -> RolloutCommand:
    return replace(command, state="done", result={"view": dict(view)}, done_at=time.time())


def error_answer(command: RolloutCommand, error: Exception) -> RolloutCommand:
    result = {"error": type(error).__name__, "message": str(error)}
    return replace(command, state="done", result=result, done_at=time.time())


def answer_of(command: RolloutCommand) -> dict[str, Any]:
    """The leader's answer: the rollout's status, or the error it raised, raised here."""
    result = command.result or {}
    view = result.get("view")
    if isinstance(view, dict):
        return view
    message = str(result.get("message", "the rollout leader failed the command"))
    raise _ANSWERABLE.get(str(result.get("error")), NoRolloutLeaderError)(message)


def apply_queued(
    registry: Registry,
    fence: Fence | None,
    *,
    create: Callable[[Mapping[str, Any], RolloutCommand], object],
    command: Callable[[str, str, RolloutCommand], object],
) -> None:
    """The leader's side: apply every pending command, oldest first.

    ``create`` and ``command`` are the controller's own, which commit the
    answer with the state they make; a refusal (nothing changed) is answered
    here. ``LeaseLostError`` propagates: the caller steps down.
    """
    for queued in registry.pending_rollout_commands():
        try:
            if queued.verb == "create":
                create(queued.body or {}, queued)
            else:
                command(queued.rollout_id or "", queued.verb, queued)
        except LeaseLostError:
            raise
        except (CdnError, ValueError) as e:  # the answer is this error
            registry.commit_rollout(None, fence=fence, command=error_answer(queued, e))


class CommandQueue:
    """The follower's side: ``submit`` a command and wait for the leader's answer."""

    def __init__(
        self, registry: Registry, *, timeout_s: float = 15.0, poll_s: float = 0.05
    ) -> None:
        self.registry, self.timeout_s, self.poll_s = registry, timeout_s, poll_s

    def submit(
        self, verb: str, *, rollout_id: str | None = None, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        if body is not None and not isinstance(body, Mapping):
            raise RolloutRequestError("the body is a JSON object")
        command = RolloutCommand(
            id=f"rc-{secrets.token_hex(8)}",
            verb=verb,
            rollout_id=rollout_id,
            body=None if body is None else dict(body),
            created_at=time.time(),
        )
        self.registry.add_rollout_command(command)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            seen = self.registry.get_rollout_command(command.id)
            if seen is not None and seen.state == "done":
                self.registry.withdraw_rollout_command(command.id)  # answered: clean up
                return answer_of(seen)
            time.sleep(self.poll_s)
        last = self.registry.withdraw_rollout_command(command.id)
        if last is not None and last.state == "done":
            return answer_of(last)
        raise NoRolloutLeaderError(
            f"no rollout leader applied the {verb} command within {self.timeout_s:g} s "
            "(none elected, or one is taking over): nothing changed, try again"
        )
