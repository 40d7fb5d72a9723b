"""The device-side updater doing its job: real HTTP on loopback, real Mosquitto, real ONNX.

Each test starts from a provisioned device (v1 installed and committed) and a
CDN holding signed versions; the attacks live in ``test_updater_attacks``.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_agent import DownloadSettings, ModelUpdater, StoreError
from edge_agent.updater import CdnClient
from shared import (
    MAX_BLOB_BYTES,
    CdnPaths,
    ConfigError,
    MqttSettings,
    SigningKey,
    UpdateState,
    compress_blob,
    digest,
    sign_document,
)

from ._brokers import MosquittoProcess, free_port
from ._test_cdn import BlobFault, LoopbackCdn
from ._update_kit import MODEL, SAMPLE, Published, Rig, StatusProbe, Traffic, wait_until


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    cdn = LoopbackCdn()
    try:
        yield Rig.create(cdn, tmp_path, device=f"dev-{request.node.name[5:40].replace('[', '-')}")
    finally:
        cdn.close()


@pytest.fixture
def probe(rig: Rig, mosquitto: MosquittoProcess) -> Iterator[StatusProbe]:
    probe = StatusProbe(mosquitto, rig.device)
    yield probe
    probe.close()


def broker(mosquitto: MosquittoProcess) -> MqttSettings:
    return MqttSettings.from_url(mosquitto.url)


def serving(updater: ModelUpdater) -> tuple[str, np.ndarray]:
    runtime = updater.agent.runtime
    assert runtime is not None
    return runtime.version, runtime.run({"x": SAMPLE})["logits"]


def test_retained_assignment_swaps_the_model_under_live_traffic(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    v2 = rig.publisher.publish(2)
    probe.assign(rig.publisher.assignment(rig.device, 2))  # retained before the device connects
    agent = rig.agent()
    with Traffic(agent) as traffic:
        wait_until(lambda: len(traffic.answers) >= 20, 20, "answers from v1")
        with rig.updater(agent, mqtt=broker(mosquitto)):
            installed = probe.wait_for(UpdateState.INSTALLED, UpdateState.FAILED)
            seen = len(traffic.answers)
            wait_until(lambda: len(traffic.answers) >= seen + 20, 20, "answers after the swap")

    assert installed.state is UpdateState.INSTALLED, installed.reason
    assert installed.running_version == 2 and installed.rollout == "r-test"
    assert probe.states() == ["downloading", "verifying", "installed"]
    assert traffic.errors == []
    assert len(traffic.answers) == traffic.calls == agent.stats.requests  # nothing dropped
    versions = traffic.versions()
    switch = versions.index("lin@2")
    assert switch > 0 and set(versions[:switch]) == {"lin@1"}
    assert set(versions[switch:]) == {"lin@2"}
    expected = {"lin@1": rig.v1.expected(), "lin@2": v2.expected()}
    assert not np.allclose(expected["lin@1"], expected["lin@2"], atol=1e-3)
    for version, output in traffic.answers:
        np.testing.assert_allclose(output, expected[version], atol=1e-4)
    pointer = rig.pointer()
    assert pointer is not None and (pointer.version, pointer.previous) == (2, 1)
    assert pointer.trust.highest_accepted == 2


def test_download_resumes_after_a_dropped_connection(rig: Rig) -> None:
    v2 = rig.publisher.publish(2)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    rig.cdn.fault(v2.blob_digest, BlobFault(drop_after=100))
    updater = rig.updater(rig.agent())

    status = updater.check_now()

    assert status is not None and status.state is UpdateState.INSTALLED, status
    first, second = rig.cdn.blob_requests(v2.blob_digest)
    assert (first.status, first.sent, first.range) == (200, 100, None)
    assert (second.status, second.range, second.if_range) == (
        206,
        "bytes=100-",
        f'"{v2.blob_digest}"',
    )
    assert updater.stats.resumed == 1 and updater.stats.restarted == 0
    assert updater.stats.blob_bytes_read == len(v2.blob)  # nothing fetched twice
    version, logits = serving(updater)
    assert version == "2"
    np.testing.assert_allclose(logits, v2.expected(), atol=1e-4)


def test_resumes_a_partial_download_left_by_a_previous_run(rig: Rig) -> None:
    v2 = rig.publisher.publish(2)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    partial = rig.store_dir / MODEL / ".partial" / f"{v2.blob_digest[7:]}.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(v2.blob[:150])
    partial.with_name(partial.name + ".etag").write_text(f'"{v2.blob_digest}"')
    updater = rig.updater(rig.agent())

    status = updater.check_now()

    assert status is not None and status.state is UpdateState.INSTALLED, status
    (only,) = rig.cdn.blob_requests(v2.blob_digest)
    assert (only.status, only.range) == (206, "bytes=150-")
    assert updater.stats.blob_bytes_read == len(v2.blob) - 150
    assert not partial.exists()


@pytest.mark.parametrize("method", ["zstd-patch", "zstd-bytediff"])
def test_delta_from_the_installed_version_is_used_when_smaller(rig: Rig, method: str) -> None:
    v2 = rig.publisher.publish(
        2, seed=1, bias_shift=0.75, deltas_from=[rig.v1], delta_method=method
    )
    (delta,) = v2.document["signed"]["deltas"]
    assert delta["size"] < len(v2.blob) and delta["compression"] == method
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    updater = rig.updater(rig.agent())

    status = updater.check_now()

    assert status is not None and status.state is UpdateState.INSTALLED, status
    assert len(rig.cdn.blob_requests(delta["digest"])) == 1
    assert rig.cdn.blob_requests(v2.blob_digest) == []
    assert updater.stats.delta_installs == 1
    assert updater.stats.blob_bytes_read == delta["size"]
    version, logits = serving(updater)
    assert version == "2"
    np.testing.assert_allclose(logits, v2.expected(), atol=1e-4)


def _with_delta(rig: Rig, version: int, delta: bytes, method: str) -> Published:
    """Version ``version`` signed with one delta from v1 of the given bytes and method."""
    published = rig.publisher.build(version, seed=1, bias_shift=0.75)
    signed = dict(published.document["signed"])
    ref = {"from_version": 1, "digest": digest(delta), "size": len(delta), "compression": method}
    signed["deltas"] = [ref]
    published.document = sign_document(signed, rig.publisher.key)
    rig.cdn.put_blob(digest(delta), delta)
    rig.publisher.upload(published)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, version))
    return published


@pytest.mark.parametrize("case", ["unknown method", "bytediff bomb", "bytediff short"])
def test_a_delta_the_device_cannot_use_falls_back_to_the_full_blob(rig: Rig, case: str) -> None:
    if case == "unknown method":  # a newer publisher's method: skipped, not even downloaded
        delta, method = compress_blob(b"whatever"), "zstd-xdelta9"
    elif case == "bytediff bomb":  # 8 MiB of zeros in 273 B: cut at raw_size + 1
        delta, method = compress_blob(bytes(8 * 2**20)), "zstd-bytediff"
    else:  # expands to fewer bytes than the model has
        delta, method = compress_blob(b"\0" * 10), "zstd-bytediff"
    v2 = _with_delta(rig, 2, delta, method)
    updater = rig.updater(rig.agent())

    status = updater.check_now()

    assert status is not None and status.state is UpdateState.INSTALLED, status
    assert len(rig.cdn.blob_requests(digest(delta))) == (0 if case == "unknown method" else 1)
    assert len(rig.cdn.blob_requests(v2.blob_digest)) == 1
    assert updater.stats.delta_installs == 0
    version, logits = serving(updater)
    assert version == "2"
    np.testing.assert_allclose(logits, v2.expected(), atol=1e-4)


def test_polls_the_cdn_when_mqtt_is_not_configured(tmp_path: Path) -> None:
    cdn = LoopbackCdn(token="read-me")
    try:
        rig = Rig.create(cdn, tmp_path, device="dev-polling")
        v2 = rig.publisher.publish(2)
        cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
        with pytest.raises(urllib.error.HTTPError) as refused:  # the token is checked
            urllib.request.urlopen(f"{cdn.url}/v1/models/{MODEL}/manifest", timeout=5)
        refused.value.close()
        assert refused.value.code == 401
        agent = rig.agent()
        with rig.updater(agent, poll_interval_s=0.1, read_token="read-me") as updater:
            final = (UpdateState.INSTALLED, UpdateState.FAILED)
            wait_until(lambda: getattr(updater.status, "state", None) in final, 20, "the update")
            assert updater.status is not None
            assert updater.status.state is UpdateState.INSTALLED, updater.status
            wait_until(lambda: updater.stats.polls >= 3, 20, "more polls")
        assert [r.state for r in updater.reports] == [
            UpdateState.DOWNLOADING,
            UpdateState.VERIFYING,
            UpdateState.INSTALLED,
        ]  # later polls see the same assignment and leave it be
        np.testing.assert_allclose(serving(updater)[1], v2.expected(), atol=1e-4)
    finally:
        cdn.close()


def test_polls_the_cdn_while_the_broker_is_unreachable(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.publisher.publish(2)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    dead = MqttSettings(port=free_port(), protocol="3.1.1", connect_timeout_s=0.2)
    with (
        caplog.at_level(logging.WARNING, logger="tandem.edge.updater"),
        rig.updater(rig.agent(), mqtt=dead, poll_interval_s=0.1) as updater,
    ):
        wait_until(
            lambda: getattr(updater.status, "state", None) is UpdateState.INSTALLED,
            20,
            "installed via polling",
        )
    assert updater.running_version == 2
    assert updater.stats.polls >= 1
    said = [
        r.getMessage()
        for r in caplog.records
        if "polling the CDN for assignments" in r.getMessage()
    ]
    assert len(said) == 1, said  # why MQTT is down, once, not at every poll
    assert said[0].startswith(f"updater: cannot reach the MQTT broker at {dead.url}: ")


def test_restart_bootstraps_the_committed_version_else_the_previous(rig: Rig) -> None:
    v2 = rig.publisher.publish(2)
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    status = rig.updater(rig.agent()).check_now()
    assert status is not None and status.state is UpdateState.INSTALLED, status
    keys = [rig.key.public_key]

    runtime = ModelUpdater.bootstrap(rig.store_dir, keys, MODEL)
    assert runtime is not None and runtime.version == "2"
    np.testing.assert_allclose(runtime.run({"x": SAMPLE})["logits"], v2.expected(), atol=1e-4)

    model_file = rig.store_dir / MODEL / "2" / "model.onnx"  # bit rot in the current version
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    model_file.write_bytes(bytes(data))
    runtime = ModelUpdater.bootstrap(rig.store_dir, keys, MODEL)
    assert runtime is not None and runtime.version == "1"
    np.testing.assert_allclose(runtime.run({"x": SAMPLE})["logits"], rig.v1.expected(), atol=1e-4)

    stranger = [SigningKey.generate().public_key]  # manifests re-checked with the pinned key
    assert ModelUpdater.bootstrap(rig.store_dir, stranger, MODEL) is None
    assert ModelUpdater.bootstrap(tmp_empty := rig.store_dir.parent / "empty", keys, MODEL) is None
    assert not tmp_empty.exists()


def test_signed_rollback_installs_the_lower_version_and_reports_rolled_back(
    rig: Rig, probe: StatusProbe, mosquitto: MosquittoProcess
) -> None:
    rig.publisher.publish(2)
    agent = rig.agent()
    with rig.updater(agent, mqtt=broker(mosquitto)) as updater:
        probe.assign(rig.publisher.assignment(rig.device, 2))
        probe.wait_for(UpdateState.INSTALLED, UpdateState.FAILED)
        assert updater.running_version == 2
        probe.assign(rig.publisher.assignment(rig.device, 1, rollback=True))
        rolled = probe.wait_for(UpdateState.ROLLED_BACK, UpdateState.FAILED)

    assert rolled.state is UpdateState.ROLLED_BACK, rolled.reason
    assert rolled.version == 1 and rolled.running_version == 1
    assert probe.states() == ["downloading", "verifying", "installed"] * 1 + [
        "downloading",
        "verifying",
        "rolled-back",
    ]
    assert updater.stats.reused_from_store == 1  # v1 was kept: no download
    assert len(rig.cdn.blob_requests(rig.v1.blob_digest)) == 0
    version, logits = serving(updater)
    assert version == "1"
    np.testing.assert_allclose(logits, rig.v1.expected(), atol=1e-4)
    pointer = rig.pointer()
    assert pointer is not None and (pointer.version, pointer.previous) == (1, 2)
    assert pointer.trust.highest_accepted == 2  # a rollback does not lower the bar


def test_a_signed_raw_digest_is_checked_at_install_and_at_boot(rig: Rig) -> None:
    honest = rig.publisher.build(2)
    v2 = rig.publisher.publish(2, raw_digest=digest(honest.raw))
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 2))
    status = rig.updater(rig.agent()).check_now()
    assert status is not None and status.state is UpdateState.INSTALLED, status
    keys = [rig.key.public_key]
    (rig.store_dir / MODEL / "2" / "install.json").write_text("{}")  # the signed digest rules
    runtime = ModelUpdater.bootstrap(rig.store_dir, keys, MODEL)
    assert runtime is not None and runtime.version == "2"
    np.testing.assert_allclose(runtime.run({"x": SAMPLE})["logits"], v2.expected(), atol=1e-4)

    rig.publisher.publish(3, raw_digest=digest(b"some other model"))
    rig.cdn.put_assignment(rig.device, MODEL, rig.publisher.assignment(rig.device, 3))
    updater = rig.updater(rig.agent())
    status = updater.check_now()
    assert status is not None and status.state is UpdateState.FAILED
    assert "raw_digest" in status.reason and updater.running_version == 2


def test_the_device_asks_for_the_urls_the_cdn_lays_out() -> None:
    """One URL layout (``shared.CdnPaths``) for the CDN's routes and the device's requests."""
    client, paths = CdnClient("https://cdn.example/"), CdnPaths("https://cdn.example")
    blob = digest(b"model bytes")
    assert client.manifest_url(MODEL) == paths.manifest(MODEL)
    assert client.manifest_url(MODEL, 2) == paths.manifest(MODEL, 2)
    assert client.assignment_url("cam-7", MODEL) == paths.assignment("cam-7", MODEL)
    assert client.blob_url(blob) == paths.blob(blob)
    with pytest.raises(StoreError, match="refusing blob digest"):
        client.blob_url("sha256:../../etc/passwd")
    with pytest.raises(ConfigError):
        client.manifest_url("../" + MODEL)
    assert DownloadSettings().max_blob_bytes == MAX_BLOB_BYTES
