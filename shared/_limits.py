"""Size limits that every decode checks *before* it allocates."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MAX_BLOB_BYTES",
    "MAX_DOCUMENT_BYTES",
    "MQTT_PACKET_OVERHEAD_BYTES",
    "Limits",
    "mqtt_max_packet_bytes",
]

MiB = 1024 * 1024

MAX_DOCUMENT_BYTES = 1 * MiB
"""A signed document (manifest, assignment): what the CDN stores and serves, what devices
read and parse. Both ends refuse larger ones before parsing."""

MAX_BLOB_BYTES = 1024 * MiB
"""A model blob as stored and served (compressed): the CDN refuses larger uploads and
devices refuse manifests that declare more."""


MQTT_PACKET_OVERHEAD_BYTES = 64 * 1024 + 1024
"""What an MQTT PUBLISH adds to its payload, at most as Tandem sends it: the fixed
header, a topic (at most 65,535 bytes) and MQTT 5 properties (reply topic,
correlation data, expiry)."""


def mqtt_max_packet_bytes(limits: Limits | None = None) -> int:
    """The largest MQTT packet that can carry a frame within ``limits.max_frame_bytes``.

    What a hub advertises as its MQTT 5 maximum packet size (a compliant broker
    then never delivers it more) and what generated broker configurations set
    as Mosquitto's ``max_packet_size`` (the broker drops a client that sends
    more, as soon as it reads the packet's length).
    """
    return (limits or Limits()).max_frame_bytes + MQTT_PACKET_OVERHEAD_BYTES


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
    max_text_bytes: int = 1 * MiB  # UTF-8 text of one text-generation message (a prompt)
    max_token_ids: int = 128 * 1024  # token ids in one text-generation message
    max_output_tokens: int = 128 * 1024  # a generate request's max_tokens

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_header_bytes",
            "max_tensors",
            "max_rank",
            "max_tensor_bytes",
            "max_total_tensor_bytes",
            "max_text_bytes",
            "max_token_ids",
            "max_output_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
