"""Attacks on the model update path, one test per attack, named after it.

Each stages the attack against a running device (real Mosquitto, real HTTP
on loopback, real ONNX models) and ends with the device still serving its
previous model, a ``failed`` report on the status topic saying why, and the
store's ``current.json`` unmoved. The ETag test is the exception by design:
there the device must end with the real blob, never a splice of two.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent import DownloadSettings, ModelUpdater, StoreError
from edge_agent.updater import STEPS, DeviceModelStore
from shared import (
    MqttSettings,
    SigningKey,
    UpdateState,
    UpdateStatus,
    compress_blob,
    digest,
    sign_document,
)

from ._brokers import MosquittoProcess
from ._test_cdn import BlobFault, LoopbackCdn
from ._update_kit import MODEL, SAMPLE, Published, Rig, StatusProbe, wait_until

ROOT = Path(__file__).resolve().parents[1]
FINAL = (UpdateState.FAILED, UpdateState.INSTALLED, UpdateState.ROLLED_BACK)


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    cdn = LoopbackCdn()
    try:
        name = request.node.name[5:40].replace("[", "-").replace("]", "")
        yield Rig.create(cdn, tmp_path, device=f"atk-{name}")
    finally:
        cdn.close()


@pytest.fixture
def probe(rig: Rig, mosquitto: MosquittoProcess) -> Iterator[StatusProbe]:
    probe = StatusProbe(mosquitto, rig.device)
    yield probe
    probe.close()


def now() -> datetime:
    return datetime.now(UTC)


def deliver(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess, assignment: bytes
) -> tuple[UpdateStatus, ModelUpdater]:
    """The assignment reaches a running device over MQTT; returns its final report."""
    agent = rig.agent()
    with rig.updater(agent, mqtt=MqttSettings.from_url(mosquitto.url)) as updater:
        probe.assign(assignment)
        report = probe.wait_for(*FINAL)
    return report, updater


def assert_refused(
    report: UpdateStatus, updater: ModelUpdater, rig: Rig, reason: str, keeps: Published
) -> None:
    assert report.state is UpdateState.FAILED, report
    assert reason in report.reason, report.reason
    assert report.running_version == keeps.version
    runtime = updater.agent.runtime
    assert runtime is not None and runtime.version == str(keeps.version)
    logits = runtime.run({"x": SAMPLE})["logits"]
    np.testing.assert_allclose(logits, keeps.expected(), atol=1e-4)
    pointer = rig.pointer()
    assert pointer is not None and pointer.version == keeps.version


def upgrade(rig: Rig, version: int) -> Published:
    """Install ``version`` the honest way (the CDN's assignment, polled once)."""
    published = rig.publisher.publish(version)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, version))
    status = rig.updater(rig.agent()).check_now()
    assert status is not None and status.state is UpdateState.INSTALLED, status
    return published


def files_under(path: Path) -> set[Path]:
    return set(path.rglob("*"))


def test_tampered_blob_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    v2 = rig.publisher.publish(2)
    tampered = bytearray(v2.blob)
    tampered[len(tampered) // 2] ^= 0xFF
    rig.cdn.put_blob(v2.blob_digest, bytes(tampered))

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "does not match its digest", rig.v1)
    assert probe.states() == ["downloading", "verifying", "failed"]


def test_tampered_manifest_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    v2 = rig.publisher.build(2)
    evil = compress_blob(b"not a model")
    forged = copy.deepcopy(v2.document)
    forged["signed"]["blob"].update(digest=digest(evil), size=len(evil))
    rig.cdn.put_manifest(MODEL, 2, json.dumps(forged).encode())
    rig.cdn.put_blob(digest(evil), evil)

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "signature does not match", rig.v1)
    assert rig.cdn.blob_requests(digest(evil)) == []


def test_manifest_signed_by_an_unknown_key_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    rig.publisher.upload(rig.publisher.build(2, keys=[SigningKey.generate()]))

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "signed by no trusted key", rig.v1)


def test_unsigned_manifest_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    v2 = rig.publisher.publish(2)
    unsigned = dict(v2.document, signatures=[])
    rig.cdn.put_manifest(MODEL, 2, json.dumps(unsigned).encode())

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "not signed", rig.v1)


def test_assignment_signed_by_an_unknown_key_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    rig.publisher.publish(2)
    forged = rig.publisher.assignment(rig.device, 2, key=SigningKey.generate())

    report, updater = deliver(rig, probe, mosquitto, forged)

    assert_refused(report, updater, rig, "assignment refused: signed by no trusted key", rig.v1)
    assert probe.states() == ["failed"]  # nothing fetched on an untrusted order


def test_replayed_older_assignment_is_refused_rollback_attack(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    old = rig.publisher.assignment(rig.device, 1, issued_at=now() - timedelta(hours=2))
    v2 = upgrade(rig, 2)

    report, updater = deliver(rig, probe, mosquitto, old)

    assert_refused(report, updater, rig, "below the highest accepted 2", v2)


def test_replayed_old_rollback_order_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    old_rollback = rig.publisher.assignment(
        rig.device, 1, rollback=True, issued_at=now() - timedelta(hours=2)
    )
    v2 = upgrade(rig, 2)

    report, updater = deliver(rig, probe, mosquitto, old_rollback)

    assert_refused(report, updater, rig, "a replay", v2)


def test_old_manifest_served_for_a_new_version_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    rig.cdn.put_manifest(MODEL, 2, rig.v1.signed)  # signed, valid, but for version 1

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "describes lin@1", rig.v1)


@pytest.mark.parametrize("document", ["manifest", "assignment"])
def test_expired_document_is_refused_freeze_attack(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess, document: str
) -> None:
    long_ago, yesterday = now() - timedelta(days=3), now() - timedelta(days=1)
    if document == "manifest":
        rig.publisher.publish(2, published_at=long_ago, expires_at=yesterday)
        assignment = rig.publisher.assignment(rig.device, 2)
    else:
        rig.publisher.publish(2)
        assignment = rig.publisher.assignment(
            rig.device, 2, issued_at=long_ago, expires_at=yesterday
        )

    report, updater = deliver(rig, probe, mosquitto, assignment)

    assert_refused(report, updater, rig, "expired", rig.v1)


def test_assignment_for_another_device_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    rig.publisher.publish(2)
    theirs = rig.publisher.assignment("someone-else", 2)

    report, updater = deliver(rig, probe, mosquitto, theirs)

    assert_refused(report, updater, rig, "for device 'someone-else'", rig.v1)


def test_endless_blob_download_stops_at_the_declared_length(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    v2 = rig.publisher.publish(2)
    rig.cdn.fault(v2.blob_digest, BlobFault(endless=True))

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "sent more than the", rig.v1)
    assert updater.stats.blob_bytes_read <= len(v2.blob) + DownloadSettings().chunk_bytes
    partial = DeviceModelStore(rig.store_dir).partial_path(MODEL, v2.blob_digest)
    assert not partial.exists()


@pytest.mark.parametrize("server", ["honours-if-range", "ignores-if-range"])
def test_etag_change_during_a_resumed_download_restarts_never_splices(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess, server: str
) -> None:
    v2 = rig.publisher.publish(2)
    stale = bytes(reversed(v2.blob))  # same length, other bytes: a splice would not verify
    rig.cdn.fault(
        v2.blob_digest,
        BlobFault(drop_after=100, first_body=stale, ignore_if_range=server == "ignores-if-range"),
    )

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert report.state is UpdateState.INSTALLED, report.reason
    requests = rig.cdn.blob_requests(v2.blob_digest)
    assert (requests[0].status, requests[0].sent) == (200, 100)
    assert (requests[1].range, requests[1].if_range) == ("bytes=100-", '"stale"')
    if server == "ignores-if-range":  # a 206 of another ETag is dropped unread
        assert requests[1].status == 206 and len(requests) == 3
    assert (requests[-1].status, requests[-1].range) in ((200, None), (200, "bytes=100-"))
    assert updater.stats.restarted == 1 and updater.stats.resumed == 0
    runtime = updater.agent.runtime
    assert runtime is not None and runtime.version == "2"
    np.testing.assert_allclose(runtime.run({"x": SAMPLE})["logits"], v2.expected(), atol=1e-4)


def test_path_traversal_in_the_model_name_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    evil = rig.publisher.assignment(rig.device, 2, model="../../etc")
    before = files_under(tmp_path)

    report, updater = deliver(rig, probe, mosquitto, evil)

    assert_refused(report, updater, rig, "not a valid name", rig.v1)
    assert files_under(tmp_path) == before
    store = DeviceModelStore(rig.store_dir)
    for name in ("../../etc", "..", "a/b", "/etc"):
        with pytest.raises(StoreError):
            store.model_dir(name)


def test_path_traversal_in_the_blob_digest_is_refused(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess, tmp_path: Path
) -> None:
    v2 = rig.publisher.build(2)
    signed = copy.deepcopy(v2.document["signed"])
    signed["blob"]["digest"] = "sha256:../../../../escape"
    rig.cdn.put_manifest(MODEL, 2, json.dumps(sign_document(signed, rig.key)).encode())
    before = files_under(tmp_path)

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "blob.digest must be", rig.v1)
    assert files_under(tmp_path) == before
    assert not any("/v1/blobs/" in r.path for r in rig.cdn.requests if "escape" in r.path)
    with pytest.raises(StoreError):
        DeviceModelStore(rig.store_dir).partial_path(MODEL, "sha256:../..")


def test_model_failing_its_smoke_test_is_never_served(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    rig.publisher.publish(2, smoke_outputs_off=True)  # signed, but the model disagrees

    report, updater = deliver(rig, probe, mosquitto, rig.publisher.assignment(rig.device, 2))

    assert_refused(report, updater, rig, "smoke test", rig.v1)
    assert not (rig.store_dir / MODEL / "2").exists()


def run_device(
    rig: Rig, workdir: Path, mosquitto: MosquittoProcess, block_at: str | None
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    events, marker = workdir / f"events-{block_at}.jsonl", workdir / f"marker-{block_at}"
    config = {
        "store_dir": str(rig.store_dir),
        "model": MODEL,
        "device": rig.device,
        "cdn_url": rig.cdn.url,
        "public_key": rig.key.public_key.to_text(),
        "mqtt_port": mosquitto.port,
        "sample": SAMPLE.tolist(),
        "events": str(events),
        "marker": str(marker),
        "block_at": block_at,
    }
    log = (workdir / f"device-{block_at}.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests._updating_device", json.dumps(config)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return process, events, marker


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_update_step_restarts_on_a_verified_model(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess, tmp_path: Path, step: str
) -> None:
    v2 = rig.publisher.publish(2)
    probe.assign(rig.publisher.assignment(rig.device, 2))
    expected = {"1": rig.v1.expected(), "2": v2.expected()}

    process, events, marker = run_device(rig, tmp_path, mosquitto, block_at=step)
    try:
        wait_until(
            lambda: marker.exists() or process.poll() is not None, 60, f"the device to reach {step}"
        )
        assert marker.exists(), (tmp_path / f"device-{step}.log").read_text()[-3000:]
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    assert process.returncode == -signal.SIGKILL

    process, events, _ = run_device(rig, tmp_path, mosquitto, block_at=None)
    try:
        process.wait(90)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
    log = (tmp_path / "device-None.log").read_text()[-3000:]
    booted, updated = read_events(events)
    assert booted["version"] in expected, log  # the old or the new, never a broken one
    np.testing.assert_allclose(booted["logits"], expected[str(booted["version"])], atol=1e-4)
    assert updated["state"] == "installed", (updated, log)
    assert updated["version"] == "lin@2"
    np.testing.assert_allclose(updated["logits"], v2.expected(), atol=1e-4)
    # Nothing verified is fetched twice: a complete download or install survives the crash.
    assert len(rig.cdn.blob_requests(v2.blob_digest)) == 1
    left = {p.name for p in (rig.store_dir / MODEL).iterdir()}
    assert left == {"1", "2", "current.json"}, left  # no half-written leftovers
