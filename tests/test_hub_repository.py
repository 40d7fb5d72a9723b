"""Model repository loading, config validation, and the executors against numpy."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from cloud_hub import (
    CallableExecutor,
    ModelConfig,
    ModelConfigError,
    ModelNotFoundError,
    ModelRepository,
    OnnxExecutor,
    RepositoryError,
    TensorSpec,
    TorchExecutor,
)

from ._models import linear_classifier_weights, write_linear_classifier

ROOT = Path(__file__).resolve().parents[1]


def expected_logits(x: np.ndarray, seed: int = 0) -> np.ndarray:
    weight, bias = linear_classifier_weights(seed=seed)
    return x @ weight + bias


def sample(rows: int = 5) -> np.ndarray:
    return np.random.default_rng(42).normal(size=(rows, 16)).astype(np.float32)


def add_onnx(repo: Path, name: str = "linear", version: int = 1, seed: int = 0) -> Path:
    return write_linear_classifier(repo / name / str(version) / "model.onnx", seed=seed)


def write_config(repo: Path, name: str, config: object) -> Path:
    path = repo / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def torch_linear(seed: int = 0):
    import torch

    weight, bias = linear_classifier_weights(seed=seed)
    module = torch.nn.Linear(16, 4)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(weight.T.copy()))
        module.bias.copy_(torch.from_numpy(bias))
    return module.eval()


LINEAR_CONFIG = {
    "inputs": [{"name": "x", "datatype": "FP32", "dims": [16]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "dims": [4]}],
}


# -- loading -----------------------------------------------------------------------------


def test_a_model_without_config_is_described_by_its_onnx_file(tmp_path):
    add_onnx(tmp_path)
    repo = ModelRepository.from_directory(tmp_path)
    served = repo.get("linear")
    config = served.config
    assert (served.version, config.platform, config.max_batch_size) == ("1", "onnxruntime", 64)
    assert config.inputs == (TensorSpec("x", "FP32", (16,)),)
    assert config.outputs == (TensorSpec("logits", "FP32", (4,)),)
    assert served.executor.device == "CPUExecutionProvider"  # this machine has no GPU
    repo.close()


def test_the_highest_version_is_served_unless_the_config_says_otherwise(tmp_path):
    add_onnx(tmp_path, version=1, seed=1)
    add_onnx(tmp_path, version=3, seed=3)
    (tmp_path / "linear" / "notes").mkdir()  # not a version: ignored
    repo = ModelRepository.from_directory(tmp_path)
    latest = repo.get("linear")
    x = sample()
    assert latest.version == "3"
    np.testing.assert_allclose(
        latest.executor.run_batch({"x": x})["logits"], expected_logits(x, 3), rtol=1e-5, atol=1e-5
    )
    repo.close()
    write_config(tmp_path, "linear", {"default_version": 1})
    pinned = ModelRepository.from_directory(tmp_path)
    assert pinned.get("linear").version == "1"
    pinned.close()


def test_a_config_may_restate_and_tune_what_the_model_says(tmp_path):
    add_onnx(tmp_path)
    write_config(
        tmp_path,
        "linear",
        {
            **LINEAR_CONFIG,
            "platform": "onnxruntime",
            "max_batch_size": 8,
            "max_queue_delay_ms": 0.5,
            "max_queue_size": 10,
        },
    )
    config = ModelRepository.from_directory(tmp_path).get("linear").config
    assert (config.max_batch_size, config.max_queue_delay_ms, config.max_queue_size) == (8, 0.5, 10)


def test_a_request_for_an_unknown_model_or_version_is_not_found(tmp_path):
    add_onnx(tmp_path, version=2)
    repo = ModelRepository.from_directory(tmp_path)
    assert repo.get("linear", "2").version == "2"
    with pytest.raises(ModelNotFoundError, match="no model 'resnet'"):
        repo.get("resnet")
    with pytest.raises(ModelNotFoundError, match="serving version 2"):
        repo.get("linear", "1")


def test_entries_starting_with_dot_or_underscore_are_skipped(tmp_path):
    add_onnx(tmp_path)
    (tmp_path / ".cache").mkdir()
    (tmp_path / "_staging").mkdir()
    assert [m.name for m in ModelRepository.from_directory(tmp_path)] == ["linear"]


# -- bad repositories and configs: one line naming the file and the field -----------------


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ("{not json", ["config.json", "not valid JSON"]),
        ({"max_batch": 8}, ["config.json", "unknown keys ['max_batch']"]),
        ({"max_batch_size": -1}, ["config.json", "max_batch_size", ">= 0"]),
        ({"max_queue_delay_ms": "fast"}, ["max_queue_delay_ms", "non-negative number"]),
        ({"max_queue_size": 0}, ["max_queue_size", ">= 1"]),
        ({"platform": "tensorflow"}, ["platform", "onnxruntime, torch"]),
        ({"platform": "torch"}, ["no model file", "model.pt"]),
        ({"default_version": 7}, ["default_version", "[1]"]),
        ({"inputs": {"x": 1}}, ["inputs", "must be a list"]),
        (
            {"inputs": [{"name": "x", "datatype": "FLOAT", "dims": [16]}]},
            ["inputs[0]", "unknown datatype 'FLOAT'"],
        ),
        ({"inputs": [{"name": "x", "datatype": "FP32", "dims": [0]}]}, ["inputs[0]", "dims"]),
        (
            {"inputs": [{"name": "image", "datatype": "FP32", "dims": [16]}]},
            ["inputs", "['image'] do not match the model's ['x']"],
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "dims": [1, 16]}]},
            ["inputs", "x: FP32[1, 16] does not match", "exclude the batch dimension"],
        ),
        (
            {"outputs": [{"name": "logits", "datatype": "FP16", "dims": [4]}]},
            ["outputs", "logits: FP16[4] does not match"],
        ),
    ],
)
def test_a_bad_config_is_refused_with_file_and_field(tmp_path, config, fragments):
    add_onnx(tmp_path)
    write_config(tmp_path, "linear", config)
    with pytest.raises(RepositoryError) as caught:
        ModelRepository.from_directory(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_a_model_directory_without_versions_is_refused(tmp_path):
    write_config(tmp_path, "linear", {})
    with pytest.raises(RepositoryError, match=r"no version directories .*1/model\.onnx"):
        ModelRepository.from_directory(tmp_path)


def test_a_version_without_a_model_file_is_refused(tmp_path):
    (tmp_path / "linear" / "1").mkdir(parents=True)
    with pytest.raises(RepositoryError, match="no model file"):
        ModelRepository.from_directory(tmp_path)


def test_two_model_files_need_a_platform(tmp_path):
    add_onnx(tmp_path)
    (tmp_path / "linear" / "1" / "model.pt").write_bytes(b"")
    with pytest.raises(ModelConfigError, match=r"platform: .*say which one"):
        ModelRepository.from_directory(tmp_path)


def test_a_corrupt_model_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "linear" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a protobuf")
    with pytest.raises(RepositoryError, match=r"model\.onnx: ONNX Runtime cannot load it"):
        ModelRepository.from_directory(tmp_path)


def test_a_torch_model_needs_its_tensors_in_the_config(tmp_path):
    path = tmp_path / "linear" / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    with pytest.raises(ModelConfigError, match="inputs and outputs: required for torch"):
        ModelRepository.from_directory(tmp_path)


def test_an_invalid_model_name_is_refused(tmp_path):
    add_onnx(tmp_path, name="bad name")
    with pytest.raises(ModelConfigError, match="model directory name"):
        ModelRepository.from_directory(tmp_path)


def test_the_repository_must_be_a_directory(tmp_path):
    with pytest.raises(RepositoryError, match="not a directory"):
        ModelRepository.from_directory(tmp_path / "missing")


def test_loading_is_all_or_nothing(tmp_path):
    add_onnx(tmp_path, name="a-good-one")
    add_onnx(tmp_path, name="b-bad-one")
    write_config(tmp_path, "b-bad-one", {"max_batch_size": "lots"})
    repo = ModelRepository()
    with pytest.raises(ModelConfigError):
        repo.load_directory(tmp_path)
    assert len(repo) == 0


def test_a_fixed_batch_dimension_means_no_batching(tmp_path):
    import onnx

    path = add_onnx(tmp_path)
    model = onnx.load(str(path))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, str(path))
    assert ModelRepository.from_directory(tmp_path).get("linear").config.max_batch_size == 0
    write_config(tmp_path, "linear", {"max_batch_size": 8})
    with pytest.raises(ModelConfigError, match="no variable batch dimension; set max_batch_size"):
        ModelRepository.from_directory(tmp_path)


# -- programmatic registration ------------------------------------------------------------


def test_a_python_executor_can_be_registered_with_a_config():
    repo = ModelRepository()
    config = ModelConfig.from_json({**LINEAR_CONFIG, "max_batch_size": 4})
    served = repo.add(
        "double", CallableExecutor(lambda i: {"logits": i["x"][:, :4] * 2}), config=config
    )
    assert (served.label, served.config.platform, served.config.max_batch_size) == (
        "double@1",
        "custom",
        4,
    )
    assert "double" in repo


def test_a_python_executor_without_a_config_is_refused():
    with pytest.raises(ModelConfigError, match="inputs: required"):
        ModelRepository().add("mystery", CallableExecutor(lambda i: i))


def test_a_model_that_fails_its_warm_up_is_not_served():
    def broken(inputs):
        raise RuntimeError("kernel not found")

    repo = ModelRepository()
    with pytest.raises(RepositoryError, match=r"warm-up batch failed: .*kernel not found"):
        repo.add("broken", CallableExecutor(broken), config=ModelConfig.from_json(LINEAR_CONFIG))
    assert "broken" not in repo


# -- executors give numpy's answers ---------------------------------------------------------


def test_the_onnx_executor_matches_numpy(linear_onnx):
    executor = OnnxExecutor(linear_onnx)
    assert executor.inputs == (TensorSpec("x", "FP32", (None, 16)),)
    x = sample(7)
    out = executor.run_batch({"x": x})
    np.testing.assert_allclose(out["logits"], expected_logits(x), rtol=1e-5, atol=1e-5)


def test_the_torch_executor_runs_an_nn_module_like_numpy():
    executor = TorchExecutor(torch_linear(), input_names=["x"], output_names=["logits"])
    assert executor.device == "cpu"  # CUDA when torch.cuda.is_available()
    x = sample(3)
    out = executor.run_batch({"x": x})
    np.testing.assert_allclose(out["logits"], expected_logits(x), rtol=1e-5, atol=1e-5)


def test_a_torchscript_model_in_the_repository_matches_numpy(tmp_path):
    import torch

    path = tmp_path / "linear" / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    with warnings.catch_warnings():  # torch.jit.trace is deprecated upstream, still widespread
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.trace(torch_linear(), torch.zeros(1, 16)), str(path))
    write_config(tmp_path, "linear", LINEAR_CONFIG)
    served = ModelRepository.from_directory(tmp_path).get("linear")
    assert (served.config.platform, served.config.max_batch_size) == ("torch", 64)
    x = sample(6)
    np.testing.assert_allclose(
        served.executor.run_batch({"x": x})["logits"], expected_logits(x), rtol=1e-5, atol=1e-5
    )


def test_serving_onnx_models_never_imports_torch(tmp_path):
    add_onnx(tmp_path)
    script = (
        "import sys, numpy as np\n"
        "from cloud_hub import ModelRepository\n"
        f"repo = ModelRepository.from_directory({str(tmp_path)!r})\n"
        "repo.get('linear').executor.run_batch({'x': np.zeros((2, 16), np.float32)})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=60)
