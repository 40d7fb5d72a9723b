"""The registry: model versions, signed manifests, device assignments, the fleet, rollouts.

One small interface over SQLite (default) and PostgreSQL. The registry
stores signed documents as given (the bytes a device verifies) plus the few
fields it indexes. Invariants every backend keeps: a model's versions only
grow (``add_version`` refuses a version not above the latest, atomically
under concurrent publishers); a stored manifest never changes; an
assignment per (device, model) is replaced, never duplicated; a device's
``first_seen`` never moves later (an upsert keeps the earlier one); a batch
of devices is written in one transaction, all of it or none.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import RegistryError
from ._leases import Fence, Lease, RolloutCommand

__all__ = [
    "AssignmentWrite",
    "DeviceRecord",
    "Registry",
    "RolloutRecord",
    "VersionRecord",
]


@dataclass(frozen=True)
class VersionRecord:
    name: str
    version: int
    manifest: dict[str, Any]  # the signed document {"signed": …, "signatures": …}
    blob_digest: str
    published_at: str


@dataclass(frozen=True)
class DeviceRecord:
    """What the fleet registry knows about one device (from its telemetry)."""

    device: str
    labels: dict[str, str]  # e.g. {"site": "factory-a", "hw": "npu"}
    capabilities: dict[str, str]  # e.g. {"runtime": "onnxruntime"}
    models: dict[str, int]  # model -> the version it runs now
    first_seen: float  # epoch seconds
    last_seen: float  # epoch seconds
    telemetry: dict[str, Any] | None  # the last DeviceReport as a dict


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout as the controller persists it: a few indexed fields plus its snapshot."""

    id: str  # "ro-" + 12 lowercase hex digits
    model: str
    version: int
    state: str  # a RolloutState value
    snapshot: dict[str, Any]  # everything the controller needs to resume it (JSON)
    created_at: float  # epoch seconds
    updated_at: float  # epoch seconds


@dataclass(frozen=True)
class AssignmentWrite:
    """One signed assignment to store with a rollout's state (``commit_rollout``)."""

    device: str
    model: str
    document: dict[str, Any]


class Registry(ABC):
    @abstractmethod
    def add_version(self, signed_manifest: dict[str, Any]) -> VersionRecord:
        """Record a new version (raises ``VersionConflictError`` when not the newest)."""

    @abstractmethod
    def get_version(self, name: str, version: int | None = None) -> VersionRecord:
        """One version, the latest when ``version`` is None (``ModelNotFoundError``)."""

    @abstractmethod
    def list_models(self) -> list[str]: ...

    @abstractmethod
    def list_versions(self, name: str) -> list[VersionRecord]: ...

    @abstractmethod
    def delete_version(self, name: str, version: int) -> None: ...

    @abstractmethod
    def put_assignment(
        self, device: str, model: str, signed_assignment: dict[str, Any]
    ) -> None: ...

    @abstractmethod
    def get_assignment(self, device: str, model: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def upsert_devices(self, records: Iterable[DeviceRecord]) -> None:
        """Insert or replace devices by id, all in one transaction (all or none).

        An existing device keeps the earlier of its stored and the given ``first_seen``.
        """

    @abstractmethod
    def get_device(self, device: str) -> DeviceRecord:
        """One device (``DeviceNotFoundError``)."""

    @abstractmethod
    def list_devices(self) -> list[DeviceRecord]:
        """Every device, sorted by id."""

    @abstractmethod
    def put_rollout(self, record: RolloutRecord) -> None:
        """Insert or replace a rollout by id."""

    @abstractmethod
    def get_rollout(self, rollout_id: str) -> RolloutRecord:
        """One rollout (``RolloutNotFoundError``)."""

    @abstractmethod
    def list_rollouts(self) -> list[RolloutRecord]:
        """Every rollout, newest first (``created_at`` descending)."""

    # -- one rollout leader among CDN replicas (``_leases``) ----------------------------
    # The SQL backends implement these; a registry without them runs one server only.

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        """Take or renew lease ``name`` for ``holder`` for ``ttl_s`` seconds.

        Taken when free, expired or already ``holder``'s (the token grows only
        when it changes hands); the lease as held now, or None when another
        holder has it.
        """
        raise RegistryError(f"{type(self).__name__} cannot elect a rollout leader")

    def release_lease(self, fence: Fence) -> None:
        """Give the lease up at once (so another server need not wait for it to expire)."""
        raise RegistryError(f"{type(self).__name__} cannot elect a rollout leader")

    def commit_rollout(
        self,
        record: RolloutRecord | None,
        assignments: Sequence[AssignmentWrite] = (),
        *,
        fence: Fence | None = None,
        command: RolloutCommand | None = None,
    ) -> bool:
        """Write a rollout's state, its new assignments and a command's answer at once.

        All in one transaction, after checking ``fence`` (``LeaseLostError``
        when the lease changed hands). ``command`` (state ``done``, with its
        result) answers a queued command: False, and nothing written, when
        that command was withdrawn meanwhile; True otherwise.
        """
        if fence is not None or command is not None:
            raise RegistryError(f"{type(self).__name__} cannot elect a rollout leader")
        if record is not None:
            self.put_rollout(record)
        for a in assignments:
            self.put_assignment(a.device, a.model, a.document)
        return True

    def add_rollout_command(self, command: RolloutCommand) -> None:
        """Queue a command for the leader."""
        raise RegistryError(f"{type(self).__name__} cannot queue rollout commands")

    def pending_rollout_commands(self, limit: int = 100) -> list[RolloutCommand]:
        """The oldest commands not answered yet."""
        raise RegistryError(f"{type(self).__name__} cannot queue rollout commands")

    def get_rollout_command(self, command_id: str) -> RolloutCommand | None:
        raise RegistryError(f"{type(self).__name__} cannot queue rollout commands")

    def withdraw_rollout_command(self, command_id: str) -> RolloutCommand | None:
        """Delete a command and return it as it was (pending: it will never be applied)."""
        raise RegistryError(f"{type(self).__name__} cannot queue rollout commands")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
