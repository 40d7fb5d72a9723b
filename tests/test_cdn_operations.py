"""The CDN's write operations as a library (``model_cdn._versions``): the one code path
the admin API and the CLI's local mode share, over a real SQLite registry and blob store.

Refusals are named after the mistake or attack they stop; after each one the
registry (and, where blobs were given, the store) is checked to be unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from model_cdn import (
    AssignmentSender,
    DocumentRejectedError,
    InvalidNameError,
    LocalBlobStore,
    ModelNotFoundError,
    VersionConflictError,
    add_version,
    assign_version,
    delete_version,
    open_registry,
)
from model_cdn.registry import Registry
from shared import (
    BlobRef,
    ExpiredError,
    ModelManifest,
    MqttSettings,
    SignatureError,
    SigningKey,
    Topics,
    digest,
    format_time,
    sign_document,
    verify_assignment,
)

from ._brokers import MosquittoProcess
from ._cdn import files_under, make_assignment_doc, make_manifest_doc, receive_retained

KEY = SigningKey(bytes(range(32)))
OTHER_KEY = SigningKey(bytes(range(1, 33)))
TRUSTED = [KEY.public_key]
BLOB = bytes(range(256)) * 8


@dataclass
class Cdn:
    registry: Registry
    store: LocalBlobStore
    root: Path

    def blobs_on_disk(self) -> set[Path]:
        return files_under(self.root / "blobs")


@pytest.fixture
def cdn(tmp_path: Path) -> Iterator[Cdn]:
    registry = open_registry(tmp_path / "registry.db")
    try:
        yield Cdn(registry, LocalBlobStore(tmp_path / "blobs"), tmp_path)
    finally:
        registry.close()


def expired_manifest(key: SigningKey, name: str, version: int, blob: bytes) -> dict[str, Any]:
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    manifest = ModelManifest(
        name=name,
        version=version,
        format="onnx",
        blob=BlobRef(digest(blob), len(blob), len(blob), "none"),
        published_at=format_time(past),
        expires_at=format_time(past + timedelta(days=1)),
    )
    return sign_document(manifest.to_dict(), key)


# -- add_version ------------------------------------------------------------------


def test_a_signed_version_with_its_blob_is_stored_and_registered(cdn: Cdn) -> None:
    doc = make_manifest_doc(KEY, "mnist", 1, BLOB)
    record = add_version(
        cdn.registry, cdn.store, doc, trusted_keys=TRUSTED, blobs={digest(BLOB): BLOB}
    )
    assert (record.name, record.version, record.blob_digest) == ("mnist", 1, digest(BLOB))
    assert cdn.store.get(digest(BLOB)) == BLOB
    assert cdn.registry.get_version("mnist").manifest == doc
    # the blob already in the store (uploaded earlier): no blobs needed
    second = make_manifest_doc(KEY, "mnist", 2, BLOB)
    assert add_version(cdn.registry, cdn.store, second, trusted_keys=TRUSTED).version == 2


@pytest.mark.parametrize(
    ("attack", "error", "message"),
    [
        ("signed_by_an_untrusted_key", SignatureError, "no trusted key"),
        ("signature_stripped", SignatureError, "not signed"),
        ("version_raised_after_signing", SignatureError, "tampered"),
        ("expired", ExpiredError, "expired"),
    ],
)
def test_a_manifest_that_does_not_verify_is_refused_and_nothing_is_stored(
    cdn: Cdn, attack: str, error: type[Exception], message: str
) -> None:
    good = make_manifest_doc(KEY, "mnist", 1, BLOB)
    doc = {
        "signed_by_an_untrusted_key": lambda: make_manifest_doc(OTHER_KEY, "mnist", 1, BLOB),
        "signature_stripped": lambda: {"signed": good["signed"], "signatures": []},
        "version_raised_after_signing": lambda: {
            **good,
            "signed": {**good["signed"], "version": 9},
        },
        "expired": lambda: expired_manifest(KEY, "mnist", 1, BLOB),
    }[attack]()
    with pytest.raises(error, match=message):
        add_version(cdn.registry, cdn.store, doc, trusted_keys=TRUSTED, blobs={digest(BLOB): BLOB})
    assert cdn.registry.list_models() == []
    assert cdn.blobs_on_disk() == set()


def test_without_trusted_keys_an_expired_manifest_is_still_refused(cdn: Cdn) -> None:
    cdn.store.put(BLOB)
    doc = expired_manifest(KEY, "mnist", 1, BLOB)
    with pytest.raises(DocumentRejectedError, match="the manifest expired at"):
        add_version(cdn.registry, cdn.store, doc, trusted_keys=None)
    assert cdn.registry.list_models() == []


def test_a_manifest_whose_blob_is_not_in_the_store_is_refused(cdn: Cdn) -> None:
    doc = make_manifest_doc(KEY, "mnist", 1, b"never uploaded")
    with pytest.raises(DocumentRejectedError, match=r"not in the store: PUT /v1/blobs/sha256:"):
        add_version(cdn.registry, cdn.store, doc, trusted_keys=TRUSTED)
    assert cdn.registry.list_models() == []


def test_blob_bytes_that_do_not_match_their_digest_are_refused_and_not_stored(
    cdn: Cdn,
) -> None:
    doc = make_manifest_doc(KEY, "mnist", 1, BLOB)
    with pytest.raises(DocumentRejectedError, match="have the digest"):
        add_version(
            cdn.registry, cdn.store, doc, trusted_keys=TRUSTED, blobs={digest(BLOB): b"evil"}
        )
    assert cdn.blobs_on_disk() == set()
    assert cdn.registry.list_models() == []


def test_a_blob_the_manifest_does_not_name_is_refused(cdn: Cdn) -> None:
    doc = make_manifest_doc(KEY, "mnist", 1, BLOB)
    stray = b"something else"
    with pytest.raises(DocumentRejectedError, match="not named by the manifest"):
        add_version(
            cdn.registry,
            cdn.store,
            doc,
            trusted_keys=TRUSTED,
            blobs={digest(BLOB): BLOB, digest(stray): stray},
        )
    assert cdn.blobs_on_disk() == set()


def test_a_blob_named_by_a_crafted_digest_is_refused(cdn: Cdn) -> None:
    doc = make_manifest_doc(KEY, "mnist", 1, BLOB)
    with pytest.raises(InvalidNameError, match="sha256:<64 hex>"):
        add_version(
            cdn.registry, cdn.store, doc, trusted_keys=TRUSTED, blobs={"../../etc/passwd": BLOB}
        )


def test_a_version_not_above_the_latest_is_a_conflict(cdn: Cdn) -> None:
    cdn.store.put(BLOB)
    add_version(
        cdn.registry, cdn.store, make_manifest_doc(KEY, "mnist", 2, BLOB), trusted_keys=TRUSTED
    )
    for version in (2, 1):
        again = make_manifest_doc(KEY, "mnist", version, BLOB, note="again")
        with pytest.raises(VersionConflictError, match="not above the latest version 2"):
            add_version(cdn.registry, cdn.store, again, trusted_keys=TRUSTED)
    assert "note" not in cdn.registry.get_version("mnist").manifest["signed"]


def test_a_manifest_for_another_model_than_asked_is_refused(cdn: Cdn) -> None:
    cdn.store.put(BLOB)
    doc = make_manifest_doc(KEY, "other", 1, BLOB)
    with pytest.raises(DocumentRejectedError, match="for model 'other', not 'mnist'"):
        add_version(cdn.registry, cdn.store, doc, trusted_keys=TRUSTED, name="mnist")
    assert cdn.registry.list_models() == []


def test_a_document_that_is_not_an_object_is_a_clear_error(cdn: Cdn) -> None:
    for keys in (TRUSTED, None):
        with pytest.raises(ValueError, match="signed manifest is an object"):
            add_version(cdn.registry, cdn.store, [1, 2], trusted_keys=keys)  # type: ignore[arg-type]


def test_a_deleted_version_is_gone_and_its_number_spent(cdn: Cdn) -> None:
    cdn.store.put(BLOB)
    for v in (1, 2):
        add_version(
            cdn.registry, cdn.store, make_manifest_doc(KEY, "mnist", v, BLOB), trusted_keys=TRUSTED
        )
    delete_version(cdn.registry, "mnist", 2)
    assert cdn.registry.get_version("mnist").version == 1
    with pytest.raises(ModelNotFoundError):
        delete_version(cdn.registry, "mnist", 2)
    with pytest.raises(VersionConflictError):
        add_version(
            cdn.registry, cdn.store, make_manifest_doc(KEY, "mnist", 2, BLOB), trusted_keys=TRUSTED
        )
    with pytest.raises(InvalidNameError):
        delete_version(cdn.registry, "mnist", 0)


# -- assign_version ---------------------------------------------------------------


@pytest.fixture
def published(cdn: Cdn) -> Cdn:
    cdn.store.put(BLOB)
    add_version(
        cdn.registry, cdn.store, make_manifest_doc(KEY, "mnist", 1, BLOB), trusted_keys=TRUSTED
    )
    return cdn


def test_without_a_sender_an_assignment_is_stored_for_polling_devices(published: Cdn) -> None:
    doc = make_assignment_doc(KEY, "cam-1", "mnist", 1)
    result = assign_version(published.registry, None, "cam-1", "mnist", doc, trusted_keys=TRUSTED)
    assert result.to_dict() == {
        "device": "cam-1",
        "model": "mnist",
        "version": 1,
        "published": False,
    }
    assert published.registry.get_assignment("cam-1", "mnist") == doc
    # a sender without a link (no broker) is the same
    again = assign_version(
        published.registry, AssignmentSender(), "cam-1", "mnist", doc, trusted_keys=TRUSTED
    )
    assert again.published is False


@pytest.mark.parametrize(
    ("device", "doc", "error", "message"),
    [
        (
            "cam-2",
            make_assignment_doc(KEY, "cam-1", "mnist", 1),
            DocumentRejectedError,
            "not cam-2/mnist",
        ),
        (
            "cam-1",
            make_assignment_doc(KEY, "cam-1", "mnist", 9),
            ModelNotFoundError,
            "no version mnist@9",
        ),
        (
            "cam-1",
            make_assignment_doc(OTHER_KEY, "cam-1", "mnist", 1),
            SignatureError,
            "no trusted key",
        ),
        ("../cam-1", make_assignment_doc(KEY, "cam-1", "mnist", 1), InvalidNameError, "device id"),
    ],
)
def test_an_assignment_that_cannot_be_right_is_refused_and_not_stored(
    published: Cdn, device: str, doc: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        assign_version(published.registry, None, device, "mnist", doc, trusted_keys=TRUSTED)
    assert published.registry.get_assignment("cam-1", "mnist") is None
    assert published.registry.get_assignment("cam-2", "mnist") is None


def test_an_assignment_with_a_sender_is_stored_and_published_retained(
    published: Cdn, mosquitto: MosquittoProcess
) -> None:
    topics = Topics("ops-test/v1")
    doc = make_assignment_doc(KEY, "cam-3", "mnist", 1)
    with AssignmentSender.connect(MqttSettings.from_url(mosquitto.url), topics) as sender:
        result = assign_version(
            published.registry, sender, "cam-3", "mnist", doc, trusted_keys=TRUSTED
        )
    assert result.published is True
    assert published.registry.get_assignment("cam-3", "mnist") == doc
    message = receive_retained(mosquitto.url, topics.assign("cam-3"))
    assert message.retain
    assert json.loads(message.payload) == doc
    assert verify_assignment(message.payload, TRUSTED).device == "cam-3"
