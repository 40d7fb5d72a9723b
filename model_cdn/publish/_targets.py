"""Where a published version goes: the CDN's admin API, or a registry and store at hand.

The pipeline (``_pipeline``) makes a release's artifacts (the signed
manifest, the compressed blob, the deltas) and hands them to a target. A
target answers what the pipeline must know first (the latest version, for
the next number and as a delta's base) and takes the release in one call:

- ``AdminApiTarget(AdminClient(url, token=...))``: through the CDN's admin
  API, as the server's publishers do: each blob is uploaded under its
  digest, then the signed manifest is registered; the server checks the
  signature (when it trusts keys), that every blob is there, and the
  version. Reads go through the same client (the latest manifest, the base
  blob for a delta), so its token must also allow reads when the CDN
  guards them.
- ``LocalTarget(registry, store)``: the same release through the library
  call the server's route makes (``model_cdn.add_version``: the signature
  checked against ``trusted_keys`` when given, each blob against its digest,
  blobs stored first, then the manifest registered, so a registered manifest
  never names a missing blob).

Both raise ``CdnError`` subclasses: ``VersionConflictError`` when the
version is not above the latest, ``AdminApiError`` when the CDN refuses or
cannot be reached (its message is the server's).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared import BlobRef, ManifestError, PublicKey, digest
from shared.server.store import BlobStore

from .._errors import BlobNotFoundError, ModelNotFoundError, PublishError, VersionConflictError
from ..admin_client import AdminApiError, AdminClient
from ..registry._base import Registry

__all__ = ["AdminApiTarget", "LatestVersion", "LocalTarget", "PublishTarget", "Release"]


@dataclass(frozen=True)
class LatestVersion:
    """The latest published version of a model, as a target knows it."""

    version: int
    manifest: dict[str, Any]  # the signed document {"signed": …, "signatures": …}

    @classmethod
    def from_document(cls, doc: object) -> LatestVersion:
        signed = doc.get("signed") if isinstance(doc, dict) else None
        version = signed.get("version") if isinstance(signed, dict) else None
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise PublishError("the latest manifest of the model has no valid version")
        assert isinstance(doc, dict)
        return cls(version, doc)

    def blob(self) -> BlobRef | None:
        """The blob the manifest names, or None when it names none that can be read."""
        try:
            return BlobRef.from_dict(self.manifest["signed"].get("blob"))
        except (ManifestError, AttributeError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Release:
    """What the pipeline hands a target: a signed manifest and the blobs it names."""

    name: str
    version: int
    signed: dict[str, Any]  # the signed manifest document
    blobs: Mapping[str, bytes]  # digest -> bytes: the model's blob, then its deltas

    def __post_init__(self) -> None:
        for blob_digest, data in self.blobs.items():
            if digest(data) != blob_digest:
                raise PublishError(f"release {self.name}@{self.version}: {blob_digest} is wrong")


@dataclass(frozen=True)
class Published:
    """What the target registered."""

    name: str
    version: int
    blob_digest: str
    published_at: str


class PublishTarget(ABC):
    """Where releases go; see the module docstring."""

    @abstractmethod
    def latest(self, name: str) -> LatestVersion | None:
        """The latest version of ``name``; None when nothing of it is published."""

    @abstractmethod
    def blob(self, ref: BlobRef) -> bytes:
        """The bytes of ``ref`` (checked against its digest); ``BlobNotFoundError`` if gone."""

    @abstractmethod
    def add(self, release: Release) -> Published:
        """Store the release's blobs, then register its manifest."""

    def version_with_blob(self, name: str, blob_digest: str) -> int | None:
        """A published version of ``name`` whose blob is ``blob_digest``, if the target can
        tell (the pipeline compares with the latest version itself); None otherwise."""
        return None


class LocalTarget(PublishTarget):
    """A registry and a blob store in this process (what ``tandem models publish`` uses
    without ``--cdn``)."""

    def __init__(
        self, registry: Registry, store: BlobStore, *, trusted_keys: Sequence[PublicKey] = ()
    ) -> None:
        self.registry = registry
        self.store = store
        self.trusted_keys = tuple(trusted_keys)

    def latest(self, name: str) -> LatestVersion | None:
        try:
            record = self.registry.get_version(name)
        except ModelNotFoundError:
            return None
        return LatestVersion(record.version, record.manifest)

    def blob(self, ref: BlobRef) -> bytes:
        data = self.store.get(ref.digest)
        if digest(data) != ref.digest:
            raise BlobNotFoundError(f"blob {ref.digest} is damaged in the store")
        return data

    def version_with_blob(self, name: str, blob_digest: str) -> int | None:
        try:
            records = self.registry.list_versions(name)
        except ModelNotFoundError:
            return None
        return next((r.version for r in records if r.blob_digest == blob_digest), None)

    def add(self, release: Release) -> Published:
        from .._versions import add_version  # the one code path the admin API takes too

        record = add_version(
            self.registry,
            self.store,
            release.signed,
            trusted_keys=self.trusted_keys or None,
            blobs=release.blobs,
            name=release.name,
        )
        return Published(record.name, record.version, record.blob_digest, record.published_at)


class AdminApiTarget(PublishTarget):
    """The CDN's admin API, through ``client`` (the admin token or a key with
    ``models:publish``, and ``models:read`` where reads are guarded)."""

    def __init__(self, client: AdminClient) -> None:
        self.client = client

    def latest(self, name: str) -> LatestVersion | None:
        doc = self.client.latest_manifest(name)
        return None if doc is None else LatestVersion.from_document(doc)

    def blob(self, ref: BlobRef) -> bytes:
        try:
            return self.client.get_blob(ref.digest, ref.size)
        except AdminApiError as e:
            if e.status == 404:
                raise BlobNotFoundError(f"the CDN has no blob {ref.digest}") from e
            raise

    def version_with_blob(self, name: str, blob_digest: str) -> int | None:
        for entry in self.client.list_versions(name):
            version = entry.get("version")
            if entry.get("blob_digest") == blob_digest and isinstance(version, int):
                return version
        return None

    def add(self, release: Release) -> Published:
        for blob_digest, data in release.blobs.items():
            self.client.put_blob(blob_digest, data)
        try:
            answer = self.client.add_version(release.name, release.signed)
        except AdminApiError as e:
            if e.status == 409:
                raise VersionConflictError(str(e)) from e
            raise
        return Published(
            str(answer.get("name", release.name)),
            int(answer.get("version", release.version)),
            str(answer.get("blob_digest", "")),
            str(answer.get("published_at", "")),
        )
