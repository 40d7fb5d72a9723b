"""The publish pipeline on the demo's real models: size, validation gate, signature, deltas.

The models come from ``build_demo_models()`` (cached after the first build),
calibration and validation inputs from the same held-out splits the demo
uses. The registry is a small in-memory one (the SQL registries have tests
of their own); the blob store is the real local one.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_cdn import (
    InvalidNameError,
    ModelNotFoundError,
    PublishError,
    QuantizationError,
    ValidationError,
    VersionConflictError,
)
from model_cdn.publish import (
    PublishResult,
    publish_model,
    quantize_model,
    shrink_model,
)
from model_cdn.registry import Registry, VersionRecord
from shared import (
    DeltaRef,
    SignatureError,
    SigningKey,
    apply_delta,
    decompress_blob,
    digest,
    make_delta,
    verify_manifest,
)
from shared.server.store import LocalBlobStore
from tandem.demo.data import DigitSplits, load_digit_splits
from tandem.demo.models import DemoModels, TrainingRecipe, build_demo_models

LABELS = [str(i) for i in range(10)]


class MemoryRegistry(Registry):
    """Versions in a dict; refuses a version not above the latest, like the real ones."""

    def __init__(self) -> None:
        self.versions: dict[str, list[VersionRecord]] = {}

    def add_version(self, signed_manifest: dict[str, Any]) -> VersionRecord:
        doc = signed_manifest["signed"]
        versions = self.versions.setdefault(doc["name"], [])
        if versions and doc["version"] <= versions[-1].version:
            raise VersionConflictError(f"{doc['version']} is not above {versions[-1].version}")
        record = VersionRecord(
            doc["name"], doc["version"], signed_manifest, doc["blob"]["digest"], doc["published_at"]
        )
        versions.append(record)
        return record

    def get_version(self, name: str, version: int | None = None) -> VersionRecord:
        for record in reversed(self.versions.get(name, [])):
            if version is None or record.version == version:
                return record
        raise ModelNotFoundError(f"no {name} {version or ''}")

    def list_models(self) -> list[str]:
        return sorted(self.versions)

    def list_versions(self, name: str) -> list[VersionRecord]:
        return list(self.versions.get(name, []))

    def delete_version(self, name: str, version: int) -> None:
        self.versions[name] = [r for r in self.versions.get(name, []) if r.version != version]

    def put_assignment(self, device: str, model: str, signed_assignment: dict[str, Any]) -> None:
        raise NotImplementedError

    def get_assignment(self, device: str, model: str) -> dict[str, Any] | None:
        raise NotImplementedError

    # the fleet's devices and rollouts are not the publish pipeline's business
    def upsert_devices(self, records: Any) -> None:
        raise NotImplementedError

    def get_device(self, device: str) -> Any:
        raise NotImplementedError

    def list_devices(self) -> list[Any]:
        raise NotImplementedError

    def put_rollout(self, record: Any) -> None:
        raise NotImplementedError

    def get_rollout(self, rollout_id: str) -> Any:
        raise NotImplementedError

    def list_rollouts(self) -> list[Any]:
        raise NotImplementedError


@pytest.fixture(scope="module")
def demo() -> DemoModels:
    return build_demo_models()


@pytest.fixture(scope="module")
def digits() -> DigitSplits:
    recipe = TrainingRecipe()
    return load_digit_splits(
        train=recipe.train_size,
        calibration=recipe.calibration_size,
        test=recipe.test_size,
        seed=recipe.split_seed,
    )


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


def _publish(source: Any, digits: DigitSplits, **kwargs: Any) -> PublishResult:
    options: dict[str, Any] = {
        "name": "mnist",
        "calibration": digits.calibration_images,
        "validation": (digits.test_images, digits.test_labels),
        "labels": LABELS,
    }
    options.update(kwargs)
    return publish_model(source, **options)


@pytest.fixture(scope="module")
def edge(
    demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> tuple[PublishResult, MemoryRegistry, LocalBlobStore]:
    registry, store = MemoryRegistry(), LocalBlobStore(tmp_path_factory.mktemp("blobs"))
    result = _publish(demo.edge_float_onnx, digits, registry=registry, store=store, signing_key=key)
    return result, registry, store


def _session(model: bytes) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def _raw_model(result: PublishResult, store: LocalBlobStore) -> bytes:
    blob = result.manifest.blob
    return decompress_blob(store.get(blob.digest), blob.raw_size)


# --------------------------------------------------------------------------- the edge model


@pytest.mark.parametrize("which", ["edge_float_onnx", "cloud_onnx"])
def test_int8_static_blob_is_at_most_30_percent_of_the_float_file(
    which: str, demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path: Path
) -> None:
    float_path: Path = getattr(demo, which)
    store = LocalBlobStore(tmp_path)
    result = _publish(float_path, digits, registry=MemoryRegistry(), store=store, signing_key=key)
    float_bytes = float_path.stat().st_size
    blob = result.manifest.blob
    print(  # the numbers the README quotes; shown with pytest -s
        f"{which}: float {float_bytes} B, int8 raw {blob.raw_size} B, int8+zstd {blob.size} B "
        f"({blob.size / float_bytes:.1%})"
    )
    assert blob.size <= 0.30 * float_bytes
    assert store.size(blob.digest) == blob.size == len(store.get(blob.digest))
    assert result.report["float_bytes"] == float_bytes
    assert result.report["quantized_bytes"] == blob.raw_size


def test_the_blob_is_an_int8_qdq_model_that_runs(
    edge: tuple[PublishResult, MemoryRegistry, LocalBlobStore], digits: DigitSplits
) -> None:
    import onnx

    result, _, store = edge
    raw = _raw_model(result, store)
    model = onnx.load_model_from_string(raw)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    weights = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert sum(int(np.prod(t.dims)) for t in weights) > 4000  # conv and linear weights
    logits = _session(raw).run(None, {"image": digits.test_images[:100]})[0]
    assert logits.shape == (100, 10)
    assert (logits.argmax(1) == digits.test_labels[:100]).mean() > 0.85


def test_the_blob_leaks_no_provenance_or_local_paths(
    edge: tuple[PublishResult, MemoryRegistry, LocalBlobStore], demo: DemoModels
) -> None:
    """torch stamps stack traces with the publisher's file paths on every node."""
    result, _, store = edge
    raw = _raw_model(result, store)
    assert b"stack_trace" in demo.edge_float_onnx.read_bytes()  # the source has them
    for needle in (
        b"stack_trace",
        b"site-packages",
        b"pkg.torch",
        b"onnx.quant.pre_process",
        b"relu_1",
    ):
        assert needle not in raw


def test_the_manifest_carries_the_validation_report_and_verifies(
    edge: tuple[PublishResult, MemoryRegistry, LocalBlobStore], key: SigningKey
) -> None:
    result, registry, _ = edge
    manifest = verify_manifest(result.signed, [key.public_key])
    assert manifest == result.manifest
    report = manifest.quantization
    assert report == result.report
    assert report["method"] == "int8-static"
    assert report["validated"] is True
    assert report["samples"] == 1500
    assert 0.97 <= report["agreement"] <= 1.0
    assert report["accuracy"] > 0.9 and report["float_accuracy"] > 0.9
    assert report["max_abs_diff"] > 0
    assert report["calibration_samples"] == 500
    assert manifest.requires == {"runtime": "onnxruntime", "opset": 18}
    assert [t.to_dict() for t in manifest.inputs] == [
        {"name": "image", "datatype": "FP32", "shape": [None, 1, 28, 28]}
    ]
    assert [t.to_dict() for t in manifest.outputs] == [
        {"name": "logits", "datatype": "FP32", "shape": [None, 10]}
    ]
    assert manifest.labels == tuple(LABELS)
    assert manifest.version == 1
    assert not manifest.expired()
    assert registry.get_version("mnist").manifest == result.signed


def test_a_tampered_report_does_not_verify(
    edge: tuple[PublishResult, MemoryRegistry, LocalBlobStore], key: SigningKey
) -> None:
    result, _, _ = edge
    forged = {
        "signed": {**result.signed["signed"], "quantization": {"agreement": 1.0}},
        "signatures": result.signed["signatures"],
    }
    with pytest.raises(SignatureError):
        verify_manifest(forged, [key.public_key])
    with pytest.raises(SignatureError):
        verify_manifest(result.signed, [SigningKey.generate().public_key])


def test_the_smoke_test_passes_on_the_published_blob(
    edge: tuple[PublishResult, MemoryRegistry, LocalBlobStore],
) -> None:
    result, _, store = edge
    inputs, outputs, atol = result.manifest.smoke_samples()
    assert inputs["image"].shape[0] in (2, 3, 4)
    stored = result.signed["signed"]["smoke_test"]["inputs"]["image"]
    assert stored["compression"] == "zstd"  # digits on a plain background: zstd pays
    assert len(stored["data"]) < inputs["image"].nbytes / 3  # base64 alone would be 4/3 of it
    assert 0 < atol < 1.0
    got = _session(_raw_model(result, store)).run(None, inputs)[0]
    np.testing.assert_allclose(got, outputs["logits"], atol=atol, rtol=0)


# --------------------------------------------------------------------------- the gate


def _badly_calibrated(digits: DigitSplits) -> np.ndarray:
    """Calibration that sets activation ranges far too small: saturated INT8 activations."""
    return np.ascontiguousarray(digits.calibration_images * 0.02)


def test_a_threshold_above_the_achieved_agreement_refuses_and_stores_nothing(
    demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path: Path
) -> None:
    probe = _publish(
        demo.edge_float_onnx,
        digits,
        registry=MemoryRegistry(),
        store=LocalBlobStore(tmp_path / "probe"),
        signing_key=key,
        calibration=_badly_calibrated(digits),
        min_agreement=0.0,
    )
    achieved = probe.report["agreement"]
    assert achieved < 0.97

    registry, store = MemoryRegistry(), LocalBlobStore(tmp_path / "blobs")
    with pytest.raises(ValidationError, match="agrees with the float one on"):
        _publish(
            demo.edge_float_onnx,
            digits,
            registry=registry,
            store=store,
            signing_key=key,
            calibration=_badly_calibrated(digits),
            min_agreement=achieved + 0.005,
        )
    assert registry.versions == {}
    assert not (tmp_path / "blobs").exists()


def test_validation_inputs_are_required_to_quantize(
    demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path: Path
) -> None:
    registry = MemoryRegistry()
    with pytest.raises(PublishError, match="needs validation inputs"):
        _publish(
            demo.edge_float_onnx,
            digits,
            registry=registry,
            store=LocalBlobStore(tmp_path),
            signing_key=key,
            validation=None,
        )
    with pytest.raises(PublishError, match="calibration"):
        _publish(
            demo.edge_float_onnx,
            digits,
            registry=registry,
            store=LocalBlobStore(tmp_path),
            signing_key=key,
            calibration=None,
        )
    assert registry.versions == {}


@pytest.mark.parametrize("name", ["../mnist", "a/b", "", "mnist#", "x" * 200])
def test_invalid_model_names_are_refused_before_any_work(
    name: str, demo: DemoModels, key: SigningKey, tmp_path: Path
) -> None:
    with pytest.raises(InvalidNameError):
        publish_model(
            demo.edge_float_onnx,
            name=name,
            registry=MemoryRegistry(),
            store=LocalBlobStore(tmp_path),
            signing_key=key,
            quantize="none",
        )


# --------------------------------------------------------------------------- versions and deltas


def _fine_tuned(float_model: bytes) -> bytes:
    """The float model with its classifier head nudged, as a short fine-tune would."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(float_model)
    rng = np.random.default_rng(7)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    for tensor in model.graph.initializer:
        if tensor.name in gemm.input[1:]:
            array = numpy_helper.to_array(tensor)
            noise = rng.normal(scale=0.02 * float(np.abs(array).mean()), size=array.shape)
            tensor.CopyFrom(
                numpy_helper.from_array((array + noise).astype(np.float32), tensor.name)
            )
    return bytes(model.SerializeToString())


def test_a_second_version_gets_a_delta_that_rebuilds_it_exactly(
    demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path: Path
) -> None:
    registry, store = MemoryRegistry(), LocalBlobStore(tmp_path)
    first = _publish(demo.edge_float_onnx, digits, registry=registry, store=store, signing_key=key)
    second = _publish(
        _fine_tuned(demo.edge_float_onnx.read_bytes()),
        digits,
        registry=registry,
        store=store,
        signing_key=key,
    )
    assert (first.manifest.version, second.manifest.version) == (1, 2)
    assert first.manifest.deltas == ()
    (delta,) = second.manifest.deltas
    assert delta.from_version == 1
    assert second.delta_digests == [delta.digest]
    patch = store.get(delta.digest)
    assert len(patch) == delta.size < second.manifest.blob.size
    old_raw, new_raw = _raw_model(first, store), _raw_model(second, store)
    assert new_raw != old_raw
    raw_size = second.manifest.blob.raw_size
    assert apply_delta(old_raw, patch, raw_size, method=delta.compression) == new_raw
    assert digest(patch) == delta.digest
    # the publisher made both methods and kept the smaller
    sizes = {m: len(make_delta(old_raw, new_raw, method=m)) for m in DeltaRef.METHODS}
    assert delta.compression == min(sizes, key=lambda m: sizes[m])
    assert delta.size == min(sizes.values())
    print(f"delta sizes by method: {sizes}")
    verify_manifest(second.signed, [key.public_key])
    full = second.manifest.blob.size
    print(f"delta v1->v2 ({delta.compression}): {delta.size} B vs full blob {full} B")


def test_no_delta_when_the_previous_blob_is_gone(
    demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path: Path
) -> None:
    registry, store = MemoryRegistry(), LocalBlobStore(tmp_path)
    first = _publish(demo.edge_float_onnx, digits, registry=registry, store=store, signing_key=key)
    store.delete(first.blob_digest)
    second = _publish(
        _fine_tuned(demo.edge_float_onnx.read_bytes()),
        digits,
        registry=registry,
        store=store,
        signing_key=key,
    )
    assert second.manifest.version == 2
    assert second.manifest.deltas == () and second.delta_digests == []


def test_versions_only_increase(
    demo: DemoModels, key: SigningKey, digits: DigitSplits, tmp_path: Path
) -> None:
    registry, store = MemoryRegistry(), LocalBlobStore(tmp_path)
    options: dict[str, Any] = {
        "name": "plain",
        "registry": registry,
        "store": store,
        "signing_key": key,
        "quantize": "none",
        "allow_same": True,  # the same model each time: this is about version numbers
    }
    assert publish_model(demo.edge_float_onnx, **options).manifest.version == 1
    assert publish_model(demo.edge_float_onnx, **options, version=5).manifest.version == 5
    assert publish_model(demo.edge_float_onnx, **options).manifest.version == 6
    for stale in (6, 3):
        with pytest.raises(VersionConflictError):
            publish_model(demo.edge_float_onnx, **options, version=stale)
    assert [r.version for r in registry.list_versions("plain")] == [1, 5, 6]


# --------------------------------------------------------------------------- methods and sources


@pytest.mark.parametrize("method", ["int8-dynamic", "fp16", "none"])
def test_other_methods_publish_validated_models(
    method: str, demo: DemoModels, digits: DigitSplits, key: SigningKey, tmp_path: Path
) -> None:
    store = LocalBlobStore(tmp_path)
    result = _publish(
        demo.edge_float_onnx,
        digits,
        registry=MemoryRegistry(),
        store=store,
        signing_key=key,
        quantize=method,
        calibration=None,
    )
    report = result.manifest.quantization
    assert report["method"] == method and report["validated"] is True
    assert report["agreement"] >= 0.97
    assert report["quantized_bytes"] < report["float_bytes"]  # shrinking helps even "none"
    raw = _raw_model(result, store)
    inputs, outputs, atol = result.manifest.smoke_samples()
    np.testing.assert_allclose(_session(raw).run(None, inputs)[0], outputs["logits"], atol=atol)


def test_a_torch_module_is_exported_and_published(key: SigningKey, tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(200, 16)).astype(np.float32)
    held_out = rng.normal(size=(300, 16)).astype(np.float32)
    progress: list[tuple[str, float]] = []
    result = publish_model(
        module,
        name="tiny",
        registry=MemoryRegistry(),
        store=LocalBlobStore(tmp_path),
        signing_key=key,
        calibration=calibration,
        validation=(held_out, None),
        min_agreement=0.9,
        progress=lambda stage, fraction: progress.append((stage, fraction)),
    )
    manifest = result.manifest
    assert [t.to_dict() for t in manifest.inputs] == [
        {"name": "input", "datatype": "FP32", "shape": [None, 16]}
    ]
    assert manifest.outputs[0].shape == (None, 4)
    assert manifest.quantization["accuracy"] is None  # no labels given
    with torch.no_grad():
        expected = module(torch.from_numpy(held_out)).numpy().argmax(1)
    raw = decompress_blob(LocalBlobStore(tmp_path).get(result.blob_digest), manifest.blob.raw_size)
    got = _session(raw).run(None, {"input": held_out})[0].argmax(1)
    assert (got == expected).mean() >= 0.9
    assert ("quantize", 0.0) in progress and ("quantize", 1.0) in progress
    assert progress[-1] == ("store and register", 1.0)


def test_tflite_files_are_validated_against_the_float_onnx(key: SigningKey, tmp_path: Path) -> None:
    from ._models import write_linear_classifier
    from ._tflite_models import linear_classifier_tflite

    float_onnx = write_linear_classifier(tmp_path / "linear.onnx")
    tflite = tmp_path / "linear_int8.tflite"
    tflite.write_bytes(linear_classifier_tflite(quantized=True))
    inputs = np.random.default_rng(1).uniform(-2, 2, size=(400, 16)).astype(np.float32)
    store = LocalBlobStore(tmp_path / "blobs")
    result = publish_model(
        float_onnx,
        name="linear",
        registry=MemoryRegistry(),
        store=store,
        signing_key=key,
        format="tflite",
        tflite_file=tflite,
        validation=(inputs, None),
        min_agreement=0.9,
    )
    manifest = verify_manifest(result.signed, [key.public_key])
    assert manifest.format == "tflite" and manifest.requires == {"runtime": "tflite"}
    assert manifest.quantization["validated"] is True
    assert manifest.quantization["agreement"] >= 0.9
    assert [t.to_dict() for t in manifest.inputs] == [
        {"name": "x", "datatype": "INT8", "shape": [None, 16]}
    ]
    smoke_inputs, smoke_outputs, atol = manifest.smoke_samples()
    assert smoke_inputs["x"].dtype == np.int8 and smoke_outputs["logits"].dtype == np.int8
    assert atol == 2.0  # two INT8 output steps
    assert _raw_model(result, store) == tflite.read_bytes()


def test_quantization_failure_is_a_quantization_error() -> None:
    with pytest.raises(QuantizationError):
        quantize_model(b"not an onnx model", "int8-dynamic", input_name="x")


def test_shrinking_keeps_what_the_model_computes(demo: DemoModels, digits: DigitSplits) -> None:
    import onnx

    source = demo.edge_float_onnx.read_bytes()
    shrunk = shrink_model(onnx.load_model_from_string(source)).SerializeToString()
    assert len(shrunk) < 0.8 * len(source)
    x = digits.test_images[:50]
    np.testing.assert_array_equal(
        _session(shrunk).run(None, {"image": x})[0], _session(source).run(None, {"image": x})[0]
    )


# --------------------------------------------------------------------------- public API


@pytest.mark.parametrize("package", ["model_cdn.publish", "shared.server.store"])
def test_packages_name_their_public_api_in_all(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and name != "annotations" and not _is_submodule(value, package)
    }
    assert public == set(module.__all__)


def _is_submodule(value: object, package: str) -> bool:
    return getattr(value, "__name__", "").startswith(package + ".") and hasattr(value, "__file__")


def test_labels_must_match_the_model_outputs(
    demo: DemoModels, key: SigningKey, tmp_path: Path
) -> None:
    with pytest.raises(PublishError, match="labels"):
        publish_model(
            demo.edge_float_onnx,
            name="labelled",
            registry=MemoryRegistry(),
            store=LocalBlobStore(tmp_path),
            signing_key=key,
            quantize="none",
            labels=["just", "three", "labels"],
        )
