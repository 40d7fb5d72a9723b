"""The CDN's write operations: one code path each, for the admin API and the CLI alike.

::

    add_version(registry, store, signed_manifest, *, trusted_keys, blobs=None, name=None)
        -> VersionRecord
    delete_version(registry, name, version) -> None
    assign_version(registry, sender, device, model, signed_assignment, *, trusted_keys,
                   wait=True) -> AssignResult

``add_version`` publishes a version: it verifies the signed manifest (against
``trusted_keys`` when given: a list of keys, any one of which may sign, or a
``TrustedRoot``, whose publisher role must sign, as devices check; its
structure only otherwise: devices verify again, this only stops mistakes
early), refuses one for another model than
``name`` or already expired, stores the given ``blobs`` (digest -> bytes,
each checked against its digest and named by the manifest), checks that
every blob the manifest names (the model and its deltas) is in the store,
and registers it (the registry refuses a version not above the latest).

``assign_version`` verifies a signed assignment the same way (a root's
assigner role), checks that it
is for ``device`` and ``model``, not expired, and names a version the
registry has, then stores and publishes it through ``sender`` (an
``AssignmentSender``; None: stored only, devices poll).

Errors: ``shared.ManifestError`` (``SignatureError``, ``ExpiredError``) for a
document that does not verify; ``DocumentRejectedError`` for one that is not
acceptable here; ``InvalidNameError`` for a bad name, version or digest;
``ModelNotFoundError``, ``VersionConflictError``; ``AssignmentNotPublishedError``
when the assignment was stored but the broker did not take it. Nothing is
registered or assigned when a check fails (blobs given may already be stored:
they are content-addressed, so a stray one is harmless).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared import (
    CdnPaths,
    InvalidStoreKeyError,
    ManifestError,
    ModelManifest,
    PublicKey,
    TrustedRoot,
    verify_assignment,
    verify_manifest,
)
from shared import digest as compute_digest
from shared.server.store import BlobStore, check_digest

from ._errors import DocumentRejectedError, InvalidNameError, ModelNotFoundError
from .registry import Registry, VersionRecord
from .registry._rows import assignment_fields, check_name, check_version, manifest_fields

if TYPE_CHECKING:
    from ._assignment_sender import AssignmentSender

__all__ = ["AssignResult", "add_version", "assign_version", "delete_version"]


@dataclass(frozen=True)
class AssignResult:
    device: str
    model: str
    version: int
    published: bool  # False: stored only (no broker); devices poll the CDN

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "model": self.model,
            "version": self.version,
            "published": self.published,
        }


def add_version(
    registry: Registry,
    store: BlobStore,
    signed_manifest: Mapping[str, Any],
    *,
    trusted_keys: Sequence[PublicKey] | TrustedRoot | None,
    blobs: Mapping[str, bytes] | None = None,
    name: str | None = None,
) -> VersionRecord:
    """Publish the version ``signed_manifest`` describes (see the module docstring).

    ``name``: the model the caller means (the API's URL); the manifest must be for it.
    """
    doc = _document(signed_manifest, "manifest")
    manifest = _manifest(doc, trusted_keys)
    if name is not None and manifest.name != check_name(name, "model name"):
        raise DocumentRejectedError(f"the manifest is for model {manifest.name!r}, not {name!r}")
    if manifest.expired():
        raise DocumentRejectedError(f"the manifest expired at {manifest.expires_at}")
    needed = [manifest.blob.digest, *(d.digest for d in manifest.deltas)]
    _store_blobs(store, blobs or {}, needed)
    for blob in needed:
        if not store.exists(blob):
            raise DocumentRejectedError(
                f"blob {blob} is not in the store: PUT {CdnPaths().blob(blob)} first"
            )
    return registry.add_version(doc)


def delete_version(registry: Registry, name: str, version: int) -> None:
    """Withdraw ``name@version`` (``ModelNotFoundError``); its number is never reused."""
    registry.delete_version(check_name(name, "model name"), check_version(version))


def assign_version(
    registry: Registry,
    sender: AssignmentSender | None,
    device: str,
    model: str,
    signed_assignment: Mapping[str, Any],
    *,
    trusted_keys: Sequence[PublicKey] | TrustedRoot | None,
    wait: bool = True,
) -> AssignResult:
    """Store and publish a signed assignment of ``model`` to ``device`` (module docstring).

    ``wait``: return only once the broker acknowledged it (see ``AssignmentSender``).
    """
    check_name(device, "device id")
    check_name(model, "model name")
    doc = _document(signed_assignment, "assignment")
    if isinstance(trusted_keys, TrustedRoot):
        assignment = trusted_keys.verify_assignment(doc)  # a threshold of the assigner role
    elif trusted_keys:
        assignment = verify_assignment(doc, list(trusted_keys))
    else:
        assignment = assignment_fields(device, model, doc)
    if (assignment.device, assignment.model) != (device, model):
        raise DocumentRejectedError(
            f"the assignment is for {assignment.device}/{assignment.model}, not {device}/{model}"
        )
    if assignment.expired():
        raise DocumentRejectedError(f"the assignment expired at {assignment.expires_at}")
    try:
        registry.get_version(model, assignment.version)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(f"no version {model}@{assignment.version} to assign") from e
    if sender is None:
        registry.put_assignment(device, model, doc)
        published = False
    else:
        published = sender.deliver(registry, device, model, doc, wait=wait)
    return AssignResult(device, model, assignment.version, published)


def _document(document: object, what: str) -> dict[str, Any]:
    if not isinstance(document, Mapping):
        raise ManifestError(f"a signed {what} is an object with a 'signed' object")
    return dict(document)


def _manifest(
    doc: dict[str, Any], trusted_keys: Sequence[PublicKey] | TrustedRoot | None
) -> ModelManifest:
    if isinstance(trusted_keys, TrustedRoot):
        return trusted_keys.verify_manifest(doc)  # a threshold of the publisher role
    if trusted_keys:
        return verify_manifest(doc, list(trusted_keys))
    return manifest_fields(doc)


def _store_blobs(store: BlobStore, blobs: Mapping[str, bytes], needed: list[str]) -> None:
    """Check every given blob against its digest and the manifest, then store them."""
    for name, data in blobs.items():
        try:
            check_digest(name)
        except InvalidStoreKeyError as e:  # the operations' contract: a bad name, any kind
            raise InvalidNameError(str(e)) from e
        if not isinstance(data, bytes):
            raise DocumentRejectedError(f"blob {name} is given as {type(data).__name__}, not bytes")
        if name not in needed:
            raise DocumentRejectedError(f"blob {name} is not named by the manifest")
        actual = compute_digest(data)
        if actual != name:
            raise DocumentRejectedError(f"the bytes given as {name} have the digest {actual}")
    for data in blobs.values():
        store.put(data)
