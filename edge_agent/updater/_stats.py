"""Counters an updater keeps; read them, never write them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UpdaterStats"]


@dataclass
class UpdaterStats:
    assignments: int = 0  # documents acted on (duplicates skipped are not counted)
    installed: int = 0
    rolled_back: int = 0
    failed: int = 0
    polls: int = 0  # assignment requests to the CDN while MQTT was down or unset
    blob_bytes_read: int = 0  # body bytes of blobs and deltas, over all requests
    resumed: int = 0  # blob requests that continued a partial file
    restarted: int = 0  # partial files dropped because the blob changed under them
    delta_installs: int = 0
    reused_from_store: int = 0  # installs that needed no download (a rollback to the kept one)
