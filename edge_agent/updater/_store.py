"""The device's model store: verified models on disk, and which one is current.

Layout under ``root``::

    <model>/current.json             {"version": N, "previous": M, "highest_accepted": H,
                                      "last_issued_at": "…"}
    <model>/<version>/model.onnx     the raw model (model.tflite for TFLite)
    <model>/<version>/package/       a package's files (``format: "onnx-genai"``): the
                                     folder ONNX Runtime GenAI loads
    <model>/<version>/manifest.json  the signed manifest, byte for byte as the CDN sent it
    <model>/<version>/install.json   {"raw_digest": "sha256:…", "raw_size": …}
    <model>/.partial/<hex>.part      a blob download in progress (and its .etag)

Invariants:

- Nothing is written outside ``root``: model names must match the shared
  name pattern and digests ``sha256:<64 hex>`` before any path is built, and
  every path is checked to resolve inside ``root``.
- A version directory appears whole or not at all: it is written under a
  ``.staging-*`` name, each file fsynced, then renamed into place and the
  parent directory fsynced.
- ``current.json`` is replaced atomically (``shared.atomic_write_bytes``:
  temp file, fsync, rename, fsync directory), so after a crash it names
  either the old or the new version; it moves only after the new version's
  directory is complete. The previous version is kept for rollback; other
  versions, finished downloads and leftovers of interrupted installs
  (``.staging-*``, ``.trash-*``, ``.tmp-*``) are deleted after a commit. A complete
  version directory that no commit named yet (a crash after ``install``)
  stays until then, re-verified before it is reused.
- ``load_current`` serves nothing it has not re-verified: the stored
  manifest's signature against the pinned keys, its name and version, and
  the model file's size and SHA-256 against what was verified at install
  (the manifest's signed ``raw_digest`` when the publisher provides one).
  A package is checked file by file (each listed file's size and SHA-256,
  nothing else in its folder), then as the canonical archive rebuilt from
  those files against the same raw digest.
  A model that fails, or fails to load and pass its smoke test, is skipped
  for the previous version; neither passing gives ``None``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import (
    ATOMIC_TEMP_PREFIX,
    DIGEST_PATTERN,
    MAX_DOCUMENT_BYTES,
    ConfigError,
    ModelManifest,
    PackageError,
    atomic_write_bytes,
    digest,
    fsync_directory,
    pack_files,
    unpack_package,
    validate_name,
)

from .._errors import IntegrityError, StoreError, UpdateError
from ..language import LanguageRuntime
from ..runtimes import ModelRuntime
from ._smoke import load_checked_language, load_checked_runtime
from ._trust import Trust, TrustRecord, verify_installed_manifest

__all__ = ["CurrentPointer", "DeviceModelStore", "InstalledModel", "LoadedModel"]

log = logging.getLogger("tandem.edge.updater")

POINTER = "current.json"
MANIFEST = "manifest.json"
INSTALL_RECORD = "install.json"
_SMALL_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class CurrentPointer:
    """What ``current.json`` says: the version to serve, the one kept for rollback."""

    version: int
    previous: int | None = None
    trust: TrustRecord = field(default_factory=TrustRecord)

    def to_json(self) -> bytes:
        d: dict[str, Any] = {"version": self.version, "previous": self.previous}
        d.update(self.trust.to_dict())
        return json.dumps(d, indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> CurrentPointer:
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("current.json must hold an object")
        version, previous = d.get("version"), d.get("previous")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"current.json: bad version {version!r:.40}")
        if previous is not None and (
            not isinstance(previous, int) or isinstance(previous, bool) or previous < 1
        ):
            raise ValueError(f"current.json: bad previous {previous!r:.40}")
        return cls(version, previous, TrustRecord.from_dict(d))


@dataclass(frozen=True)
class InstalledModel:
    """A stored version whose files were just re-verified."""

    manifest: ModelManifest
    raw: bytes  # the model file, or a package's archive rebuilt from its files
    path: Path  # the model file, or a package's folder


@dataclass(frozen=True)
class LoadedModel:
    """A verified stored version, loaded and smoke-tested."""

    runtime: ModelRuntime | LanguageRuntime  # LanguageRuntime: a package
    version: int
    manifest: ModelManifest


class DeviceModelStore:
    """Verified models on the device's disk; see the module docstring for the layout."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    # -- paths -------------------------------------------------------------------------------

    def model_dir(self, model: str) -> Path:
        try:
            validate_name(model, "model name")
        except ConfigError as e:
            raise StoreError(f"refusing model name {model!r:.80}: {e}") from e
        return self._inside(self.root / model)

    def version_dir(self, model: str, version: int) -> Path:
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise StoreError(f"refusing version {version!r:.40}: not an integer >= 1")
        return self._inside(self.model_dir(model) / str(version))

    def partial_path(self, model: str, blob_digest: str) -> Path:
        match = DIGEST_PATTERN.fullmatch(blob_digest) if isinstance(blob_digest, str) else None
        if match is None:
            raise StoreError(f"refusing blob digest {blob_digest!r:.80}: not 'sha256:<64 hex>'")
        return self._inside(self.model_dir(model) / ".partial" / f"{match.group(1)}.part")

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root) or resolved == self.root:
            raise StoreError(f"refusing {path}: it is outside the model store {self.root}")
        return resolved

    # -- reading -----------------------------------------------------------------------------

    def pointer(self, model: str) -> CurrentPointer | None:
        """``current.json`` of ``model``, or ``None`` if nothing was ever committed."""
        path = self.model_dir(model) / POINTER
        try:
            return CurrentPointer.from_json(_read_small(path, _SMALL_FILE_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.error(
                "model store: %s is unreadable (%s); treating %s as not installed", path, e, model
            )
            return None

    def has_version(self, model: str, version: int) -> bool:
        return self.version_dir(model, version).is_dir()

    def installed(self, model: str, version: int, trusted_keys: Trust) -> InstalledModel:
        """The stored ``model@version``, re-verified; raises an ``UpdateError`` if broken."""
        vdir = self.version_dir(model, version)
        try:
            signed = _read_small(vdir / MANIFEST, MAX_DOCUMENT_BYTES)
        except OSError as e:
            raise StoreError(f"{model}@{version} is not in the store: {e}") from e
        manifest = verify_installed_manifest(signed, trusted_keys, model=model, version=version)
        expected = _expected_raw_digest(manifest, vdir)
        path = vdir / manifest.model_file
        if manifest.package is not None:
            raw = _stored_package(path, manifest, f"{model}@{version}")
            if digest(raw) != expected:
                raise IntegrityError(f"stored {model}@{version} does not match its verified digest")
            return InstalledModel(manifest, raw, path)
        try:
            if path.stat().st_size != manifest.blob.raw_size:
                raise IntegrityError(
                    f"stored {model}@{version} is {path.stat().st_size} bytes, "
                    f"the manifest says {manifest.blob.raw_size}"
                )
            raw = path.read_bytes()
        except OSError as e:
            raise StoreError(f"stored {model}@{version} is unreadable: {e}") from e
        if digest(raw) != expected:
            raise IntegrityError(f"stored {model}@{version} does not match its verified digest")
        return InstalledModel(manifest, raw, path)

    def load_current(self, model: str, trusted_keys: Trust) -> LoadedModel | None:
        """The current version re-verified and smoke-tested, else the previous, else None."""
        pointer = self.pointer(model)
        if pointer is None:
            return None
        for version in (pointer.version, pointer.previous):
            if version is None:
                continue
            try:
                stored = self.installed(model, version, trusted_keys)
                runtime: ModelRuntime | LanguageRuntime
                if stored.manifest.package is not None:
                    runtime = load_checked_language(stored.manifest, stored.path)
                else:
                    runtime = load_checked_runtime(stored.manifest, stored.raw)
            except UpdateError as e:
                log.error("model store: not serving %s@%s: %s", model, version, e)
                continue
            return LoadedModel(runtime, version, stored.manifest)
        return None

    # -- writing -----------------------------------------------------------------------------

    def install(self, model: str, manifest: ModelManifest, signed: bytes, raw: bytes) -> Path:
        """Write a verified version whole into its directory; returns the model file's path
        (a package's folder, its files unpacked from ``raw`` and checked against the listing)."""
        if manifest.name != model:
            raise StoreError(f"manifest of {manifest.name!r} cannot be stored as {model!r}")
        vdir = self.version_dir(model, manifest.version)
        mdir = vdir.parent
        raw_digest = digest(raw)
        try:
            if vdir.exists():
                if _intact(vdir, manifest, raw_digest):
                    return vdir / manifest.model_file  # already there, same bytes
                pointer = self.pointer(model)
                referenced = pointer is not None and manifest.version in (
                    pointer.version,
                    pointer.previous,
                )
                if referenced and _intact(vdir, manifest, None):
                    raise StoreError(
                        f"{model}@{manifest.version} is installed with other content; "
                        "a published version never changes, so this one is refused"
                    )
                self._discard(vdir)  # a broken copy or the leftover of an interrupted install
            staging = mdir / f".staging-{manifest.version}-{secrets.token_hex(4)}"
            staging.mkdir(parents=True)
            try:
                _write_model(staging / manifest.model_file, manifest, raw)
                _write_synced(staging / MANIFEST, signed)
                record = {"raw_digest": raw_digest, "raw_size": len(raw)}
                _write_synced(staging / INSTALL_RECORD, json.dumps(record).encode())
                fsync_directory(staging)
                staging.rename(vdir)
            except BaseException:
                self._discard(staging)  # a full disk must not keep a half-written copy too
                raise
            fsync_directory(mdir)
        except OSError as e:
            raise StoreError(f"cannot write {model}@{manifest.version} to the store: {e}") from e
        return vdir / manifest.model_file

    def discard_uncommitted(self, model: str, version: int) -> None:
        """Remove ``model@version`` unless ``current.json`` names it (a package that was
        installed, then failed its smoke test, must not be reused as is)."""
        pointer = self.pointer(model)
        if pointer is not None and version in (pointer.version, pointer.previous):
            return
        vdir = self.version_dir(model, version)
        if vdir.exists():
            self._discard(vdir)

    def commit(self, model: str, pointer: CurrentPointer) -> None:
        """Make ``pointer`` current atomically, then drop what it no longer needs."""
        if not self.has_version(model, pointer.version):
            raise StoreError(f"cannot commit {model}@{pointer.version}: it is not installed")
        mdir = self.model_dir(model)
        try:
            atomic_write_bytes(mdir / POINTER, pointer.to_json())
        except OSError as e:
            raise StoreError(f"cannot commit {model}@{pointer.version}: {e}") from e
        self.cleanup(model, keep=(pointer.version, pointer.previous), partials=True)

    def cleanup(
        self, model: str, *, keep: Iterable[int | None] | None = None, partials: bool = False
    ) -> None:
        """Delete leftovers of interrupted installs, versions not in ``keep`` (all are kept
        when it is ``None``) and, with ``partials``, downloads in progress."""
        mdir = self.model_dir(model)
        if not mdir.is_dir():
            return
        wanted = None if keep is None else {str(v) for v in keep if v is not None}
        for entry in mdir.iterdir():
            name = entry.name
            leftover = name.startswith((".staging-", ".trash-", ATOMIC_TEMP_PREFIX, f".{POINTER}."))
            unwanted = (
                wanted is not None and entry.is_dir() and name.isdigit() and name not in wanted
            )
            if leftover or unwanted or (partials and name == ".partial"):
                self._discard(entry)

    def _discard(self, path: Path) -> None:
        """Remove ``path``; a directory is first renamed away so it vanishes at once."""
        try:
            if path.is_dir() and not path.is_symlink():
                trash = path.with_name(f".trash-{secrets.token_hex(4)}")
                path.rename(trash)
                shutil.rmtree(trash)
            else:
                path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("model store: cannot remove %s: %s", path, e)


def _expected_raw_digest(manifest: ModelManifest, vdir: Path) -> str:
    signed = manifest.blob.raw_digest
    if isinstance(signed, str) and DIGEST_PATTERN.fullmatch(signed):
        return signed
    try:
        record = json.loads(_read_small(vdir / INSTALL_RECORD, _SMALL_FILE_BYTES))
        recorded = record["raw_digest"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{vdir}: install record unreadable: {e}") from e
    if not isinstance(recorded, str) or not DIGEST_PATTERN.fullmatch(recorded):
        raise StoreError(f"{vdir}: install record holds no digest")
    return recorded


def _intact(vdir: Path, manifest: ModelManifest, want: str | None) -> bool:
    """Whether ``vdir``'s model matches its install record (and ``want``, if given)."""
    path = vdir / manifest.model_file
    try:
        record = json.loads(_read_small(vdir / INSTALL_RECORD, _SMALL_FILE_BYTES))
        recorded = record["raw_digest"]
        if manifest.package is not None:
            actual = digest(_stored_package(path, manifest, str(vdir)))
        else:
            actual = digest(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError, UpdateError):
        return False
    return actual == recorded and (want is None or actual == want)


def _write_model(path: Path, manifest: ModelManifest, raw: bytes) -> None:
    """The model file, or a package's folder of verified files, each fsynced."""
    if manifest.package is None:
        _write_synced(path, raw)
        return
    try:
        files = unpack_package(raw, manifest.package)
    except PackageError as e:
        raise IntegrityError(f"{manifest.name}@{manifest.version}: {e}") from e
    path.mkdir()
    for name, data in files.items():  # names checked against the listing: no path escapes
        _write_synced(path / name, data)
    fsync_directory(path)


def _stored_package(folder: Path, manifest: ModelManifest, what: str) -> bytes:
    """A stored package's archive, rebuilt from its folder once every listed file has its
    size and digest and nothing else is there."""
    assert manifest.package is not None
    listed = manifest.package.by_name()
    try:
        present = {p.name for p in folder.iterdir()}
        if present != set(listed):
            raise IntegrityError(f"stored {what} holds other files than its manifest lists")
        files = {}
        for name, entry in listed.items():
            path = folder / name
            if path.is_symlink() or path.stat().st_size != entry.size:
                raise IntegrityError(f"stored {what}: {name} is not the listed file")
            data = path.read_bytes()
            if digest(data) != entry.digest:
                raise IntegrityError(f"stored {what}: {name} does not match its signed digest")
            files[name] = data
    except OSError as e:
        raise StoreError(f"stored {what} is unreadable: {e}") from e
    return pack_files(files)


def _read_small(path: Path, limit: int) -> bytes:
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
