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

With a rollout controller (``watch_rollouts``), read at scrape time::

    tandem_cdn_rollout_devices{rollout,model,version,state,status}
        devices of each rollout by their status (installed, failed, …).
    tandem_cdn_rollout_failure_rate{rollout,model,version,state}
        failed or timed-out devices over the devices of the waves started.
    tandem_cdn_fleet_devices{online}
        devices known to the fleet registry, online (reported in the last minute) or not.
    tandem_cdn_rollout_leader
        1 on the replica that leads rollouts now, 0 on followers (exactly one
        replica of a deployment should say 1; the rollout series above are the
        same on every replica, from the leader's state).

Labels only ever name models and blobs that exist: a request is counted
after the registry or store found what it asked for, so a client cannot
create series by inventing names. HEAD requests are not downloads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .rollout._controller import RolloutController

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

    def watch_rollouts(self, controller: RolloutController) -> None:
        """Export the controller's rollouts and fleet on every scrape."""
        self.registry.register(_RolloutCollector(controller))

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return _generate_latest(self.registry)


class _RolloutCollector(Collector):
    def __init__(self, controller: RolloutController) -> None:
        self.controller = controller

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import time

        devices = GaugeMetricFamily(
            "tandem_cdn_rollout_devices",
            "Devices of a rollout by status.",
            labels=["rollout", "model", "version", "state", "status"],
        )
        failure = GaugeMetricFamily(
            "tandem_cdn_rollout_failure_rate",
            "Failed or timed-out devices over the devices of the waves started.",
            labels=["rollout", "model", "version", "state"],
        )
        for r in self.controller.rollouts():
            base = [r["id"], r["model"], str(r["version"]), r["state"]]
            for status, n in r["counts"].items():
                if status != "total":
                    devices.add_metric([*base, status], n)
            failure.add_metric(base, r["failure_rate"])
        fleet = GaugeMetricFamily(
            "tandem_cdn_fleet_devices", "Devices known to the fleet.", labels=["online"]
        )
        now, online = time.time(), 0
        records = self.controller.devices()
        for record in records:
            online += now - record.last_seen <= 60
        fleet.add_metric(["true"], online)
        fleet.add_metric(["false"], len(records) - online)
        leader = GaugeMetricFamily(
            "tandem_cdn_rollout_leader", "1 when this replica leads rollouts, else 0."
        )
        leader.add_metric([], 1.0 if self.controller.leading else 0.0)
        yield from (devices, failure, fleet, leader)
