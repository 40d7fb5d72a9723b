"""Where models run: providers per device, TensorRT profiles, fp16 checks, instance groups.

The GPU paths themselves need a GPU (bench part c runs them where one exists);
what decides them is pure and tested here, on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cloud_hub import ModelConfig, ModelConfigError, OnnxExecutor, RepositoryError, TensorSpec
from cloud_hub.executors._onnx_gpu import cuda_index, fp16_agrees, providers_for, trt_profile
from cloud_hub.plane._spec import PlaneSpec, plan_executors
from cloud_hub.repository._config import InstanceGroup

from ._models import write_linear_classifier

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
TRT = ["TensorrtExecutionProvider", *CUDA]


def test_providers_follow_the_device_asked_for() -> None:
    assert providers_for("cpu", available=TRT) == ["CPUExecutionProvider"]
    assert providers_for(None, available=["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert providers_for("cuda:1", available=CUDA) == [
        ("CUDAExecutionProvider", {"device_id": 1}),
        "CPUExecutionProvider",
    ]
    trt = providers_for("cuda", available=TRT, trt_shapes=("x:1x4", "x:64x4", "x:64x4"), fp16=True)
    name, options = trt[0]
    assert name == "TensorrtExecutionProvider" and options["device_id"] == 0
    assert options["trt_fp16_enable"] is True and options["trt_profile_max_shapes"] == "x:64x4"
    assert trt[1] == ("CUDAExecutionProvider", {"device_id": 0})


def test_asking_for_a_gpu_without_one_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no CUDA provider"):
        providers_for("cuda:0", available=["CPUExecutionProvider"])
    model = write_linear_classifier(tmp_path / "m.onnx")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RepositoryError, match="no CUDA provider"):
            OnnxExecutor(model, device="cuda:0")
    with pytest.raises(RepositoryError, match="unknown device"):
        cuda_index("gpu0")


def test_the_executor_reports_where_it_runs(tmp_path: Path) -> None:
    executor = OnnxExecutor(write_linear_classifier(tmp_path / "m.onnx"), device="cpu", fp16=True)
    assert executor.device == "CPUExecutionProvider"
    executor.warm_up([TensorSpec("x", "FP32", (16,))], batched=True)  # fp16 is for GPUs only
    assert executor.fp16 is False
    out = executor.run({"x": np.ones((2, 16), np.float32)})
    assert out["logits"].dtype == np.float32


def test_tensorrt_profiles_span_batch_one_to_the_maximum() -> None:
    specs = [TensorSpec("image", "FP32", (None, 1, 28, 28)), TensorSpec("k", "INT64", (None,))]
    low, high, best = trt_profile(specs, 64)  # type: ignore[misc]
    assert low == "image:1x1x28x28,k:1" and high == best == "image:64x1x28x28,k:64"
    assert trt_profile(specs, 0) is None  # no batch dimension: TensorRT picks
    assert trt_profile([TensorSpec("t", "INT64", (None, None))], 8) is None  # free length


def test_fp16_is_kept_only_where_it_agrees() -> None:
    want = {"y": np.array([[1.0, -2.0, 3.0]], np.float32)}
    assert fp16_agrees(want, {"y": want["y"] + 1e-3})
    assert not fp16_agrees(want, {"y": want["y"] * 1.1})
    assert not fp16_agrees(want, {"y": np.array([[1.0, np.inf, 3.0]], np.float32)})
    assert not fp16_agrees(want, {"z": want["y"]})


def test_instance_groups_expand_on_the_machine() -> None:
    config = ModelConfig.from_json(
        {"instance_group": [{"count": 2, "kind": "KIND_GPU"}, {"count": 1, "kind": "KIND_CPU"}]}
    )
    devices = [d for g in config.instance_group for d in g.devices(gpu_count=2)]
    assert devices == ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cpu"]
    assert InstanceGroup(count=3).devices(gpu_count=0) == ["cpu"] * 3  # KIND_AUTO, no GPU
    with pytest.raises(ModelConfigError, match="has 0"):
        InstanceGroup(kind="KIND_GPU").devices(gpu_count=0)
    for bad in ({"count": 0}, {"kind": "KIND_TPU"}, {"kind": "KIND_CPU", "gpus": [0]}):
        with pytest.raises(ModelConfigError):
            ModelConfig.from_json({"instance_group": [bad]})


def test_the_plan_has_one_executor_per_instance(tmp_path: Path) -> None:
    write_linear_classifier(tmp_path / "a" / "1" / "model.onnx")
    write_linear_classifier(tmp_path / "b" / "1" / "model.onnx")
    (tmp_path / "b" / "config.json").write_text(
        json.dumps({"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [1]}]})
    )
    plan = plan_executors(tmp_path, "h1", gpus=2)
    assert [(e.model, e.instance, e.device) for e in plan] == [
        ("a", 0, "cuda:0"),
        ("a", 1, "cuda:1"),  # KIND_AUTO: one per GPU
        ("b", 0, "cuda:1"),
        ("b", 1, "cuda:1"),
    ]
    with pytest.raises(ModelConfigError, match="GPU"):  # b wants GPU 1; this machine: none
        plan_executors(tmp_path, "h1", gpus=0)
    (tmp_path / "b" / "config.json").unlink()
    assert {e.device for e in plan_executors(tmp_path, "h1", gpus=0)} == {None}  # executor picks
    assert {e.device for e in plan_executors(tmp_path, "h1", device="cpu", gpus=2)} == {"cpu"}
    spec = PlaneSpec(hub_id="h1", repo=str(tmp_path), metrics_dir="", executors=plan)
    assert PlaneSpec.from_json(spec.to_json()) == spec  # addresses hold a NUL: they survive
    assert spec.served_versions()["b"].addresses == tuple(e.address for e in plan if e.model == "b")
    assert spec.served_versions()["b"].version == "1"
