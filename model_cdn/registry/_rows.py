"""What every SQL registry backend shares: table layout, row <-> record, document checks.

No I/O here. The statements are written once too (``_sql``); the backends
differ only in connection handling and a small ``Dialect``. What a row
holds and how a signed document becomes one is decided once, here.

Tables::

    models      (name PRIMARY KEY, latest_version)       the high-water mark per model
    versions    (name, version, manifest, blob_digest, published_at)
                PRIMARY KEY (name, version)
    assignments (device, model, document, updated_at)    PRIMARY KEY (device, model)
    devices     (id PRIMARY KEY, labels, capabilities, models, first_seen, last_seen,
                 telemetry)                              the fleet, one row per device
    rollouts    (id PRIMARY KEY, model, version, state, snapshot, created_at, updated_at)
                indexed on state and on created_at

``models.latest_version`` only ever grows, even when versions are deleted:
a deleted version number is never handed out again, so a device that saw
``mnist@3`` once can never be offered a different ``mnist@3``.

Documents are stored as JSON text, not as a database JSON type: JSONB would
reorder keys and normalise numbers, and what a device verifies should be
what the publisher uploaded. The fleet's JSON columns (labels, capabilities,
models, telemetry, a rollout's snapshot) are JSON text too, for the same
code on both backends; times there are epoch seconds (floating point).

Every table is created ``IF NOT EXISTS``, so a registry made by an older
release gains the tables it lacks when it is next opened.

A batch of devices is written in id order (``device_rows``): two
transactions upserting overlapping batches then lock rows in the same order
and cannot deadlock each other on PostgreSQL.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from shared import (
    Assignment,
    ConfigError,
    ManifestError,
    ModelManifest,
    format_time,
    validate_name,
)

from .._errors import InvalidNameError, RegistryError
from ._base import DeviceRecord, RolloutRecord, VersionRecord

__all__ = [
    "DEVICE_COLUMNS",
    "ROLLOUT_COLUMNS",
    "assignment_fields",
    "check_name",
    "check_rollout_id",
    "check_version",
    "device_from_row",
    "device_rows",
    "dump_document",
    "load_document",
    "manifest_fields",
    "now_text",
    "record_from_row",
    "rollout_from_row",
    "rollout_row",
]

DEVICE_COLUMNS = "id, labels, capabilities, models, first_seen, last_seen, telemetry"
ROLLOUT_COLUMNS = "id, model, version, state, snapshot, created_at, updated_at"
ROLLOUT_ID_PATTERN = re.compile(r"ro-[0-9a-f]{12}")
_STATE_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def check_name(value: object, what: str) -> str:
    """A model or device name, or ``InvalidNameError`` (never reaches SQL unchecked)."""
    try:
        return validate_name(value, what)
    except ConfigError as e:
        raise InvalidNameError(str(e)) from e


def check_version(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**63:
        raise InvalidNameError(f"a version is a positive integer, got {value!r:.40}")
    return value


def _signed_part(document: object, what: str) -> dict[str, Any]:
    if not isinstance(document, dict) or not isinstance(document.get("signed"), dict):
        raise ManifestError(f"a signed {what} is an object with a 'signed' object")
    if not isinstance(document.get("signatures"), list):
        raise ManifestError(f"a signed {what} has a 'signatures' list")
    return document["signed"]


def manifest_fields(signed_manifest: object) -> ModelManifest:
    """The parsed manifest inside a signed document (structure only; signatures are the
    server's and the device's business)."""
    return ModelManifest.from_dict(_signed_part(signed_manifest, "manifest"))


def assignment_fields(device: str, model: str, signed_assignment: object) -> Assignment:
    """The parsed assignment, which must be for ``device`` and ``model``."""
    check_name(device, "device id")
    check_name(model, "model name")
    assignment = Assignment.from_dict(_signed_part(signed_assignment, "assignment"))
    if (assignment.device, assignment.model) != (device, model):
        raise InvalidNameError(
            f"the assignment is for {assignment.device}/{assignment.model}, not {device}/{model}"
        )
    return assignment


def dump_document(document: dict[str, Any]) -> str:
    """The JSON text stored for a document; ``load_document`` gives back an equal dict."""
    try:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ManifestError(f"document is not plain JSON: {e}") from e


def load_document(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ManifestError("stored document is not a JSON object")
    return value


def record_from_row(row: tuple[Any, ...]) -> VersionRecord:
    """``(name, version, manifest, blob_digest, published_at)`` -> ``VersionRecord``."""
    name, version, manifest, blob_digest, published_at = row
    return VersionRecord(
        name=name,
        version=int(version),
        manifest=load_document(manifest),
        blob_digest=blob_digest,
        published_at=published_at,
    )


def now_text() -> str:
    return format_time(datetime.now(UTC))


# -- devices and rollouts ---------------------------------------------------


def check_rollout_id(value: object) -> str:
    """A rollout id (``ro-`` and 12 lowercase hex digits), or ``InvalidNameError``."""
    if not isinstance(value, str) or not ROLLOUT_ID_PATTERN.fullmatch(value):
        raise InvalidNameError(f"a rollout id is 'ro-' and 12 hex digits, got {value!r:.40}")
    return value


def _epoch(value: object, what: str) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise RegistryError(f"{what} is a finite number of epoch seconds, got {value!r:.40}")
    return float(value)


def _strings(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RegistryError(f"{what} is an object of strings to strings")
    return value


def _dump(value: dict[str, Any], what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise RegistryError(f"{what} is not plain JSON: {e}") from e


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise RegistryError(f"stored {what} is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise RegistryError(f"stored {what} is not a JSON object")
    return value


def _device_row(record: DeviceRecord) -> tuple[Any, ...]:
    if not isinstance(record, DeviceRecord):
        raise RegistryError(f"expected a DeviceRecord, got {type(record).__name__}")
    device = check_name(record.device, "device id")
    what = f"device {device}"
    if not isinstance(record.models, dict):
        raise RegistryError(f"{what}: models is an object of model names to versions")
    for model, version in record.models.items():
        check_name(model, "model name")
        check_version(version)
    telemetry = record.telemetry
    if telemetry is not None and not isinstance(telemetry, dict):
        raise RegistryError(f"{what}: telemetry is an object or None")
    return (
        device,
        _dump(_strings(record.labels, f"{what}: labels"), f"{what}: labels"),
        _dump(_strings(record.capabilities, f"{what}: capabilities"), f"{what}: capabilities"),
        _dump(record.models, f"{what}: models"),
        _epoch(record.first_seen, f"{what}: first_seen"),
        _epoch(record.last_seen, f"{what}: last_seen"),
        None if telemetry is None else _dump(telemetry, f"{what}: telemetry"),
    )


def device_rows(records: Iterable[DeviceRecord]) -> list[tuple[Any, ...]]:
    """Rows (``DEVICE_COLUMNS`` order) for a batch, every record checked before any is
    written, sorted by id (stable: of two records for one device the later one wins)."""
    if isinstance(records, DeviceRecord):
        raise RegistryError("upsert_devices takes an iterable of DeviceRecord, not one record")
    rows = [_device_row(r) for r in records]
    rows.sort(key=lambda row: row[0])
    return rows


def device_from_row(row: tuple[Any, ...]) -> DeviceRecord:
    """A ``DEVICE_COLUMNS`` row -> ``DeviceRecord``."""
    device, labels, capabilities, models, first_seen, last_seen, telemetry = row
    return DeviceRecord(
        device=device,
        labels=_load(labels, "labels"),
        capabilities=_load(capabilities, "capabilities"),
        models=_load(models, "models"),
        first_seen=float(first_seen),
        last_seen=float(last_seen),
        telemetry=None if telemetry is None else _load(telemetry, "telemetry"),
    )


def rollout_row(record: RolloutRecord) -> tuple[Any, ...]:
    """A ``RolloutRecord`` checked and turned into a ``ROLLOUT_COLUMNS`` row."""
    if not isinstance(record, RolloutRecord):
        raise RegistryError(f"expected a RolloutRecord, got {type(record).__name__}")
    rollout_id = check_rollout_id(record.id)
    what = f"rollout {rollout_id}"
    if not isinstance(record.state, str) or not _STATE_PATTERN.fullmatch(record.state):
        raise RegistryError(f"{what}: state {record.state!r:.40} is not a rollout state")
    if not isinstance(record.snapshot, dict):
        raise RegistryError(f"{what}: snapshot is an object")
    return (
        rollout_id,
        check_name(record.model, "model name"),
        check_version(record.version),
        record.state,
        _dump(record.snapshot, f"{what}: snapshot"),
        _epoch(record.created_at, f"{what}: created_at"),
        _epoch(record.updated_at, f"{what}: updated_at"),
    )


def rollout_from_row(row: tuple[Any, ...]) -> RolloutRecord:
    """A ``ROLLOUT_COLUMNS`` row -> ``RolloutRecord``."""
    rollout_id, model, version, state, snapshot, created_at, updated_at = row
    return RolloutRecord(
        id=rollout_id,
        model=model,
        version=int(version),
        state=state,
        snapshot=_load(snapshot, "rollout snapshot"),
        created_at=float(created_at),
        updated_at=float(updated_at),
    )
