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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceRecord", "Registry", "RolloutRecord", "VersionRecord"]


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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
