"""Two published versions of the demo's edge model, and devices provisioned with the first.

For the fleet tests that run real ``EdgeAgent`` + ``ModelUpdater`` devices: v1
is the demo's INT8 edge model, v2 the same with its classifier head nudged,
both through the real publish pipeline into a SQLite registry and a local
blob store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from edge_agent import DeviceModelStore
from edge_agent.updater import CurrentPointer, TrustRecord
from model_cdn import LocalBlobStore, open_registry, publish_model
from model_cdn.registry import Registry
from shared import ModelManifest, SigningKey, decompress_blob
from tandem.demo.data import DigitSplits, load_digit_splits
from tandem.demo.models import build_demo_models

__all__ = ["DemoVersions", "fine_tuned", "provision", "publish_demo_versions"]


@dataclass
class DemoVersions:
    model: str
    key: SigningKey
    registry: Registry
    store: LocalBlobStore
    digits: DigitSplits
    published: list[Any]  # the publish results of v1 and v2


def fine_tuned(float_onnx: Path, out: Path) -> Path:
    """A plausible next version: the classifier head nudged (2% noise), the rest unchanged."""
    model = onnx.load(str(float_onnx))
    rng = np.random.default_rng(7)
    head = max(
        model.graph.initializer, key=lambda t: int(np.prod(t.dims)) if len(t.dims) == 2 else 0
    )
    weights = numpy_helper.to_array(head)
    nudged = weights * (1 + 0.02 * rng.standard_normal(weights.shape)).astype(weights.dtype)
    head.CopyFrom(numpy_helper.from_array(nudged.astype(weights.dtype), head.name))
    onnx.save(model, str(out))
    return out


def publish_demo_versions(tmp_path: Path, model: str) -> DemoVersions:
    """v1 and v2 of ``model`` published, signed by a fresh key."""
    models = build_demo_models()
    digits = load_digit_splits()
    key = SigningKey.generate()
    registry = open_registry(f"sqlite:///{tmp_path / 'registry.db'}")
    store = LocalBlobStore(tmp_path / "blobs")
    common: dict[str, Any] = dict(
        name=model,
        registry=registry,
        store=store,
        signing_key=key,
        calibration=digits.calibration_images,
        validation=(digits.test_images, digits.test_labels),
    )
    v1 = publish_model(models.edge_float_onnx, **common)
    v2 = publish_model(fine_tuned(models.edge_float_onnx, tmp_path / "v2.onnx"), **common)
    return DemoVersions(model, key, registry, store, digits, [v1, v2])


def provision(store_dir: Path, versions: DemoVersions) -> None:
    """The device as it leaves the factory: v1 installed and committed."""
    record = versions.registry.get_version(versions.model, 1)
    manifest = ModelManifest.from_dict(record.manifest["signed"])
    raw = decompress_blob(versions.store.get(manifest.blob.digest), manifest.blob.raw_size)
    signed = json.dumps(record.manifest).encode()
    device_store = DeviceModelStore(store_dir)
    device_store.install(versions.model, manifest, signed, raw)
    device_store.commit(versions.model, CurrentPointer(1, None, TrustRecord(1, None)))
