"""Size limits that every decode checks *before* it allocates."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_BLOB_BYTES", "MAX_DOCUMENT_BYTES", "Limits"]

MiB = 1024 * 1024

MAX_DOCUMENT_BYTES = 1 * MiB
"""A signed document (manifest, assignment): what the CDN stores and serves, what devices
read and parse. Both ends refuse larger ones before parsing."""

MAX_BLOB_BYTES = 1024 * MiB
"""A model blob as stored and served (compressed): the CDN refuses larger uploads and
devices refuse manifests that declare more."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Upper bounds on what a peer may send us. All sizes are in bytes.

    The defaults suit MQTT brokers (Mosquitto's default ``message_size_limit``
    is 256 MiB; most managed brokers cap far lower) and small edge models.
    """

    max_frame_bytes: int = 64 * MiB
    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_rank: int = 8
    max_tensor_bytes: int = 32 * MiB  # decoded size of one tensor
    max_total_tensor_bytes: int = 64 * MiB  # decoded size of all tensors of a message

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_header_bytes",
            "max_tensors",
            "max_rank",
            "max_tensor_bytes",
            "max_total_tensor_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
