"""Hubs that pull signed models from the CDN: ``tandem hub --cdn URL --model NAME[@VERSION]``.

``ModelPuller.pull`` fetches each model's signed manifest (the latest, or the
pinned version), verifies it as a device does (a trusted publisher key's
signature, not expired, the model's own name, a version not below the one
served unless pinned, the ONNX format the hub serves), downloads the blob
(never past the size the manifest declares), checks its digest, decompresses
it (bounded by the declared raw size) and checks the model's own digest, and
only then writes ``<repo>/<name>/<version>/model.onnx`` (with the manifest
beside it), built in a staging directory and renamed into place. The
supervisor's repository watch then loads the new version in new executors
and swaps it in without dropping requests; a version that fails to load
leaves the old one serving. Nothing unverified ever reaches the repository.

What a hub does not do that a device does: resume a partial download (a hub
sits on a datacenter network; a failed download is tried again at the next
poll) and install deltas (it keeps no raw copy of the previous version to
apply them to). The CDN's URLs come from ``shared.CdnPaths``, as everywhere.

A model's ``config.json`` (batching, instance groups) is the operator's: it
is kept when present, and the defaults apply otherwise.

A package (``format: "onnx-genai"``, an ONNX Runtime GenAI model folder) is
checked the same way, then unpacked with ``shared.unpack_package`` (only the
files the manifest lists, each of its signed size and SHA-256; no links, no
path out of the folder) into ``<repo>/<name>/<version>/`` the same way, and
``<repo>/<name>/config.json`` says ``"platform": "onnxruntime_genai"`` (written
when absent), so the embedded ``cloud_hub.Hub`` serves it as a language model
(``hub.language``) when it loads the repository, and ``tandem hub`` in a
language executor process (the version there when the hub starts: language
executors are not swapped to a newer version while they run). A caller that
serves no language models pulls with ``packages=False``, which refuses them
in one line.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shared import (
    MAX_DOCUMENT_BYTES,
    CdnPaths,
    ModelManifest,
    PackageError,
    PublicKey,
    TandemError,
    TlsSettings,
    atomic_write_bytes,
    decompress_blob,
    digest,
    fsync_directory,
    unpack_package,
    verify_manifest,
)

from .._errors import RepositoryError
from ..language._models import PLATFORM

__all__ = ["ModelPuller", "PulledModel", "parse_model_ref"]

log = logging.getLogger(__name__)

_REF = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})(?:@(\d+))?")
_MANIFEST = "manifest.json"
_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PulledModel:
    """A model to keep: its name and, when pinned, its version (None: follow the latest)."""

    name: str
    version: int | None = None


def parse_model_ref(text: str) -> PulledModel:
    """``name`` or ``name@version`` (a positive integer); ``ValueError`` otherwise."""
    match = _REF.fullmatch(text)
    if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
        raise ValueError(f"a model is NAME or NAME@VERSION (e.g. mnist@3), got {text!r:.80}")
    return PulledModel(match.group(1), None if match.group(2) is None else int(match.group(2)))


class ModelPuller:
    """Keeps ``models`` of the CDN at ``cdn_url`` in the repository at ``repo``."""

    def __init__(
        self,
        cdn_url: str,
        repo: str | Path,
        models: list[PulledModel],
        trusted_keys: list[PublicKey],
        *,
        read_token: str | None = None,
        tls: TlsSettings | None = None,
        max_blob_bytes: int = 1024**3,
        packages: bool = True,
    ) -> None:
        if not trusted_keys:
            raise ValueError("pulling models from a CDN needs the publisher's key (--trusted-key)")
        self.paths = CdnPaths(cdn_url)
        self.repo = Path(repo)
        self.models = models
        self.trusted = trusted_keys
        self.read_token = read_token
        self.max_blob_bytes = max_blob_bytes
        self.packages = packages  # False: refuse language model packages (the process plane)
        self._context = _ssl_context(tls) if cdn_url.startswith("https://") else None
        self._lock = threading.Lock()  # the poll's thread and an operator's load

    def pull(self) -> list[str]:
        """Fetch what is new; returns ``name@version`` of each model written. Never raises
        for one model's failure (logged; the next pull tries again)."""
        written = []
        for model in self.models:
            try:
                with self._lock:
                    version = self._pull(model)
            except (TandemError, OSError, ValueError) as e:
                log.warning("model %s not pulled from %s: %s", model.name, self.paths.base, e)
                continue
            if version is not None:
                written.append(f"{model.name}@{version}")
        return written

    def pull_version(self, name: str, version: int) -> None:
        """Fetch ``name@version`` into the repository now (an operator's load asked for it);
        raises what stops it (``TandemError``, ``OSError``, ``ValueError``)."""
        with self._lock:
            self._pull(PulledModel(name, version))

    def have(self, name: str) -> list[int]:
        """The versions of ``name`` in the repository."""
        folder = self.repo / name
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdecimal())

    def _pull(self, model: PulledModel) -> int | None:
        raw = self._get(self.paths.manifest(model.name, model.version), MAX_DOCUMENT_BYTES)
        manifest = verify_manifest(raw, self.trusted)
        _check(manifest, model, packages=self.packages)
        have = self.have(model.name)
        if manifest.version in have:
            return None
        if model.version is None and have and manifest.version < max(have):
            raise RepositoryError(
                f"the CDN offers {model.name}@{manifest.version}, below the "
                f"{max(have)} served here: refusing to go back without a pin"
            )
        self._install(manifest, raw)
        log.info("pulled %s@%s from %s", manifest.name, manifest.version, self.paths.base)
        return manifest.version

    def _install(self, manifest: ModelManifest, raw_manifest: bytes) -> None:
        blob_ref = manifest.blob
        if blob_ref.size > self.max_blob_bytes:
            raise RepositoryError(
                f"blob of {blob_ref.size} bytes; the limit is {self.max_blob_bytes}"
            )
        blob = self._get(self.paths.blob(blob_ref.digest), blob_ref.size, exact=True)
        if digest(blob) != blob_ref.digest:
            raise RepositoryError(f"blob of {manifest.name}@{manifest.version}: digest mismatch")
        model = decompress_blob(blob, blob_ref.raw_size) if blob_ref.compression == "zstd" else blob
        if blob_ref.raw_digest is not None and digest(model) != blob_ref.raw_digest:
            raise RepositoryError(f"{manifest.name}@{manifest.version}: model digest mismatch")
        files = {"model.onnx": model}
        if manifest.package is not None:
            try:
                files = unpack_package(model, manifest.package)
            except PackageError as e:
                raise RepositoryError(f"{manifest.name}@{manifest.version}: {e}") from e
        folder = self.repo / manifest.name
        staging = folder / f".pull-{manifest.version}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            # Each file fsynced before the directory's rename, so a power cut never leaves
            # a version folder whose model is cut short.
            for name, data in files.items():  # names checked against the listing
                atomic_write_bytes(staging / name, data, mode=0o644)
            # Beside a package's files too: ONNX Runtime GenAI reads only what its config names.
            atomic_write_bytes(staging / _MANIFEST, raw_manifest)
            staging.rename(folder / str(manifest.version))  # whole, or not at all
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # a full disk keeps no half copy
            raise
        fsync_directory(folder)
        if manifest.package is not None and not (folder / "config.json").exists():
            config = json.dumps({"platform": PLATFORM}).encode() + b"\n"
            atomic_write_bytes(folder / "config.json", config, mode=0o644)

    def _get(self, url: str, limit: int, *, exact: bool = False) -> bytes:
        request = urllib.request.Request(url)
        if self.read_token:
            request.add_header("Authorization", f"Bearer {self.read_token}")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S, context=self._context) as r:
                body: bytes = r.read(limit + 1)
        except urllib.error.HTTPError as e:
            raise RepositoryError(f"GET {url}: HTTP {e.code} {e.reason}") from e
        if len(body) > limit or (exact and len(body) != limit):
            raise RepositoryError(f"GET {url}: {len(body)} bytes where {limit} were declared")
        return body


def _check(manifest: ModelManifest, model: PulledModel, *, packages: bool) -> None:
    if manifest.name != model.name:
        raise RepositoryError(f"asked for {model.name}, the CDN signed {manifest.name}")
    if model.version is not None and manifest.version != model.version:
        raise RepositoryError(f"asked for {model.name}@{model.version}, got {manifest.version}")
    ref = f"{manifest.name}@{manifest.version}"
    if manifest.package is not None and not packages:
        raise RepositoryError(
            f"{ref} is a language model package ({manifest.format}): this puller "
            "takes no language models (packages=False)"
        )
    if manifest.format != "onnx" and manifest.package is None:
        raise RepositoryError(f"{ref} is {manifest.format}, not ONNX")


def _ssl_context(tls: TlsSettings | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=None if tls is None else tls.ca_certs)
    if tls is not None and tls.certfile is not None:
        context.load_cert_chain(tls.certfile, tls.keyfile)
    return context


def manifest_of(version_dir: Path) -> dict[str, object] | None:
    """The manifest a pulled version was installed with, if any (for status pages)."""
    path = version_dir / _MANIFEST
    try:
        loaded: dict[str, object] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded
