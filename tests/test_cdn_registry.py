"""The registry keeps its invariants on SQLite and on a real PostgreSQL.

Versions only grow (a deleted version number is never reused), concurrent
publishers of the same version end with exactly one winner (threads sharing a
registry object, and separate processes each with their own), unknown
models are ``ModelNotFoundError``, an assignment per (device, model) is
replaced, and a stored manifest comes back as the very document signed.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from model_cdn import (
    InvalidNameError,
    ModelNotFoundError,
    RegistryError,
    VersionConflictError,
)
from model_cdn.registry import Registry, SqliteRegistry, open_registry
from shared import ManifestError, SigningKey, verify_assignment, verify_manifest

from ._cdn import make_assignment_doc, make_manifest_doc

KEY = SigningKey(bytes(range(32)))
VERSIONS = 5


def test_versions_only_grow_even_past_deleted_ones(registry: Registry) -> None:
    registry.add_version(make_manifest_doc(KEY, "mnist", 1))
    registry.add_version(make_manifest_doc(KEY, "mnist", 2))
    for stale in (1, 2):
        with pytest.raises(VersionConflictError, match="not above the latest version 2"):
            registry.add_version(make_manifest_doc(KEY, "mnist", stale))
    registry.delete_version("mnist", 2)
    assert registry.get_version("mnist").version == 1
    with pytest.raises(VersionConflictError):  # the number 2 is spent for good
        registry.add_version(make_manifest_doc(KEY, "mnist", 2, note="different bytes"))
    registry.add_version(make_manifest_doc(KEY, "mnist", 7))  # gaps are fine
    assert [r.version for r in registry.list_versions("mnist")] == [1, 7]
    assert registry.get_version("mnist").version == 7
    assert registry.get_version("mnist", 1).version == 1


def test_a_stored_manifest_is_the_signed_document(registry: Registry) -> None:
    doc = make_manifest_doc(KEY, "kws", 3, labels_note="ünïcode ok", score=0.1 + 0.2)
    record = registry.add_version(doc)
    again = registry.get_version("kws", 3)
    assert record == again
    assert again.manifest == doc
    assert again.blob_digest == doc["signed"]["blob"]["digest"]
    assert again.published_at == doc["signed"]["published_at"]
    assert verify_manifest(again.manifest, [KEY.public_key]).version == 3


def test_models_are_listed_by_name(registry: Registry) -> None:
    assert registry.list_models() == []
    registry.add_version(make_manifest_doc(KEY, "zeta", 1))
    registry.add_version(make_manifest_doc(KEY, "alpha", 1))
    assert registry.list_models() == ["alpha", "zeta"]


def test_missing_models_and_versions_are_model_not_found(registry: Registry) -> None:
    registry.add_version(make_manifest_doc(KEY, "mnist", 1))
    with pytest.raises(ModelNotFoundError):
        registry.get_version("nope")
    with pytest.raises(ModelNotFoundError):
        registry.get_version("mnist", 2)
    with pytest.raises(ModelNotFoundError):
        registry.list_versions("nope")
    with pytest.raises(ModelNotFoundError):
        registry.delete_version("mnist", 2)
    registry.delete_version("mnist", 1)
    with pytest.raises(ModelNotFoundError):
        registry.get_version("mnist")  # no version left


def test_assignments_are_replaced_not_duplicated(registry: Registry) -> None:
    assert registry.get_assignment("cam-1", "mnist") is None
    first = make_assignment_doc(KEY, "cam-1", "mnist", 2)
    registry.put_assignment("cam-1", "mnist", first)
    assert registry.get_assignment("cam-1", "mnist") == first
    back = make_assignment_doc(KEY, "cam-1", "mnist", 1, rollback=True)
    registry.put_assignment("cam-1", "mnist", back)
    got = registry.get_assignment("cam-1", "mnist")
    assert got == back
    assert verify_assignment(got, [KEY.public_key]).rollback
    assert registry.get_assignment("cam-2", "mnist") is None


def test_an_assignment_filed_under_another_device_is_refused(registry: Registry) -> None:
    with pytest.raises(InvalidNameError, match="cam-1/mnist, not cam-2/mnist"):
        registry.put_assignment("cam-2", "mnist", make_assignment_doc(KEY, "cam-1", "mnist", 1))
    assert registry.get_assignment("cam-2", "mnist") is None


@pytest.mark.parametrize("name", ["../etc", "a/b", "", "..", "x" * 200, "-lead"])
def test_path_like_names_never_reach_the_database(registry: Registry, name: str) -> None:
    with pytest.raises(InvalidNameError):
        registry.get_version(name)
    with pytest.raises(InvalidNameError):
        registry.get_assignment(name, "mnist")


def test_documents_that_are_not_signed_manifests_are_refused(registry: Registry) -> None:
    doc = make_manifest_doc(KEY, "mnist", 1)
    bad_documents: list[dict[str, Any]] = [
        {"signed": doc["signed"]},
        doc["signed"],
        {"signed": {}, "signatures": []},
    ]
    for bad in bad_documents:
        with pytest.raises(ManifestError):
            registry.add_version(bad)
    assert registry.list_models() == []


def test_concurrent_threads_publishing_the_same_versions_have_one_winner_each(
    registry: Registry,
) -> None:
    publishers = 6
    barrier = threading.Barrier(publishers)

    def publish(publisher: int) -> list[int]:
        barrier.wait()
        won = []
        for version in range(1, VERSIONS + 1):
            doc = make_manifest_doc(KEY, "race", version, publisher=publisher)
            try:
                registry.add_version(doc)
                won.append(version)
            except VersionConflictError:
                pass
        return won

    with ThreadPoolExecutor(publishers) as pool:
        results = list(pool.map(publish, range(publishers)))
    _check_one_winner_each(registry, results)


def _publish_in_a_process(url: str, publisher: int, start: object) -> list[int]:
    """Runs in a spawned process with its own registry connection."""
    reg = open_registry(url)
    try:
        start.wait()  # type: ignore[attr-defined]
        won = []
        for version in range(1, VERSIONS + 1):
            try:
                reg.add_version(make_manifest_doc(KEY, "race", version, publisher=publisher))
                won.append(version)
            except VersionConflictError:
                pass
        return won
    finally:
        reg.close()


def test_concurrent_processes_publishing_the_same_versions_have_one_winner_each(
    registry: Registry, registry_url: str
) -> None:
    publishers = 4
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Event()
        with context.Pool(publishers) as pool:
            pending = [
                pool.apply_async(_publish_in_a_process, (registry_url, p, start))
                for p in range(publishers)
            ]
            start.set()
            results = [p.get(timeout=90) for p in pending]
    _check_one_winner_each(registry, results)


def _check_one_winner_each(registry: Registry, results: list[list[int]]) -> None:
    won = sorted(v for r in results for v in r)
    assert won == list(range(1, VERSIONS + 1)), results  # each version won exactly once
    stored = registry.list_versions("race")
    assert [r.version for r in stored] == list(range(1, VERSIONS + 1))
    for record in stored:  # and what is stored is the winner's document
        winner = next(p for p, r in enumerate(results) if record.version in r)
        assert record.manifest["signed"]["publisher"] == winner


def test_sqlite_registry_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "registry.db"
    first = SqliteRegistry(path)
    first.add_version(make_manifest_doc(KEY, "mnist", 4))
    first.close()
    with pytest.raises(RegistryError, match="closed"):
        first.get_version("mnist")
    second = open_registry(str(path))
    try:
        assert second.get_version("mnist").version == 4
    finally:
        second.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("mysql://db/x", "not supported"),
        ("sqlite://relative.db", "sqlite:///"),
    ],
)
def test_open_registry_explains_a_bad_url(url: str, message: str) -> None:
    with pytest.raises(RegistryError, match=message):
        open_registry(url)


def test_an_unreachable_postgres_is_one_clear_error_without_the_password() -> None:
    with pytest.raises(RegistryError, match=r"cannot connect to PostgreSQL at 127\.0\.0\.1:9") as e:
        open_registry("postgresql://someone:s3cret@127.0.0.1:9/db?connect_timeout=2")
    assert "s3cret" not in str(e.value)
