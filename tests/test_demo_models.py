"""The demo's data splits and model pipeline: real digits, a reduced recipe, a temporary cache."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from model_cdn import LocalBlobStore, open_registry, publish_model
from shared import SigningKey, decompress_blob
from tandem.demo import models as _training
from tandem.demo.data import DigitSplits, load_digit_splits
from tandem.demo.models import (
    HUB_MODEL_CONFIG,
    MODEL_NAME,
    QUANTIZATION,
    DemoModels,
    TrainingRecipe,
    build_demo_models,
    default_cache_dir,
)

# One epoch on a stratified subset: exercises every stage in seconds.
TINY = TrainingRecipe(
    train_size=300, calibration_size=50, test_size=100, edge_epochs=1, cloud_epochs=1
)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tandem-cache")


@pytest.fixture(scope="module")
def built(tiny_cache: Path) -> tuple[DemoModels, list[tuple[str, float]]]:
    calls: list[tuple[str, float]] = []
    models = build_demo_models(tiny_cache, recipe=TINY, progress=lambda s, f: calls.append((s, f)))
    return models, calls


def _images(n: int) -> np.ndarray:
    return np.ascontiguousarray(load_digit_splits().test_images[:n])


# ------------------------------------------------------------------------ data


def test_default_splits_shapes_and_types() -> None:
    s = load_digit_splits()
    assert s.sizes == {"train": 3000, "calibration": 500, "test": 1500}
    for images, labels in (
        (s.train_images, s.train_labels),
        (s.calibration_images, s.calibration_labels),
        (s.test_images, s.test_labels),
    ):
        assert images.dtype == np.float32 and images.shape == (len(labels), 1, 28, 28)
        assert labels.dtype == np.int64
        assert images.min() >= 0.0 and images.max() <= 1.0
        assert not images.flags.writeable and not labels.flags.writeable


def test_splits_are_stratified() -> None:
    s = load_digit_splits()
    assert np.array_equal(np.bincount(s.train_labels, minlength=10), [300] * 10)
    assert np.array_equal(np.bincount(s.calibration_labels, minlength=10), [50] * 10)
    assert np.array_equal(np.bincount(s.test_labels, minlength=10), [150] * 10)
    small = load_digit_splits(train=100, calibration=20, test=50)
    assert np.array_equal(np.bincount(small.train_labels, minlength=10), [10] * 10)
    assert np.array_equal(np.bincount(small.calibration_labels, minlength=10), [2] * 10)
    assert np.array_equal(np.bincount(small.test_labels, minlength=10), [5] * 10)


def test_splits_are_disjoint_and_cover_all_digits() -> None:
    s = load_digit_splits(train=3000, calibration=500, test=1500)
    rows = [
        {image.tobytes() for image in part}
        for part in (s.train_images, s.calibration_images, s.test_images)
    ]
    assert [len(r) for r in rows] == [3000, 500, 1500]  # the 5,000 digits are all distinct
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])


def test_splits_are_deterministic_per_seed() -> None:
    a, b = load_digit_splits(seed=3), load_digit_splits(seed=3)
    c = load_digit_splits(seed=4)
    for field in dataclasses.fields(DigitSplits):
        if field.name != "seed":
            assert np.array_equal(getattr(a, field.name), getattr(b, field.name))
    assert not np.array_equal(a.test_labels, c.test_labels)


@pytest.mark.parametrize(
    "sizes", [{"train": 0}, {"test": -1}, {"train": 4000, "calibration": 500, "test": 1000}]
)
def test_bad_split_sizes_are_refused(sizes: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="split sizes"):
        load_digit_splits(**sizes)


# --------------------------------------------------------------------- recipe


def test_recipe_key_covers_every_field() -> None:
    assert TINY.key() == dataclasses.replace(TINY).key()
    assert len({TINY.key(), dataclasses.replace(TINY, seed=1).key(), TrainingRecipe().key()}) == 3


def test_recipe_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="edge_epochs"):
        TrainingRecipe(edge_epochs=0)
    with pytest.raises(ValueError, match="opset"):
        TrainingRecipe(opset=13)


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TANDEM_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "tandem"


# ---------------------------------------------------------------- the build


def test_onnx_models_run_with_a_dynamic_batch(built: tuple[DemoModels, list]) -> None:
    models, _ = built
    for path in (models.edge_float_onnx, models.edge_int8_onnx, models.cloud_onnx):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["image"]
        assert [o.name for o in session.get_outputs()] == ["logits"]
        for n in (1, 7):
            (logits,) = session.run(["logits"], {"image": _images(n)})
            assert logits.shape == (n, 10) and logits.dtype == np.float32
            assert np.isfinite(logits).all()


def test_int8_model_is_qdq_and_smaller(built: tuple[DemoModels, list]) -> None:
    models, _ = built
    float_ops = {n.op_type for n in onnx.load(str(models.edge_float_onnx)).graph.node}
    int8 = onnx.load(str(models.edge_int8_onnx))
    int8_ops = {n.op_type for n in int8.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= int8_ops
    assert not {"QuantizeLinear", "DequantizeLinear"} & float_ops
    assert models.edge_int8_onnx.stat().st_size < models.edge_float_onnx.stat().st_size
    for path in (models.edge_float_onnx, models.edge_int8_onnx, models.cloud_onnx):
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        # only the standard domain, at the recipe's opset: nothing runtime-specific
        assert [(o.domain, o.version) for o in model.opset_import] == [("", TINY.opset)]


def test_int8_model_is_what_the_publish_pipeline_makes(
    built: tuple[DemoModels, list], tmp_path: Path
) -> None:
    """One quantizer: the cached INT8 file is the publish pipeline's output, byte for byte."""
    models, _ = built
    splits = TINY.splits()
    store = LocalBlobStore(tmp_path / "blobs")
    result = publish_model(
        models.edge_float_onnx,
        name="demo-edge",
        registry=open_registry(f"sqlite:///{tmp_path / 'registry.db'}"),
        store=store,
        signing_key=SigningKey.generate(),
        quantize=QUANTIZATION,
        calibration=splits.calibration_images,
        validation=(splits.test_images, splits.test_labels),
        min_agreement=0.0,  # a one-epoch model: the gate is not what this checks
    )
    blob = result.manifest.blob
    published = decompress_blob(store.get(blob.digest), blob.raw_size)
    assert published == models.edge_int8_onnx.read_bytes()
    assert result.report["calibration_samples"] == len(splits.calibration_images)
    assert models.report["quantization"]["method"] == result.report["method"] == QUANTIZATION


def test_hub_repository_layout(built: tuple[DemoModels, list]) -> None:
    models, _ = built
    model_dir = models.hub_repository / MODEL_NAME
    assert json.loads((model_dir / "config.json").read_text()) == dict(HUB_MODEL_CONFIG)
    assert (model_dir / "1" / "model.onnx").read_bytes() == models.cloud_onnx.read_bytes()
    assert sorted(p.name for p in models.hub_repository.iterdir()) == [MODEL_NAME]


def test_report_is_saved_and_complete(built: tuple[DemoModels, list]) -> None:
    models, _ = built
    report = models.report
    assert json.loads((models.directory / "report.json").read_text()) == report
    assert report["recipe_key"] == TINY.key()
    assert 2_000 <= report["params"]["edge"] <= 6_000
    assert 100_000 <= report["params"]["cloud"] <= 500_000
    assert set(report["accuracy"]) == {"edge_float", "edge_int8", "cloud"}
    assert all(0.0 <= v <= 1.0 for v in report["accuracy"].values())
    assert 0.0 <= report["agreement_int8_vs_float"] <= 1.0
    assert report["test_samples"] == TINY.test_size
    assert {"data", "train_edge", "train_cloud", "export", "quantize", "total"} <= set(
        report["timings_s"]
    )
    assert max(report["export_max_abs_diff"].values()) < 1e-3  # ONNX matches torch


def test_progress_reports_each_stage_to_completion(built: tuple[DemoModels, list]) -> None:
    _, calls = built
    stages = list(dict.fromkeys(stage for stage, _ in calls))
    assert stages == [
        "load digits",
        "train edge model",
        "train cloud model",
        "export ONNX",
        "quantize edge to INT8",
        "evaluate",
    ]
    assert all(0.0 <= f <= 1.0 for _, f in calls)
    for stage in stages:
        assert [f for s, f in calls if s == stage][-1] == 1.0


def test_second_call_loads_from_cache(
    built: tuple[DemoModels, list], tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models, _ = built
    files = sorted(p for p in models.directory.rglob("*") if p.is_file())
    mtimes = [p.stat().st_mtime_ns for p in files]

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached entry should have been reused")

    monkeypatch.setattr(_training, "_build", no_build)
    calls: list[tuple[str, float]] = []
    again = build_demo_models(tiny_cache, recipe=TINY, progress=lambda s, f: calls.append((s, f)))
    assert again.directory == models.directory and again.report == models.report
    assert [p.stat().st_mtime_ns for p in files] == mtimes
    assert calls == [("load cached models", 1.0)]


def _fake_build(built: list[str]) -> Callable[[Path, TrainingRecipe, object], None]:
    """A stand-in for the real pipeline that writes a valid-looking entry instantly."""

    def build(out: Path, recipe: TrainingRecipe, progress: object) -> None:
        built.append(recipe.key())
        for name in _training._FILES.values():
            (out / name).write_bytes(b"onnx")
        hub = out / "hub" / MODEL_NAME
        (hub / "1").mkdir(parents=True)
        (hub / "1" / "model.onnx").write_bytes(b"onnx")
        (hub / "config.json").write_text("{}")
        (out / "report.json").write_text(json.dumps({"recipe_key": recipe.key()}))

    return build


def test_recipe_change_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys: list[str] = []
    monkeypatch.setattr(_training, "_build", _fake_build(keys))
    a = build_demo_models(tmp_path, recipe=TINY)
    assert build_demo_models(tmp_path, recipe=TINY).directory == a.directory
    b = build_demo_models(tmp_path, recipe=dataclasses.replace(TINY, cloud_lr=1e-3))
    assert b.directory != a.directory and a.directory.exists()
    assert keys == [TINY.key(), dataclasses.replace(TINY, cloud_lr=1e-3).key()]
    build_demo_models(tmp_path, recipe=TINY, rebuild=True)
    assert len(keys) == 3


def test_incomplete_entry_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys: list[str] = []
    monkeypatch.setattr(_training, "_build", _fake_build(keys))
    models = build_demo_models(tmp_path, recipe=TINY)
    models.edge_int8_onnx.unlink()
    again = build_demo_models(tmp_path, recipe=TINY)
    assert again.edge_int8_onnx.exists() and len(keys) == 2


def test_interrupted_build_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_written_export(model: object, path: Path, *args: object) -> float:
        path.write_bytes(b"half an onnx file")
        raise KeyboardInterrupt

    monkeypatch.setattr(_training, "_export", half_written_export)
    with pytest.raises(KeyboardInterrupt):
        build_demo_models(tmp_path, recipe=dataclasses.replace(TINY, train_size=100, test_size=20))
    assert list(tmp_path.iterdir()) == []  # neither an entry nor a temporary directory


def test_same_recipe_builds_identical_models(
    built: tuple[DemoModels, list], tmp_path: Path
) -> None:
    models, _ = built
    again = build_demo_models(tmp_path, recipe=TINY)
    assert again.directory != models.directory
    for name in ("edge_float_onnx", "edge_int8_onnx", "cloud_onnx"):
        assert getattr(again, name).read_bytes() == getattr(models, name).read_bytes(), name
    assert again.report["accuracy"] == models.report["accuracy"]
