"""Getting a published model out as a plain file: ``tandem models pull NAME[@VERSION]``.

For a device that loads a file (``EdgeAgent("mnist-edge.onnx")``) rather
than running ``ModelUpdater``, for a hub's repository, or to look at what
was published. ``pull_model`` reads the signed manifest (the latest, or the
version asked for) and its blob from a ``ModelSource``: the CDN over HTTP
(``CdnSource``: the URLs of ``shared.CdnPaths``, through ``AdminClient``)
or a registry and a blob store at hand (``RegistrySource``). It then checks
what it read as a device does, in ``check_pulled`` (pure):

- a threshold of trusted keys signed the manifest, and it has not expired;
- it is the model asked for, and the version asked for when one was;
- the blob has the size and the digest the manifest names; decompressing
  it stops at the declared raw size, and the model has the raw digest.

- for a package (``format: "onnx-genai"``), the archive holds exactly the
  files the manifest lists, each of its size and SHA-256, and nothing else
  (``shared.unpack_package``: no links, no path out of the folder).

Nothing is written before every check passed; ``write_model_file`` then
writes the file whole or not at all (``shared.atomic_write_bytes``: a
temporary file beside it, fsynced, renamed over, the directory fsynced), and
``write_package_dir`` a package's folder (built beside it under a temporary
name, each file fsynced, then renamed into place).
Failures raise ``PullError``, ``ModelNotFoundError``,
``shared.ManifestError`` (signature, expiry) or ``AdminApiError``.
"""

from __future__ import annotations

import os
import secrets
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from shared import (
    ManifestError,
    ModelManifest,
    PackageError,
    PublicKey,
    TrustedRoot,
    atomic_write_bytes,
    decompress_blob,
    digest,
    fsync_directory,
    unpack_package,
    verify_manifest,
)
from shared.server.store import BlobStore

from ._errors import BlobNotFoundError, ModelNotFoundError, PullError
from .admin_client import AdminApiError, AdminClient
from .registry._base import Registry

__all__ = [
    "CdnSource",
    "ModelSource",
    "PulledVersion",
    "RegistrySource",
    "check_pulled",
    "pull_model",
    "write_model_file",
    "write_package_dir",
]

MODEL_SUFFIXES = {"onnx": ".onnx", "tflite": ".tflite"}  # what runtimes pick a loader by


@dataclass(frozen=True)
class PulledVersion:
    """A verified version: its manifest, the signed document, and the model file's bytes."""

    manifest: ModelManifest
    signed: Mapping[str, Any]
    model: bytes  # the model file, or a package's archive
    files: Mapping[str, bytes] | None = None  # a package's verified files, by name

    @property
    def ref(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}"


class ModelSource(ABC):
    """Where signed manifests and blobs are read from (nothing read here is trusted yet)."""

    #: where it reads from, for messages: a URL or a registry's
    where: str = ""

    @abstractmethod
    def manifest(self, name: str, version: int | None) -> Mapping[str, Any]:
        """The signed manifest document; ``ModelNotFoundError`` when there is none."""

    @abstractmethod
    def blob(self, blob_digest: str, size: int) -> bytes:
        """The blob's bytes as stored; ``BlobNotFoundError`` when it is gone."""


class CdnSource(ModelSource):
    """A CDN's HTTP API (``client``'s token, if any, needs ``models:read`` where reads are
    guarded)."""

    def __init__(self, client: AdminClient) -> None:
        self.client = client
        self.where = client.url

    def manifest(self, name: str, version: int | None) -> Mapping[str, Any]:
        doc = self.client.manifest(name, version)
        if doc is None:
            raise ModelNotFoundError(f"the CDN at {self.where} has no {_ref(name, version)}")
        return doc

    def blob(self, blob_digest: str, size: int) -> bytes:
        try:
            return self.client.get_blob(blob_digest, size)
        except AdminApiError as e:
            if e.status == 404:
                raise BlobNotFoundError(f"the CDN at {self.where} has no blob {blob_digest}") from e
            raise


class RegistrySource(ModelSource):
    """A registry and a blob store in this process (what ``tandem models publish`` wrote)."""

    def __init__(self, registry: Registry, store: BlobStore, where: str = "the registry") -> None:
        self.registry, self.store, self.where = registry, store, where

    def manifest(self, name: str, version: int | None) -> Mapping[str, Any]:
        return self.registry.get_version(name, version).manifest

    def blob(self, blob_digest: str, size: int) -> bytes:
        return self.store.get(blob_digest)


def pull_model(
    source: ModelSource,
    name: str,
    version: int | None,
    trusted: Sequence[PublicKey] | TrustedRoot,
    *,
    now: datetime | None = None,
) -> PulledVersion:
    """``name@version`` (the latest when None) from ``source``, checked (see the module)."""
    if not isinstance(trusted, TrustedRoot) and not trusted:
        raise PullError("pulling a model needs the publisher's public key to check it")
    document = source.manifest(name, version)
    manifest = _verified(document, trusted, now)
    blob = source.blob(manifest.blob.digest, manifest.blob.size)
    return check_pulled(manifest, document, blob, name, version)


def check_pulled(
    manifest: ModelManifest,
    document: Mapping[str, Any],
    blob: bytes,
    name: str,
    version: int | None,
) -> PulledVersion:
    """The model inside ``blob``, once the verified ``manifest`` is the one asked for and
    ``blob`` is the one it names."""
    ref = f"{manifest.name}@{manifest.version}"
    if manifest.name != name:
        raise PullError(f"asked for {name}, got a manifest signed for {manifest.name}")
    if version is not None and manifest.version != version:
        raise PullError(f"asked for {name}@{version}, got a manifest signed for {ref}")
    blob_ref = manifest.blob
    if len(blob) != blob_ref.size or digest(blob) != blob_ref.digest:
        raise PullError(f"the blob of {ref} is not the one its manifest names (size or digest)")
    if blob_ref.compression == "zstd":
        try:
            model = decompress_blob(blob, blob_ref.raw_size)
        except ManifestError as e:
            raise PullError(f"the blob of {ref} does not decompress: {e}") from e
    else:
        model = blob
    if len(model) != blob_ref.raw_size or (
        blob_ref.raw_digest is not None and digest(model) != blob_ref.raw_digest
    ):
        raise PullError(f"the model of {ref} is not the one its manifest names (raw digest)")
    files = None
    if manifest.package is not None:
        try:
            files = unpack_package(model, manifest.package)
        except PackageError as e:
            raise PullError(f"the package {ref} is refused: {e}") from e
    return PulledVersion(manifest, document, model, files)


def write_model_file(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all; returns the path."""
    path = Path(path)
    # 0644: a model is public, and the service reading it may run as another user.
    atomic_write_bytes(path, data, mode=0o644)
    return path


def write_package_dir(path: str | os.PathLike[str], files: Mapping[str, bytes]) -> Path:
    """Write a verified package's files as the folder ``path``, whole or not at all (a
    folder already there is replaced, after the new one is complete); returns the path."""
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{path.name}.tmp-{secrets.token_hex(4)}"
    staging.mkdir()
    old = None
    try:
        for name, data in files.items():
            atomic_write_bytes(staging / name, data, mode=0o644)
        if path.exists():
            old = parent / f".{path.name}.old-{secrets.token_hex(4)}"
            path.rename(old)
        staging.rename(path)
        fsync_directory(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and not path.exists():
            old.rename(path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def _verified(
    document: Mapping[str, Any], trusted: Sequence[PublicKey] | TrustedRoot, now: datetime | None
) -> ModelManifest:
    if isinstance(trusted, TrustedRoot):
        return trusted.verify_manifest(document, now=now)
    return verify_manifest(document, list(trusted), now=now)


def _ref(name: str, version: int | None) -> str:
    return name if version is None else f"{name}@{version}"
