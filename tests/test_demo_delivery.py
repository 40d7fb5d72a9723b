"""The demo's edge model reaches its devices through the CDN: published, served, installed.

Real parts throughout: the publish pipeline on the demo's float model (cached
by ``build_demo_models``), the CDN's FastAPI app under uvicorn on loopback,
and each device's ``ModelUpdater`` installing into its own store.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import onnxruntime as ort
import pytest

from edge_agent.updater import DeviceModelStore
from shared import MqttSettings, Topics, digest
from tandem.demo import DeliveryError, EdgeDelivery
from tandem.demo._delivery import EDGE_MODEL, deliver_edge_model
from tandem.demo.data import DigitSplits, load_digit_splits
from tandem.demo.models import DemoModels, build_demo_models

DEVICES = ["dev-a", "dev-b", "dev-c"]
# The agents waiting for their first model are configured with a broker but never
# started during the install: nothing connects to it.
UNUSED_BROKER = MqttSettings.from_url("mqtt://127.0.0.1:1883")


@pytest.fixture(scope="module")
def models() -> DemoModels:
    return build_demo_models()


@pytest.fixture(scope="module")
def digits() -> DigitSplits:
    return load_digit_splits()


def deliver(float_model: Path, digits: DigitSplits, workdir: Path) -> EdgeDelivery:
    return deliver_edge_model(
        float_model,
        digits,
        devices=DEVICES,
        workdir=workdir,
        broker=UNUSED_BROKER,
        topics=Topics("tandem/test-delivery"),
        cloud_model="mnist",
    )


@pytest.fixture(scope="module")
def delivered(
    models: DemoModels, digits: DigitSplits, tmp_path_factory: pytest.TempPathFactory
) -> EdgeDelivery:
    return deliver(models.edge_float_onnx, digits, tmp_path_factory.mktemp("delivery"))


def test_every_device_installs_the_published_version(delivered: EdgeDelivery) -> None:
    assert (delivered.model, delivered.version) == (EDGE_MODEL, 1)
    assert [d.device for d in delivered.devices] == DEVICES
    for device in delivered.devices:
        assert device.state == "installed"
        assert device.version == delivered.version
        assert device.manifest_digest == delivered.manifest_digest
        assert device.downloaded_bytes == delivered.blob_bytes  # the blob came over HTTP
        pointer = DeviceModelStore(device.store_dir).pointer(EDGE_MODEL)
        assert pointer is not None and pointer.version == delivered.version
        assert pointer.trust.highest_accepted == delivered.version


def test_devices_serve_the_demos_int8_model(
    delivered: EdgeDelivery, models: DemoModels, digits: DigitSplits
) -> None:
    cached = models.edge_int8_onnx.read_bytes()
    assert delivered.model_digest == digest(cached)  # one quantizer: the cache is what ships
    images = np.ascontiguousarray(digits.test_images[:64])
    session = ort.InferenceSession(cached, providers=["CPUExecutionProvider"])
    (expected,) = session.run(["logits"], {"image": images})
    for device in DEVICES:
        runtime = delivered.runtime(device)
        try:
            assert (runtime.name, runtime.version) == (EDGE_MODEL, str(delivered.version))
            np.testing.assert_array_equal(runtime.run({"image": images})["logits"], expected)
        finally:
            runtime.close()


def test_the_cdn_is_stopped_once_the_devices_installed(delivered: EdgeDelivery) -> None:
    url = urlsplit(delivered.cdn_url)
    assert url.hostname == "127.0.0.1" and url.port
    with pytest.raises(ConnectionRefusedError), socket.create_connection((url.hostname, url.port)):
        pass


def test_a_model_the_pipeline_cannot_read_is_delivered_nowhere(
    digits: DigitSplits, tmp_path: Path
) -> None:
    garbage = tmp_path / "float.onnx"
    garbage.write_bytes(b"not an ONNX model")
    with pytest.raises(DeliveryError, match=f"publishing {EDGE_MODEL} failed"):
        deliver(garbage, digits, tmp_path / "work")
    assert not (tmp_path / "work" / "devices").exists()


def test_a_model_tampered_in_a_device_store_is_not_served(
    models: DemoModels, digits: DigitSplits, tmp_path: Path
) -> None:
    delivery = deliver(models.edge_float_onnx, digits, tmp_path)
    victim = delivery.devices[0]
    stored = victim.store_dir / EDGE_MODEL / str(delivery.version) / "model.onnx"
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(DeliveryError, match="no verified"):
        delivery.runtime(victim.device)
    delivery.runtime(delivery.devices[1].device).close()  # the others still serve
