"""One publish path, two targets: the CDN's admin API and a registry and store at hand.

The pipeline makes a release (signed manifest, blob, delta) and hands it to
a target. Through a real CDN server on loopback (uvicorn in a thread, the
admin token, trusted keys) and locally, the same model publishes the same
versions: the same manifests but for their times and signatures, the same
blobs and deltas in the store. ``tandem models publish/assign --cdn`` go
the first way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_cdn import AdminApiError, AdminClient, LocalBlobStore, create_app, open_registry
from model_cdn.publish import AdminApiTarget, LocalTarget, publish_model
from model_cdn.registry import Registry
from shared import MqttSettings, PublicKey, SigningKey, Topics, verify_assignment

from ._brokers import MosquittoProcess
from ._cdn import receive_retained, serve_in_thread
from ._cli import one_error_line, tandem
from ._models import linear_classifier_weights, write_linear_classifier

TOKEN = "publish-t0ken"
TIMES = ("published_at", "expires_at")


@dataclass
class Cdn:
    url: str
    registry: Registry
    store: LocalBlobStore
    topics: Topics


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate()


def _serve(root: Path, key: SigningKey, mqtt: MqttSettings | None = None) -> Iterator[Cdn]:
    registry = open_registry(f"sqlite:///{root / 'cdn.db'}")
    store = LocalBlobStore(root / "cdn-blobs")
    topics = Topics(f"pub-{uuid.uuid4().hex[:8]}")
    app = create_app(
        registry=registry,
        store=store,
        admin_token=TOKEN,
        trusted_keys=[key.public_key],
        mqtt=mqtt,
        topics=topics,
    )
    try:
        with serve_in_thread(app, lifespan="on") as url:  # its shutdown closes the MQTT link
            yield Cdn(url, registry, store, topics)
    finally:
        registry.close()


@pytest.fixture
def cdn(tmp_path: Path, key: SigningKey) -> Iterator[Cdn]:
    yield from _serve(tmp_path, key)


def _samples() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    weight, bias = linear_classifier_weights()
    val = rng.normal(size=(200, 16)).astype(np.float32)
    return {
        "calibration": rng.normal(size=(64, 16)).astype(np.float32),
        "validation": (val, np.argmax(val @ weight + bias, axis=1)),
        "min_agreement": 0.9,
    }


def _without_times(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest["signed"].items() if k not in TIMES}


def test_the_admin_api_and_local_mode_publish_the_same_registry_contents(
    cdn: Cdn, key: SigningKey, tmp_path: Path
) -> None:
    models = [
        write_linear_classifier(tmp_path / "v1.onnx", seed=0),
        write_linear_classifier(tmp_path / "v2.onnx", seed=1),  # v2 gets a delta from v1
    ]
    local_registry = open_registry(f"sqlite:///{tmp_path / 'local.db'}")
    local_store = LocalBlobStore(tmp_path / "local-blobs")
    remote = AdminApiTarget(AdminClient(cdn.url, token=TOKEN))
    try:
        for model in models:
            for target in (LocalTarget(local_registry, local_store), remote):
                publish_model(model, name="linear", signing_key=key, target=target, **_samples())
        here, there = local_registry.list_versions("linear"), cdn.registry.list_versions("linear")
    finally:
        local_registry.close()
    assert [r.version for r in here] == [r.version for r in there] == [1, 2]
    for mine, theirs in zip(here, there, strict=True):
        assert _without_times(mine.manifest) == _without_times(theirs.manifest)
        assert mine.blob_digest == theirs.blob_digest
        signed = mine.manifest["signed"]
        for digest in [signed["blob"]["digest"], *(d["digest"] for d in signed["deltas"])]:
            assert local_store.get(digest) == cdn.store.get(digest)
    assert here[1].manifest["signed"]["deltas"], "v2 should carry a delta from v1"


def test_a_release_the_cdn_refuses_registers_nothing(
    cdn: Cdn, key: SigningKey, tmp_path: Path
) -> None:
    stranger = SigningKey.generate()  # not among the CDN's trusted keys
    model = write_linear_classifier(tmp_path / "m.onnx")
    target = AdminApiTarget(AdminClient(cdn.url, token=TOKEN))
    with pytest.raises(AdminApiError) as refused:
        publish_model(model, name="linear", signing_key=stranger, target=target, **_samples())
    assert refused.value.status == 400
    assert cdn.registry.list_models() == []
    wrong_token = AdminApiTarget(AdminClient(cdn.url, token="nope"))
    with pytest.raises(AdminApiError) as denied:
        publish_model(
            model, name="linear", signing_key=stranger, target=wrong_token, quantize="none"
        )
    assert denied.value.status == 403


def _key_files(key: SigningKey, root: Path) -> Path:
    path = root / "publisher.key"
    path.write_text(key.to_text() + "\n")
    return path


def test_models_publish_with_cdn_goes_through_the_admin_api(
    cdn: Cdn, key: SigningKey, tmp_path: Path, linear_onnx: Path
) -> None:
    np.save(tmp_path / "calib.npy", _samples()["calibration"])
    inputs, labels = _samples()["validation"]
    np.savez(tmp_path / "val.npz", inputs=inputs, labels=labels)
    args = [
        "models", "publish", str(linear_onnx), "--name", "linear", "--calibration", "calib.npy",
        "--validation", "val.npz", "--min-agreement", "0.9",
        "--sign-key", str(_key_files(key, tmp_path)), "--cdn", cdn.url,
    ]  # fmt: skip
    denied = tandem(*args, cwd=tmp_path)
    one_error_line(denied, 1, "--token")
    published = tandem(*args, "--token", TOKEN, cwd=tmp_path)
    assert published.returncode == 0, published.stdout + published.stderr
    record = cdn.registry.get_version("linear")
    assert record.version == 1 and record.blob_digest in published.stdout
    assert not (tmp_path / "tandem-cdn").exists()  # nothing written here
    again = tandem(*args, "--token", TOKEN, "--version", "1", cwd=tmp_path)
    one_error_line(again, 1, "not above")


@pytest.fixture
def cdn_on_mqtt(tmp_path: Path, key: SigningKey, mosquitto: MosquittoProcess) -> Iterator[Cdn]:
    yield from _serve(tmp_path, key, MqttSettings.from_url(mosquitto.url))


def test_models_assign_with_cdn_stores_and_publishes_through_the_cdn(
    cdn_on_mqtt: Cdn,
    key: SigningKey,
    tmp_path: Path,
    linear_onnx: Path,
    mosquitto: MosquittoProcess,
) -> None:
    cdn = cdn_on_mqtt
    target = AdminApiTarget(AdminClient(cdn.url, token=TOKEN))
    publish_model(linear_onnx, name="linear", signing_key=key, target=target, quantize="none")
    common = ["--sign-key", str(_key_files(key, tmp_path)), "--cdn", cdn.url, "--token", TOKEN]
    result = tandem(
        "models", "assign", "linear@1", "--device", "cam-1", "--device", "cam-2", *common,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cam-2: linear@1 stored and published" in result.stdout
    public = PublicKey.from_text(key.public_key.to_text())
    for device in ("cam-1", "cam-2"):
        stored = cdn.registry.get_assignment(device, "linear")
        assert stored is not None and verify_assignment(stored, [public]).device == device
    message = receive_retained(mosquitto.url, cdn.topics.assign("cam-2"))
    assert verify_assignment(json.loads(message.payload), [public]).version == 1
    unknown = tandem("models", "assign", "linear@7", "--device", "cam-1", *common, cwd=tmp_path)
    one_error_line(unknown, 1, "linear@7")
    both = tandem(
        "models", "assign", "linear@1", "--device", "cam-1", "--broker", mosquitto.url, *common,
        cwd=tmp_path,
    )  # fmt: skip
    one_error_line(both, 2, "--broker", "--cdn")
