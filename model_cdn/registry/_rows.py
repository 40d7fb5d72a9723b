"""What every SQL registry backend shares: table layout, row <-> record, document checks.

No I/O here. The backends differ only in connection handling, parameter
style and how they take the per-model lock; what a row holds and how a
signed document becomes one is decided once, here.

Tables::

    models      (name PRIMARY KEY, latest_version)       the high-water mark per model
    versions    (name, version, manifest, blob_digest, published_at)
                PRIMARY KEY (name, version)
    assignments (device, model, document, updated_at)    PRIMARY KEY (device, model)

``models.latest_version`` only ever grows, even when versions are deleted:
a deleted version number is never handed out again, so a device that saw
``mnist@3`` once can never be offered a different ``mnist@3``.

Documents are stored as JSON text, not as a database JSON type: JSONB would
reorder keys and normalise numbers, and what a device verifies should be
what the publisher uploaded.
"""

from __future__ import annotations

import json
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

from .._errors import InvalidNameError
from ._base import VersionRecord

__all__ = [
    "assignment_fields",
    "check_name",
    "check_version",
    "dump_document",
    "load_document",
    "manifest_fields",
    "now_text",
    "record_from_row",
]


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
