"""The manifest of one shard of collected examples: what it holds, where its data is.

Plain JSON next to the shard's data (``<key>.json`` beside ``<key>.npz``),
read back by ``from_dict``, which validates every field
(``ExampleShardError``), keeps unknown ones in ``extra`` and refuses another
major ``format``. ``device_rows`` (rows per device) lets a writer count what
each device already has in the set without reading the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import ExampleShardError

__all__ = ["SHARD_FORMAT", "ShardManifest"]

SHARD_FORMAT = 1  # a reader refuses another major format
_KEYS = frozenset(
    {
        "format", "model", "key", "rows", "writer", "created_at", "first_at", "last_at",
        "inputs_kept", "devices", "device_rows", "edge_models", "cloud_versions", "reasons",
        "data",
    }
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ShardManifest:
    """What a shard holds and where its data is; the ``.json`` object next to the data."""

    model: str
    key: str  # the shard's name: the data is key + ".npz", the manifest key + ".json"
    rows: int
    writer: str
    created_at: float  # Unix seconds
    first_at: float  # the first and last row's receipt time
    last_at: float
    inputs_kept: bool
    devices: tuple[str, ...]
    device_rows: tuple[int, ...]  # rows per device, in the order of ``devices``
    edge_models: tuple[str, ...]
    cloud_versions: tuple[str, ...]
    reasons: Mapping[str, int]
    data_bytes: int
    data_digest: str
    format: int = SHARD_FORMAT
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def data_key(self) -> str:
        return self.key + ".npz"

    @property
    def manifest_key(self) -> str:
        return self.key + ".json"

    @property
    def size(self) -> int:
        """Bytes the shard's data takes in the store (its manifest is small beside it)."""
        return self.data_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "format": self.format,
            "model": self.model,
            "key": self.key,
            "rows": self.rows,
            "writer": self.writer,
            "created_at": self.created_at,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "inputs_kept": self.inputs_kept,
            "devices": list(self.devices),
            "device_rows": list(self.device_rows),
            "edge_models": list(self.edge_models),
            "cloud_versions": list(self.cloud_versions),
            "reasons": dict(self.reasons),
            "data": {"bytes": self.data_bytes, "sha256": self.data_digest},
        }

    @classmethod
    def from_dict(cls, data: object) -> ShardManifest:
        if not isinstance(data, Mapping):
            raise ExampleShardError("a shard manifest is a JSON object")
        fmt = data.get("format")
        if fmt != SHARD_FORMAT:
            raise ExampleShardError(f"shard format {fmt!r:.20}; this build reads {SHARD_FORMAT}")
        try:
            stored = data["data"]
            reasons = data["reasons"]
            manifest = cls(
                model=_text(data["model"], "model"),
                key=_text(data["key"], "key"),
                rows=_count(data["rows"], "rows"),
                writer=_text(data["writer"], "writer"),
                created_at=_number(data["created_at"]),
                first_at=_number(data["first_at"]),
                last_at=_number(data["last_at"]),
                inputs_kept=_flag(data["inputs_kept"]),
                devices=_texts(data["devices"], "devices"),
                device_rows=tuple(_count(n, "device_rows") for n in _list(data["device_rows"])),
                edge_models=_texts(data["edge_models"], "edge_models", empty=True),
                cloud_versions=_texts(data["cloud_versions"], "cloud_versions"),
                reasons={_text(k, "reason"): _count(v, "reasons") for k, v in reasons.items()},
                data_bytes=_count(stored["bytes"], "data.bytes"),
                data_digest=_text(stored["sha256"], "data.sha256"),
                extra={k: v for k, v in data.items() if k not in _KEYS},
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ExampleShardError(f"a shard manifest without a valid {e}") from None
        if len(manifest.device_rows) != len(manifest.devices):
            raise ExampleShardError("device_rows must count the rows of each of devices")
        if sum(manifest.device_rows) != manifest.rows:
            raise ExampleShardError("device_rows must add up to rows")
        return manifest


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 512:
        raise ExampleShardError(f"shard manifest: {what} must be text, got {value!r:.60}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("list")
    return value


def _texts(value: object, what: str, *, empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ExampleShardError(f"shard manifest: {what} must be a list")
    return tuple("" if (empty and v == "") else _text(v, what) for v in value)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExampleShardError(f"shard manifest: {what} must be a count, got {value!r:.40}")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExampleShardError(f"shard manifest: a time must be a number, got {value!r:.40}")
    return float(value)


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ExampleShardError("shard manifest: inputs_kept must be true or false")
    return value
