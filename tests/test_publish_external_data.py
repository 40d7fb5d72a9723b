"""Publishing what torch's exporter writes by default: ``model.onnx`` plus ``model.onnx.data``.

What a new user did (issue 14): train a small torch model, ``torch.onnx.export``
it with the defaults (torch 2.13 keeps the weights in an external data file
beside the model, even for a model of a few KB), then ``tandem models
publish`` it. Every quantize mode must publish one self-contained file that
loads anywhere (here: ONNX Runtime from the blob's bytes, in a directory
holding no data file) and computes what the float model computes; errors
name the user's file, never a temporary folder.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_cdn import PublishError, QuantizationError
from model_cdn.publish import publish_model, quantize_model
from model_cdn.publish._onnx_file import external_locations
from model_cdn.registry import open_registry
from shared import SigningKey, decompress_blob, quiet_loggers
from shared.server.store import LocalBlobStore

from ._cli import one_error_line, tandem

CLASSES, FEATURES = 4, 16


@dataclass(frozen=True)
class Exported:
    """A torch classifier exported with torch's defaults, and data to publish it with."""

    directory: Path
    model: Path
    calibration: np.ndarray
    validation: np.ndarray
    labels: np.ndarray
    float_logits: np.ndarray  # the torch module's own outputs on the validation inputs


def _blobs_data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Four Gaussian clusters in 16 dimensions: a task a small MLP learns in a second."""
    centers = np.random.default_rng(7).normal(scale=2.0, size=(CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, size=n)
    x = centers[labels] + rng.normal(size=(n, FEATURES))
    return x.astype(np.float32), labels.astype(np.int64)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    import torch

    rng = np.random.default_rng(0)
    x_train, y_train = _blobs_data(rng, 2000)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES)
    )
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(200):
        optimizer.zero_grad()
        logits = net(torch.from_numpy(x_train))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y_train))
        loss.backward()
        optimizer.step()
    net.eval()
    directory = tmp_path_factory.mktemp("exported")
    path = directory / "model.onnx"
    with warnings.catch_warnings(), quiet_loggers("torch.onnx", "torch.export", "onnxscript"):
        # torch's own pytree deprecation, raised from inside its exporter
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning
        )
        torch.onnx.export(  # torch's defaults, as the user ran it: no external_data argument
            net,
            (torch.from_numpy(x_train[:4]),),
            str(path),
            input_names=["features"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )
    calibration, _ = _blobs_data(rng, 300)
    validation, labels = _blobs_data(rng, 600)
    with torch.no_grad():
        float_logits = net(torch.from_numpy(validation)).numpy()
    return Exported(directory, path, calibration, validation, labels, float_logits)


@pytest.fixture(scope="module")
def publisher(exported: Exported) -> Path:
    """A key pair from ``tandem keys generate`` and the samples as files, in a work folder
    that is not the model's (so nothing can be found beside the working directory)."""
    work = exported.directory.parent / "work"
    work.mkdir()
    assert tandem("keys", "generate", "--out", "keys", cwd=work).returncode == 0
    np.save(work / "calibration.npy", exported.calibration)
    np.savez(work / "validation.npz", inputs=exported.validation, labels=exported.labels)
    return work


def _publish(work: Path, model: Path, *extra: str) -> Any:
    return tandem(
        "models", "publish", str(model), "--name", "clf", "--sign-key", "keys/publisher.key",
        "--calibration", "calibration.npy", "--validation", "validation.npz",
        "--registry", "sqlite:///registry.db", "--store", "blobs", *extra, cwd=work,
    )  # fmt: skip


def _published_model(work: Path, version: int) -> tuple[bytes, dict[str, Any]]:
    """The model file devices get for ``clf@version`` (the blob, decompressed) and its report."""
    registry = open_registry(f"sqlite:///{work / 'registry.db'}", create=False)
    try:
        signed = registry.get_version("clf", version).manifest["signed"]
    finally:
        registry.close()
    blob = LocalBlobStore(work / "blobs").get(signed["blob"]["digest"])
    return decompress_blob(blob, signed["blob"]["raw_size"]), signed["quantization"]


def test_torch_writes_the_weights_beside_the_model_by_default(exported: Exported) -> None:
    import onnx

    header = onnx.load_model(str(exported.model), load_external_data=False)
    assert external_locations(header) == ["model.onnx.data"]
    assert (exported.directory / "model.onnx.data").stat().st_size > 0


@pytest.mark.parametrize("method", ["int8-static", "int8-dynamic", "fp16", "none"])
def test_each_quantize_mode_publishes_one_file_that_computes_what_the_float_model_does(
    method: str, exported: Exported, publisher: Path, tmp_path: Path
) -> None:
    import onnx
    import onnxruntime as ort

    versions_before = _version_count(publisher)
    result = _publish(publisher, exported.model, "--quantize", method)
    assert result.returncode == 0, result.stderr
    raw, report = _published_model(publisher, versions_before + 1)
    assert external_locations(onnx.load_model_from_string(raw)) == []
    with contextlib.chdir(tmp_path):  # no data file here, nor beside the bytes
        session = ort.InferenceSession(raw, providers=["CPUExecutionProvider"])
        (logits,) = session.run(["logits"], {"features": exported.validation})
    want = exported.float_logits
    agreement = float(np.mean(logits.argmax(1) == want.argmax(1)))
    assert report["method"] == method and report["agreement"] == pytest.approx(agreement, abs=0.01)
    scale = float(np.abs(want).max())
    if method == "none":
        np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * scale)
    elif method == "fp16":  # half precision: about three significant digits
        np.testing.assert_allclose(logits, want, rtol=1e-2, atol=1e-2 * scale)
    else:  # INT8: the same decisions, logits within a few quantization steps
        assert agreement >= 0.97
        assert float(np.abs(logits - want).max()) < 0.1 * scale


def _version_count(work: Path) -> int:
    if not (work / "registry.db").exists():
        return 0
    registry = open_registry(f"sqlite:///{work / 'registry.db'}", create=False)
    try:
        return len(registry.list_versions("clf")) if "clf" in registry.list_models() else 0
    finally:
        registry.close()


def test_a_model_copied_without_its_data_file_is_refused_naming_both(
    exported: Exported, publisher: Path, tmp_path: Path
) -> None:
    lone = tmp_path / "copied"
    lone.mkdir()
    (lone / "model.onnx").write_bytes(exported.model.read_bytes())
    before = _version_count(publisher)
    line = one_error_line(
        _publish(publisher, lone / "model.onnx"), 1, f"{lone / 'model.onnx'}", "model.onnx.data"
    )
    assert "tandem-" not in line  # no temporary folder of ours
    assert _version_count(publisher) == before


def test_a_data_location_outside_the_models_folder_is_refused(
    exported: Exported, tmp_path: Path
) -> None:
    import onnx

    model = onnx.load_model(str(exported.model), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../model.onnx.data"
    (tmp_path / "model.onnx.data").write_bytes(
        (exported.directory / "model.onnx.data").read_bytes()
    )
    inner = tmp_path / "inner"
    inner.mkdir()
    onnx.save_model(model, str(inner / "model.onnx"))
    with pytest.raises(PublishError, match="outside") as refused:
        publish_model(
            inner / "model.onnx",
            name="clf",
            signing_key=SigningKey.generate(),
            registry=open_registry(f"sqlite:///{tmp_path / 'r.db'}"),
            store=LocalBlobStore(tmp_path / "blobs"),
            quantize="none",
        )
    assert str(inner / "model.onnx") in str(refused.value)


def test_model_bytes_that_name_external_files_are_refused_not_resolved_here(
    exported: Exported,
) -> None:
    """Bytes cannot say where their weights are; ONNX Runtime would look in the current
    directory, which may hold another model's data file."""
    raw = exported.model.read_bytes()
    with pytest.raises(PublishError, match=r"external files \(model.onnx.data\)"):
        publish_model(
            raw,
            name="clf",
            signing_key=SigningKey.generate(),
            registry=open_registry("sqlite:///:memory:"),
            store=LocalBlobStore(exported.directory / "unused-blobs"),
            quantize="none",
        )
    with pytest.raises(QuantizationError, match=r"my-model\.onnx") as failed:
        quantize_model(raw, "int8-dynamic", input_name="features", label="my-model.onnx")
    assert "tandem-quantize" not in str(failed.value)
