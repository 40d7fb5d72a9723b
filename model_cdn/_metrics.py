"""Prometheus metrics of one CDN app: what the fleet downloads, and how much.

Every app owns a ``CdnMetrics`` with a ``CollectorRegistry`` of its own (never
prometheus_client's global one), so tests and several apps in one process
never collide; ``render()`` is what ``GET /metrics`` serves::

    tandem_cdn_manifest_downloads_total{model,version}
        manifests served (latest or pinned version), one per GET.
    tandem_cdn_blob_downloads_total{digest,kind}
        blob GETs answered with bytes; ``kind`` is ``full`` (200) or
        ``range`` (206: a resumed or split download).
    tandem_cdn_blob_bytes_served_total{digest}
        bytes of blob content the answers carry (the range's length for 206).
    tandem_cdn_blob_not_modified_total{digest}
        conditional GETs answered 304: a cache or device already had the blob.

Labels only ever name models and blobs that exist: a request is counted
after the registry or store found what it asked for, so a client cannot
create series by inventing names. HEAD requests are not downloads.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter
from prometheus_client import generate_latest as _generate_latest

__all__ = ["CdnMetrics"]


class CdnMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.manifest_downloads = Counter(
            "tandem_cdn_manifest_downloads",
            "Manifests served, per model and version.",
            ["model", "version"],
            registry=self.registry,
        )
        self.blob_downloads = Counter(
            "tandem_cdn_blob_downloads",
            "Blob GETs answered with content: kind=full (200) or range (206).",
            ["digest", "kind"],
            registry=self.registry,
        )
        self.blob_bytes = Counter(
            "tandem_cdn_blob_bytes_served",
            "Bytes of blob content served.",
            ["digest"],
            registry=self.registry,
        )
        self.blob_not_modified = Counter(
            "tandem_cdn_blob_not_modified",
            "Conditional blob GETs answered 304 Not Modified.",
            ["digest"],
            registry=self.registry,
        )

    def manifest_served(self, model: str, version: int) -> None:
        self.manifest_downloads.labels(model=model, version=str(version)).inc()

    def blob_served(self, digest: str, nbytes: int, *, partial: bool) -> None:
        self.blob_downloads.labels(digest=digest, kind="range" if partial else "full").inc()
        self.blob_bytes.labels(digest=digest).inc(nbytes)

    def blob_unchanged(self, digest: str) -> None:
        self.blob_not_modified.labels(digest=digest).inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return _generate_latest(self.registry)
