"""``tandem models refine``: the edge model fine-tuned on collected examples, published only
when it beats the version in service on the held-out sets.

Real parts: the demo's models (trained here or cached), the real publish
pipeline into a SQLite registry and a local blob store, ONNX Runtime to judge,
torch to train. The examples are drifted digits kept the way the hub keeps
them (``tests/_lessons.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from model_cdn import open_registry, publish_model
from model_cdn.publish import LocalTarget
from shared import SigningKey
from shared.server.store import LocalBlobStore
from tandem.demo.data import DigitSplits, load_digit_splits
from tandem.demo.drift import Drift
from tandem.demo.models import DemoModels, build_demo_models
from tandem.learning import (
    RefineError,
    RefineRefusedError,
    RefineSettings,
    TrainingData,
    refine_model,
    torch_from_onnx,
)

from ._cli import tandem
from ._lessons import collect_offline, logits_of
from ._models import write_linear_classifier

MODEL = "mnist-edge"
DRIFT = Drift(shift_px=(1, 3))


@pytest.fixture(scope="module")
def demo() -> DemoModels:
    return build_demo_models()


@pytest.fixture(scope="module")
def digits() -> DigitSplits:
    return load_digit_splits()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, digits: DigitSplits) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("refine-files")
    out = {
        "validation": root / "validation.npz",
        "calibration": root / "calibration.npz",
        "replay": root / "replay.npz",
    }
    np.savez(out["validation"], inputs=digits.calibration_images, labels=digits.calibration_labels)
    np.savez(out["calibration"], inputs=digits.calibration_images)
    np.savez(out["replay"], inputs=digits.train_images, labels=digits.train_labels)
    return out


@pytest.fixture(scope="module")
def examples(
    tmp_path_factory: pytest.TempPathFactory, demo: DemoModels, digits: DigitSplits
) -> LocalBlobStore:
    """What a hub kept from two drifted passes over the training digits."""
    store = LocalBlobStore(tmp_path_factory.mktemp("examples"))
    live = np.concatenate([DRIFT.apply(digits.train_images, seed=s) for s in (1, 2)])
    assert collect_offline(store, demo.edge_int8_onnx, demo.cloud_onnx, live) > 400
    return store


class Cdn:
    def __init__(self, root: Path, demo: DemoModels, digits: DigitSplits) -> None:
        self.key = SigningKey.generate()
        self.key_file = root / "publisher.key"
        self.key_file.write_text(self.key.to_text())
        self.registry_url = f"sqlite:///{root / 'registry.db'}"
        self.registry = open_registry(self.registry_url)
        self.store_dir = root / "blobs"
        self.target = LocalTarget(self.registry, LocalBlobStore(self.store_dir))
        publish_model(
            demo.edge_float_onnx,
            name=MODEL,
            target=self.target,
            signing_key=self.key,
            calibration=digits.calibration_images,
            validation=(digits.test_images, digits.test_labels),
        )

    def latest(self) -> int:
        return self.registry.get_version(MODEL).version


@pytest.fixture
def cdn(tmp_path: Path, demo: DemoModels, digits: DigitSplits) -> Any:
    cdn = Cdn(tmp_path, demo, digits)
    yield cdn
    cdn.registry.close()


def settings(
    demo: DemoModels, files: dict[str, Path], store: LocalBlobStore, out: Path, **changes: Any
) -> RefineSettings:
    return RefineSettings(
        model=MODEL,
        examples=str(store.root),
        base=demo.edge_float_onnx,
        validation=files["validation"],
        calibration=files["calibration"],
        replay=files["replay"],
        out_dir=out,
        **changes,
    )


# --------------------------------------------------------------------------- rebuilding


@pytest.mark.parametrize("which", ["edge_float_onnx", "cloud_onnx"])
def test_the_demo_models_are_rebuilt_as_torch_modules_that_compute_the_same(
    demo: DemoModels, digits: DigitSplits, which: str
) -> None:
    path = getattr(demo, which)
    chain = torch_from_onnx(path.read_bytes())
    assert (chain.input_name, chain.output_name) == ("image", "logits")
    x = np.array(digits.test_images[:64])  # writable: torch.from_numpy wants one
    with torch.no_grad():
        rebuilt = chain.module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(rebuilt, logits_of(path, x), atol=1e-4)


def test_a_matmul_add_classifier_is_rebuilt(tmp_path: Path) -> None:
    path = write_linear_classifier(tmp_path / "linear.onnx")
    chain = torch_from_onnx(path.read_bytes())
    x = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    with torch.no_grad():
        rebuilt = chain.module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(rebuilt, logits_of(path, x), atol=1e-5)


def test_a_graph_that_is_not_a_chain_is_refused_with_the_node_named() -> None:
    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"], name="squash")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(RefineError, match=r"Sigmoid 'squash'.*--trainer"):
        torch_from_onnx(model.SerializeToString())
    with pytest.raises(RefineError, match="not an ONNX file"):
        torch_from_onnx(b"garbage")


# --------------------------------------------------------------------------- the job


def test_refine_publishes_a_version_better_on_the_drift_and_not_worse_on_the_rest(
    tmp_path: Path, cdn: Cdn, demo: DemoModels, files: dict[str, Path], examples: LocalBlobStore,
    digits: DigitSplits,
) -> None:  # fmt: skip
    report = refine_model(
        settings(demo, files, examples, tmp_path / "out"), target=cdn.target, signing_key=cdn.key
    )
    assert report.version == 2 and cdn.latest() == 2
    assert report.candidate.held_out_agreement > report.current.held_out_agreement + 0.05
    assert report.candidate.validation_accuracy >= report.current.validation_accuracy - 0.005
    assert report.examples["reasons"]["disagree"] > report.examples["reasons"]["sample"] > 0
    record = cdn.registry.get_version(MODEL, 2).manifest["signed"]
    assert record["quantization"]["method"] == "int8-static"
    # The new float model is the next job's base, and it does better on unseen drifted digits.
    float_model = Path(report.files["float_model"])
    shifted = DRIFT.apply(digits.test_images, seed=99)
    before = (logits_of(demo.edge_float_onnx, shifted).argmax(1) == digits.test_labels).mean()
    after = (logits_of(float_model, shifted).argmax(1) == digits.test_labels).mean()
    assert after > before + 0.05
    saved = json.loads(Path(report.files["report"]).read_text())
    assert saved["version"] == 2 and saved["refused"] is False


def worse(data: TrainingData) -> torch.nn.Module:
    """A trainer that ruins the model: its last layer's weights shuffled."""
    module = torch_from_onnx(data.base_onnx).module
    last = [m for m in module if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        flat = last.weight.flatten()
        last.weight.copy_(flat[torch.randperm(len(flat))].reshape(last.weight.shape))
    return module


def test_a_worse_refinement_is_refused_with_both_reports_and_nothing_published(
    tmp_path: Path, cdn: Cdn, demo: DemoModels, files: dict[str, Path], examples: LocalBlobStore
) -> None:
    job = settings(demo, files, examples, tmp_path / "out", trainer="tests.test_refine:worse")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "refine-report.json").write_text("the last job's report")
    older = (tmp_path / "out" / "refine-report.json").stat().st_ino
    with pytest.raises(RefineRefusedError) as refused:
        refine_model(job, target=cdn.target, signing_key=cdn.key)
    report = refused.value.report
    assert cdn.latest() == 1  # nothing published
    assert report.version is None and report.refused
    assert report.current.label == f"{MODEL}@1" and report.candidate.label == "candidate"
    assert report.candidate.validation_accuracy < report.current.validation_accuracy - 0.005
    assert any("validation" in why for why in report.refusals)
    saved = json.loads((tmp_path / "out" / "refine-report.json").read_text())
    assert saved["refused"] is True and saved["current"] == {
        "label": f"{MODEL}@1",
        "held_out_agreement": report.current.held_out_agreement,
        "validation_accuracy": report.current.validation_accuracy,
    }
    assert not list((tmp_path / "out").glob("*.onnx"))
    # written aside and renamed over the last one (whole or not at all), nothing left aside
    assert (tmp_path / "out" / "refine-report.json").stat().st_ino != older
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["refine-report.json"]


def test_a_candidate_that_gains_too_little_is_refused(
    tmp_path: Path, cdn: Cdn, demo: DemoModels, files: dict[str, Path], examples: LocalBlobStore
) -> None:
    job = settings(
        demo, files, examples, tmp_path / "out", min_gain=0.99, trainer_options={"epochs": "1"}
    )
    with pytest.raises(RefineRefusedError, match="held-out collected examples"):
        refine_model(job, target=cdn.target, signing_key=cdn.key)
    assert cdn.latest() == 1


def test_examples_kept_without_inputs_cannot_train(
    tmp_path: Path, cdn: Cdn, demo: DemoModels, files: dict[str, Path], digits: DigitSplits
) -> None:
    private = LocalBlobStore(tmp_path / "private")
    live = DRIFT.apply(digits.train_images[:1000], seed=3)
    collect_offline(private, demo.edge_int8_onnx, demo.cloud_onnx, live, keep_inputs=False)
    with pytest.raises(RefineError, match="keep no inputs"):
        refine_model(
            settings(demo, files, private, tmp_path / "out"), target=cdn.target, signing_key=cdn.key
        )


def test_a_trainer_that_cannot_be_loaded_or_an_unknown_option_is_one_clear_error(
    tmp_path: Path, cdn: Cdn, demo: DemoModels, files: dict[str, Path], examples: LocalBlobStore
) -> None:
    for changes, match in [
        ({"trainer": "no_such_module:train"}, "cannot import"),
        ({"trainer": "tests.test_refine:missing"}, "no function 'missing'"),
        ({"trainer": "just-a-name"}, "MODULE:FUNC"),
        ({"trainer_options": {"epoch": "3"}}, "no option epoch"),
    ]:
        with pytest.raises(RefineError, match=match):
            refine_model(
                settings(demo, files, examples, tmp_path / "out", **changes),
                target=cdn.target,
                signing_key=cdn.key,
            )
    assert cdn.latest() == 1


# --------------------------------------------------------------------------- the command


def test_the_command_refuses_with_both_figures_and_exits_1(
    tmp_path: Path, cdn: Cdn, demo: DemoModels, files: dict[str, Path], examples: LocalBlobStore
) -> None:
    cdn.registry.close()  # the command opens it itself
    common = [
        "models", "refine", MODEL, "--examples", str(examples.root),
        "--base", str(demo.edge_float_onnx), "--validation", str(files["validation"]),
        "--calibration", str(files["calibration"]), "--replay", str(files["replay"]),
        "--sign-key", str(cdn.key_file), "--registry", cdn.registry_url,
        "--store", str(cdn.store_dir), "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    refused = tandem(*common, "--trainer", "tests.test_refine:worse")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "refused: on" in refused.stdout and f"{MODEL}@1" in refused.stdout
    assert "nothing published" in refused.stderr
    done = tandem(*common, "--trainer-option", "epochs=20")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"published {MODEL}@2" in done.stdout
    registry = open_registry(cdn.registry_url)
    try:
        assert registry.get_version(MODEL).version == 2
    finally:
        registry.close()
    bad = tandem(*common, "--trainer-option", "epochs")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
