"""What a model's ``config.json`` says about collecting examples: its ``collection`` key.

Collection is opt-in twice: the model's config turns it on at the hub, and
only requests whose device shares its answers (``shared.EdgeAnswer`` in the
header) are candidates. Every key but ``store`` is optional::

    "collection": {
      "store": "s3://bucket/lessons?endpoint_url=http://minio:9000",
                                   # or a path or file:// URL (relative: to the config file)
      "keep_inputs": true,         # false: fingerprints and answers only, no raw input stored
      "sample_rate": 0.0,          # the hub's own draw among rows where edge and cloud agree
                                   # (a device may also mark a request sampled)
      "max_per_device": 1000,      # rows one device may have in the set (retained shards)
      "max_bytes": 268435456,      # this model's shards in the store; the oldest go first
      "retention_days": 30,        # shards older than this are deleted
      "shard_rows": 256,           # a shard is written once this many rows wait ...
      "flush_s": 30,               # ... or this long after the first of them
      "max_pending_rows": 4096     # rows waiting for the store at most; more are skipped
    }

Pure: ``CollectionConfig.from_json`` validates and names the field at fault
(``ModelConfigError``); nothing here touches the store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ModelConfigError

__all__ = ["CollectionConfig"]

_DAY_S = 86400.0


@dataclass(frozen=True, kw_only=True)
class CollectionConfig:
    """How (and whether) one model's offloaded requests are kept as training examples."""

    store: str
    keep_inputs: bool = True
    sample_rate: float = 0.0  # of agreeing rows, drawn at the hub
    max_per_device: int = 1000  # rows
    max_bytes: int = 256 * 1024 * 1024
    retention_days: float = 30.0
    shard_rows: int = 256
    flush_s: float = 30.0
    max_pending_rows: int = 4096

    def __post_init__(self) -> None:
        if (
            not isinstance(self.store, str)
            or not self.store
            or ("://" in self.store and not self.store.startswith(("file://", "s3://")))
        ):
            raise ModelConfigError(
                f"collection.store: a path or a file:// or s3:// URL, got {self.store!r:.80}"
            )
        if not isinstance(self.keep_inputs, bool):
            raise ModelConfigError("collection.keep_inputs: must be true or false")
        _number(self.sample_rate, "sample_rate", 0.0, 1.0)
        _number(self.retention_days, "retention_days", 0.0, None, open_low=True)
        _number(self.flush_s, "flush_s", 0.0, None, open_low=True)
        for name in ("max_per_device", "max_bytes", "shard_rows", "max_pending_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"collection.{name}: must be an integer >= 1, got {value!r}")

    @property
    def retention_s(self) -> float:
        return self.retention_days * _DAY_S

    @classmethod
    def from_json(
        cls, data: object, source: str = "<config>", *, base: Path | None = None
    ) -> CollectionConfig:
        """Validated from ``config.json``'s object; a relative store path is made absolute
        against ``base`` (the directory of the file it came from)."""
        if not isinstance(data, Mapping):
            raise ModelConfigError(f"{source}: collection: must be an object with a store")
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ModelConfigError(
                f"{source}: collection: unknown keys {sorted(unknown)}; known: {sorted(known)}"
            )
        values: dict[str, Any] = dict(data)
        if "store" not in values:
            raise ModelConfigError(f"{source}: collection.store: required")
        store = values["store"]
        if isinstance(store, str) and store and "://" not in store and base is not None:
            values["store"] = str(base / store)  # a no-op for an absolute path
        try:
            return cls(**values)
        except ModelConfigError as e:
            raise ModelConfigError(f"{source}: {e}") from None


def _number(
    value: object, name: str, low: float, high: float | None, *, open_low: bool = False
) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if open_low else value >= low)
        and (high is None or value <= high)
    )
    if not ok:
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        upper = f" and <= {high:g}" if high is not None else ""
        raise ModelConfigError(f"collection.{name}: must be a number {bound}{upper}, got {value!r}")
