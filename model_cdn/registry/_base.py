"""The registry: which model versions exist, their signed manifests, device assignments.

One small interface over SQLite (default) and PostgreSQL. The registry
stores signed documents as given (the bytes a device verifies) plus the few
fields it indexes. Invariants every backend keeps: a model's versions only
grow (``add_version`` refuses a version not above the latest, atomically
under concurrent publishers); a stored manifest never changes; an
assignment per (device, model) is replaced, never duplicated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

__all__ = ["Registry", "VersionRecord"]


@dataclass(frozen=True)
class VersionRecord:
    name: str
    version: int
    manifest: dict[str, Any]  # the signed document {"signed": …, "signatures": …}
    blob_digest: str
    published_at: str


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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
