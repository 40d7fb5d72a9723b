"""Get the raw model bytes that a verified manifest describes.

Three sources, cheapest first: the copy the store still holds of the same
blob (a rollback to the kept version), the delta from the running version
when the manifest offers one smaller than the blob in a method this device
knows (``zstd-patch`` or ``zstd-bytediff``), else the full blob.
``fetch`` downloads (the updater's "downloading" step); ``expand`` checks and
decompresses (its "verifying" step).

Invariants: what ``expand`` returns is exactly ``raw_size`` bytes, derived
from bytes whose SHA-256 is the digest the signed manifest names (or from
the store's re-verified copy), and equal to the manifest's signed
``raw_digest`` when it carries one. A delta that fails any check falls back
to the full blob. A verified download is kept until the commit (complete,
so a restart verifies it again without a request); refused bytes are
deleted at once, and a partial file that a previous run left and that does
not verify gets one clean retry. Sizes above the device's limits are
refused before any download.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from shared import (
    DeltaRef,
    ManifestError,
    ModelManifest,
    apply_delta,
    decompress_blob,
    digest,
)

from .._errors import IntegrityError, StoreError, UpdateError
from ._fetcher import CdnFetcher, DownloadResult, discard_partial
from ._stats import UpdaterStats
from ._store import DeviceModelStore
from ._trust import Trust

__all__ = ["FetchedModel", "ModelSources"]

log = logging.getLogger("tandem.edge.updater")


@dataclass
class FetchedModel:
    stored: bytes | None = None  # the raw model, already verified (the store's copy)
    download: DownloadResult | None = None  # the blob or delta, not yet verified
    base: bytes | None = None  # the running version's raw model, when ``download`` is a delta
    delta: DeltaRef | None = None  # which delta ``download`` is (its method), with ``base``


class ModelSources:
    """Fetches for one model into one store, counting into ``stats``."""

    def __init__(
        self,
        cdn: CdnFetcher,
        store: DeviceModelStore,
        *,
        model: str,
        trusted_keys: Trust,
        stats: UpdaterStats,
        cancel: threading.Event,
    ) -> None:
        self.cdn, self.store, self.model = cdn, store, model
        self.keys = trusted_keys  # a root, rotated in place, or pinned keys
        self.stats = stats
        self.cancel = cancel

    def fetch(self, manifest: ModelManifest, running: int | None) -> FetchedModel:
        """The stored copy, or the downloaded delta or blob (digest not yet checked)."""
        s = self.cdn.settings
        if manifest.blob.size > s.max_blob_bytes or manifest.blob.raw_size > s.max_raw_bytes:
            raise UpdateError(
                f"{manifest.name}@{manifest.version} is {manifest.blob.size} bytes "
                f"({manifest.blob.raw_size} raw); this device takes at most "
                f"{s.max_blob_bytes} ({s.max_raw_bytes} raw)"
            )
        stored = self._stored_copy(manifest)
        if stored is not None:
            self.stats.reused_from_store += 1
            return FetchedModel(stored=stored)
        delta = next(
            (
                d
                for d in manifest.deltas
                if d.from_version == running and d.supported and d.size < manifest.blob.size
            ),
            None,
        )
        if delta is not None and running is not None:
            try:
                base = self.store.installed(self.model, running, self.keys).raw
                download = self._download(delta.digest, delta.size)
                return FetchedModel(download=download, base=base, delta=delta)
            except UpdateError as e:
                log.info("updater: delta from %s unusable (%s); fetching the blob", running, e)
        return FetchedModel(download=self._download(manifest.blob.digest, manifest.blob.size))

    def expand(self, manifest: ModelManifest, fetched: FetchedModel) -> bytes:
        """The verified raw model; raises ``IntegrityError`` when the bytes are not it."""
        if fetched.stored is not None:
            return fetched.stored
        assert fetched.download is not None
        try:
            raw = self._expand(manifest, fetched.download, fetched.base, fetched.delta)
        except IntegrityError as e:
            if fetched.base is None:
                raise
            log.warning(
                "updater: delta to %s unusable (%s); fetching the blob", manifest.version, e
            )
            blob = self._download(manifest.blob.digest, manifest.blob.size)
            return self._expand(manifest, blob, None, None)
        if fetched.base is not None:
            self.stats.delta_installs += 1
        return raw

    def _expand(
        self,
        manifest: ModelManifest,
        download: DownloadResult,
        base: bytes | None,
        delta: DeltaRef | None,
    ) -> bytes:
        raw_size = manifest.blob.raw_size
        try:
            data = self._verified(download)
            if base is not None:
                method = delta.compression if delta is not None else "zstd-patch"
                raw = apply_delta(base, data, raw_size, method=method)
            elif manifest.blob.compression == "none":
                if len(data) != raw_size:
                    raise IntegrityError(f"blob is {len(data)} bytes; raw_size is {raw_size}")
                raw = data
            else:
                raw = decompress_blob(data, raw_size)
            signed_raw_digest = manifest.blob.raw_digest
            if isinstance(signed_raw_digest, str) and digest(raw) != signed_raw_digest:
                raise IntegrityError(f"{manifest.name}@{manifest.version}: not its raw_digest")
        except ManifestError as e:  # shared's codec: not zstd, or the wrong size
            discard_partial(download.path)
            raise IntegrityError(str(e)) from e
        except BaseException:
            discard_partial(download.path)
            raise
        return raw  # the download stays until the commit clears it: a crash costs no refetch

    def _stored_copy(self, manifest: ModelManifest) -> bytes | None:
        if not self.store.has_version(self.model, manifest.version):
            return None
        try:
            stored = self.store.installed(self.model, manifest.version, self.keys)
        except UpdateError as e:
            log.info("updater: stored %s@%s unusable (%s)", self.model, manifest.version, e)
            return None
        return stored.raw if stored.manifest.blob.digest == manifest.blob.digest else None

    def _download(self, blob_digest: str, size: int) -> DownloadResult:
        partial = self.store.partial_path(self.model, blob_digest)
        try:
            partial.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot prepare the download directory: {e}") from e
        result = self.cdn.download_blob(blob_digest, size, partial, cancel=self.cancel)
        self.stats.blob_bytes_read += result.bytes_read
        self.stats.resumed += result.resumed
        self.stats.restarted += result.restarted
        return result

    def _verified(self, download: DownloadResult) -> bytes:
        """The downloaded bytes if their SHA-256 is the digest asked for; else raise."""
        data = download.path.read_bytes()
        if digest(data) == download.digest:
            return data
        discard_partial(download.path)
        if download.resumed_from_disk:  # the old partial may be what is wrong: one clean try
            fresh = self._download(download.digest, len(data))
            data = fresh.path.read_bytes()
            if digest(data) == download.digest:
                return data
        raise IntegrityError(f"downloaded blob does not match its digest {download.digest}")
