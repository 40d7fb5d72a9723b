"""The rules of collection, without I/O: which rows are kept, whose are capped, what expires.

- ``row_reasons``: a row of an answered request is kept as ``"disagree"``
  when the device's top class differs from the cloud's, else as
  ``"sample"`` when the device marked the request sampled or the hub's own
  draw falls under ``sample_rate``, else not at all. A request whose edge
  labels do not count one per row of the cloud's answer is skipped whole
  (``"mismatch"``): there is nothing row by row to compare.
- ``DeviceQuota``: rows each device has in the set, those already in stored
  shards (recounted from their manifests, every writer's) plus those waiting
  here; a device at ``cap`` gets no more rows in until old shards go, so one
  device cannot flood the set.
- ``shards_to_delete``: shards older than the retention go, then the oldest
  until the model's shards fit the byte budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from shared import EdgeAnswer
from shared.server import ShardManifest

__all__ = ["DeviceQuota", "row_reasons", "shards_to_delete"]


def row_reasons(
    answer: EdgeAnswer,
    cloud_labels: np.ndarray,
    *,
    sample_rate: float,
    draw: Callable[[], float],
) -> tuple[list[str | None], str | None]:
    """(why each row is kept, or None; why the whole request is skipped, or None)."""
    rows = len(cloud_labels)
    edge = answer.labels
    if edge is not None and len(edge) != rows:
        return [None] * rows, "mismatch"
    reasons: list[str | None] = []
    for i in range(rows):
        if edge is not None and edge[i] != int(cloud_labels[i]):
            reasons.append("disagree")
        elif answer.sampled or (sample_rate > 0 and draw() < sample_rate):
            reasons.append("sample")
        else:
            reasons.append(None)
    return reasons, None


class DeviceQuota:
    """Rows per device in the set (stored + waiting here) against a cap. Not thread-safe."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.stored: dict[str, int] = {}
        self.waiting: Counter[str] = Counter()

    def room(self, device: str) -> int:
        """How many more rows ``device`` may add now."""
        return max(0, self.cap - self.stored.get(device, 0) - self.waiting[device])

    def wait(self, device: str, rows: int) -> None:
        self.waiting[device] += rows

    def written(self, rows_by_device: Mapping[str, int]) -> None:
        """Rows that reached a stored shard: from waiting to stored."""
        for device, rows in rows_by_device.items():
            self.waiting[device] -= rows
            self.stored[device] = self.stored.get(device, 0) + rows

    def dropped(self, rows_by_device: Mapping[str, int]) -> None:
        """Rows that never reached the store."""
        for device, rows in rows_by_device.items():
            self.waiting[device] -= rows

    def recount(self, manifests: Iterable[ShardManifest]) -> None:
        """The stored counts as the manifests in the store say (every writer's shards)."""
        stored: Counter[str] = Counter()
        for manifest in manifests:
            for device, rows in zip(manifest.devices, manifest.device_rows, strict=True):
                stored[device] += rows
        self.stored = dict(stored)


def shards_to_delete(
    manifests: Sequence[ShardManifest], *, now: float, max_age_s: float, max_bytes: int
) -> list[tuple[ShardManifest, str]]:
    """(shard, "retention" | "budget") for each shard to delete, oldest first."""
    ordered = sorted(manifests, key=lambda m: (m.created_at, m.key))
    doomed: list[tuple[ShardManifest, str]] = []
    kept: list[ShardManifest] = []
    for manifest in ordered:
        if now - manifest.created_at > max_age_s:
            doomed.append((manifest, "retention"))
        else:
            kept.append(manifest)
    total = sum(m.size for m in kept)
    for manifest in kept:
        if total <= max_bytes:
            break
        doomed.append((manifest, "budget"))
        total -= manifest.size
    return doomed
