"""Keys with roles, thresholds and rotation (TUF / Uptane), each test named after its attack.

The pure checks run on ``shared.TrustedRoot`` and the device's ``UpdateTrust``;
the rotation path runs end to end: roots written by ``tandem keys`` (a real
subprocess), served by the real CDN app on loopback, fetched and kept by the
device's ``RootKeeper`` through its real ``CdnClient``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_agent import UntrustedUpdateError
from edge_agent.updater import CdnClient, UpdateTrust
from edge_agent.updater._roots import RootKeeper
from model_cdn import create_app
from model_cdn.registry import SqliteRegistry
from model_cdn.trust_repo import TrustRepository
from shared import (
    ManifestError,
    RootMetadata,
    SignatureError,
    SigningKey,
    TrustedRoot,
    digest,
    format_time,
    sign_root,
)
from shared.server.store import LocalBlobStore

from ._cdn import make_assignment_doc, make_manifest_doc, serve_in_thread
from ._cli import tandem_env

R1, R2, R3, R4 = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3, 4))
P1, P2 = SigningKey(bytes([11]) * 32), SigningKey(bytes([12]) * 32)
A1 = SigningKey(bytes([21]) * 32)


def root(version: int, *, root_keys: tuple[SigningKey, ...] = (R1, R2), root_threshold: int = 2,
         publishers: tuple[SigningKey, ...] = (P1,), publisher_threshold: int = 1,
         expires_at: str | None = None) -> RootMetadata:  # fmt: skip
    return RootMetadata.new(
        version=version,
        roles={
            "root": ([k.public_key for k in root_keys], root_threshold),
            "publisher": ([k.public_key for k in publishers], publisher_threshold),
            "assigner": ([A1.public_key], 1),
        },
        expires_at=expires_at,
    )


def device(*chain: dict[str, Any]) -> TrustedRoot:
    trusted = TrustedRoot.bootstrap(chain[0])
    for document in chain[1:]:
        trusted.update(document)
    return trusted


def update_trust(trust: TrustedRoot | list[Any]) -> UpdateTrust:
    return UpdateTrust(trust, device_id="cam-1", model="mnist")


# -- roles and thresholds ------------------------------------------------------------------


def test_assignment_key_alone_cannot_make_a_device_install_a_model() -> None:
    trust = update_trust(device(sign_root(root(1), R1, R2)))
    assignment = trust.accept_assignment(json.dumps(make_assignment_doc(A1, "cam-1", "mnist", 2)))
    forged = json.dumps(make_manifest_doc(A1, "mnist", 2))  # the online key signs a manifest
    with pytest.raises(UntrustedUpdateError, match="publisher role"):
        trust.accept_manifest(forged, assignment)
    trust.accept_manifest(json.dumps(make_manifest_doc(P1, "mnist", 2)), assignment)  # control
    with pytest.raises(UntrustedUpdateError, match="assigner role"):  # and the other way round
        trust.accept_assignment(json.dumps(make_assignment_doc(P1, "cam-1", "mnist", 2)))


def test_threshold_not_met_is_refused() -> None:
    trusted = device(sign_root(root(1, publishers=(P1, P2), publisher_threshold=2), R1, R2))
    one = make_manifest_doc(P1, "mnist", 1)
    with pytest.raises(SignatureError, match="threshold is 2"):
        trusted.verify_manifest(one)
    twice = {**one, "signatures": one["signatures"] * 2}  # one key signing twice counts once
    with pytest.raises(SignatureError, match="threshold is 2"):
        trusted.verify_manifest(twice)
    both = {
        **one,
        "signatures": one["signatures"] + make_manifest_doc(P2, "mnist", 1)["signatures"],
    }
    assert trusted.verify_manifest(both).version == 1


def test_a_root_signed_by_fewer_than_its_own_threshold_is_not_bootstrapped() -> None:
    with pytest.raises(SignatureError):
        TrustedRoot.bootstrap(sign_root(root(1), R1))


# -- rotation ------------------------------------------------------------------------------


def test_old_publisher_key_is_refused_after_rotation() -> None:
    first = sign_root(root(1), R1, R2)
    trusted = device(first)
    old = make_manifest_doc(P1, "mnist", 3)
    assert trusted.verify_manifest(old).version == 3  # before: the old key signs
    trusted.update(sign_root(root(2, publishers=(P2,)), R1, R2))
    with pytest.raises(SignatureError):
        trusted.verify_manifest(old)
    assert trusted.verify_manifest(make_manifest_doc(P2, "mnist", 3)).version == 3


@pytest.mark.parametrize(
    ("signers", "needle"),
    [
        ((R3, R4), "no trusted key"),  # only the new root's keys: the old root never agreed
        ((R1, R3, R4), "threshold is 2"),  # one of the two old root signatures
        ((R1, R2), "root role"),  # the old root agreed, the new root keys did not
    ],
    ids=["new-keys-only", "one-old-key", "old-keys-only"],
)
def test_rotation_needs_the_old_roots_signatures_and_its_own(
    signers: tuple[SigningKey, ...], needle: str
) -> None:
    trusted = device(sign_root(root(1), R1, R2))
    attack = sign_root(root(2, root_keys=(R3, R4), publishers=(P2,)), *signers)
    with pytest.raises(SignatureError, match=needle):
        trusted.update(attack)
    assert trusted.version == 1  # nothing changed
    trusted.update(sign_root(root(2, root_keys=(R3, R4), publishers=(P2,)), R1, R2, R3, R4))
    assert trusted.version == 2


@pytest.mark.parametrize("version", [1, 3])
def test_a_root_that_replays_or_skips_a_version_is_refused(version: int) -> None:
    trusted = device(sign_root(root(1), R1, R2))
    with pytest.raises(ManifestError, match="does not follow"):
        trusted.update(sign_root(root(version), R1, R2))


def test_an_expired_root_stops_updates_a_freeze_attack() -> None:
    past = format_time(datetime.now(UTC) - timedelta(days=1))
    trust = update_trust(device(sign_root(root(1, expires_at=past), R1, R2)))
    with pytest.raises(UntrustedUpdateError, match="expired"):
        trust.accept_assignment(json.dumps(make_assignment_doc(A1, "cam-1", "mnist", 2)))


def test_a_device_that_pins_one_publisher_key_keeps_working_and_migrates() -> None:
    trust = update_trust([P1.public_key])  # as devices were first provisioned
    assignment = trust.accept_assignment(json.dumps(make_assignment_doc(P1, "cam-1", "mnist", 2)))
    trust.accept_manifest(json.dumps(make_manifest_doc(P1, "mnist", 2)), assignment)
    with pytest.raises(SignatureError):  # root 1 needs the pinned key's consent
        trust.root.update(sign_root(root(1), R1, R2))
    trust.root.update(sign_root(root(1), P1, R1, R2))  # the migration: old key and new root keys
    with pytest.raises(UntrustedUpdateError):  # the publisher key no longer assigns
        trust.accept_assignment(json.dumps(make_assignment_doc(P1, "cam-1", "mnist", 3)))
    trust.accept_assignment(json.dumps(make_assignment_doc(A1, "cam-1", "mnist", 3)))


# -- the rotation path: tandem keys -> CDN -> device ---------------------------------------


def tandem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        cwd=cwd,
        env=tandem_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def keyfiles(tmp_path: Path) -> Path:
    for name, key in {"r1": R1, "r2": R2, "p1": P1, "p2": P2, "a1": A1}.items():
        (tmp_path / f"{name}.key").write_text(key.to_text())
        (tmp_path / f"{name}.pub").write_text(key.public_key.to_text())
    return tmp_path


@pytest.fixture
def cdn_url(keyfiles: Path) -> Iterator[str]:
    registry = SqliteRegistry(keyfiles / "registry.db")
    app = create_app(
        registry=registry,
        store=LocalBlobStore(keyfiles / "blobs"),
        admin_token=None,
        trust_dir=keyfiles / "trust",
    )
    try:
        with serve_in_thread(app) as url:
            yield url
    finally:
        registry.close()


def test_keys_rotated_with_the_cli_reach_the_device_through_the_cdn(
    keyfiles: Path, cdn_url: str
) -> None:
    init = tandem(
        "keys", "root", "init", "--trust-dir", "trust", "--root-key", "r1.pub",
        "--root-key", "r2.pub", "--root-threshold", "2", "--publisher-key", "p1.pub",
        "--assigner-key", "a1.pub", "--sign-with", "r1.key", "--sign-with", "r2.key",
        cwd=keyfiles,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    assert httpx.get(f"{cdn_url}/v1/roots/1.root.json").status_code == 200
    assert httpx.get(f"{cdn_url}/v1/roots/2.root.json").status_code == 404
    first = (keyfiles / "trust" / "1.root.json").read_bytes()

    rotate = ["keys", "rotate", "publisher", "--trust-dir", "trust", "--add-key", "p2.pub",
              "--remove-key", "p1.pub", "--sign-with", "r1.key"]  # fmt: skip
    refused = tandem(*rotate, cwd=keyfiles)  # one root signature of the two needed
    assert refused.returncode == 1 and "threshold is 2" in refused.stderr, refused.stderr
    assert not (keyfiles / "trust" / "2.root.json").exists()
    done = tandem(*rotate, "--sign-with", "r2.key", cwd=keyfiles)
    assert done.returncode == 0, done.stderr

    store = keyfiles / "device"
    keeper = RootKeeper(TrustedRoot.bootstrap(first), store, CdnClient(cdn_url))
    assert keeper.refresh() == 1 and keeper.root.version == 2
    with pytest.raises(SignatureError):
        keeper.root.verify_manifest(make_manifest_doc(P1, "mnist", 1))  # the old key is out
    keeper.root.verify_manifest(make_manifest_doc(P2, "mnist", 1))
    restarted = RootKeeper(TrustedRoot.bootstrap(first), store)  # re-walks what it kept
    assert restarted.root.version == 2


def test_a_forged_root_on_the_cdn_is_refused_by_the_device(keyfiles: Path, cdn_url: str) -> None:
    repo = TrustRepository(keyfiles / "trust")
    repo.init(
        {"root": ([R1.public_key, R2.public_key], 2), "publisher": ([P1.public_key], 1),
         "assigner": ([A1.public_key], 1)},
        [R1, R2],
    )  # fmt: skip
    # Whoever controls the CDN swaps in a root naming their own publisher key.
    forged = sign_root(root(2, root_keys=(R3, R4), publishers=(P2,)), R3, R4)
    (keyfiles / "trust" / "2.root.json").write_text(json.dumps(forged))
    keeper = RootKeeper(
        TrustedRoot.bootstrap(repo.read(1) or b""), keyfiles / "dev", CdnClient(cdn_url)
    )
    assert keeper.refresh() == 0 and keeper.root.version == 1
    assert not (keyfiles / "dev" / "roots" / "2.root.json").exists()
    with pytest.raises(SignatureError):
        keeper.root.verify_manifest(make_manifest_doc(P2, "mnist", 1))


# -- the CDN checks uploads against the roles ------------------------------------------------


def test_the_cdn_takes_manifests_from_the_publisher_role_and_assignments_from_the_assigner(
    tmp_path: Path,
) -> None:
    """With a root in --trust-dir, the online (assigner) key alone cannot upload a model."""
    repo = TrustRepository(tmp_path / "trust")
    repo.add(sign_root(root(1), R1, R2))
    registry = SqliteRegistry(tmp_path / "registry.db")
    app = create_app(
        registry=registry,
        store=LocalBlobStore(tmp_path / "blobs"),
        admin_token="adm",
        trusted_keys=[A1.public_key, P2.public_key],  # the root, not this list, decides
        trust_dir=tmp_path / "trust",
    )
    auth = {"Authorization": "Bearer adm"}
    blob = b"model bytes"
    try:
        with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=auth) as c:
            assert c.put(f"/v1/blobs/{digest(blob)}", content=blob).status_code in (200, 201)
            for signer in (A1, P2):  # assigner; a publisher key the root does not name
                forged = c.post(
                    "/v1/models/mnist/versions", json=make_manifest_doc(signer, "mnist", 1)
                )
                assert forged.status_code == 400 and "sign" in forged.json()["error"], forged.text
            ok = c.post("/v1/models/mnist/versions", json=make_manifest_doc(P1, "mnist", 1))
            assert ok.status_code == 201, ok.text
            path = "/v1/devices/cam-1/assignments/mnist"
            by_publisher = c.put(path, json=make_assignment_doc(P1, "cam-1", "mnist", 1))
            assert by_publisher.status_code == 400, by_publisher.text
            assert c.put(path, json=make_assignment_doc(A1, "cam-1", "mnist", 1)).status_code == 200
            # a rotation to publisher P2 is taken without a restart
            repo.add(sign_root(root(2, publishers=(P2,)), R1, R2))
            old = c.post("/v1/models/mnist/versions", json=make_manifest_doc(P1, "mnist", 2))
            assert old.status_code == 400, old.text
            new = c.post("/v1/models/mnist/versions", json=make_manifest_doc(P2, "mnist", 2))
            assert new.status_code == 201, new.text
    finally:
        registry.close()
