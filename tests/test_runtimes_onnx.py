"""OnnxRuntime on real ONNX models: outputs, validation, loading errors, providers, INT8 QDQ."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import edge_agent
import edge_agent.runtimes as runtimes
import shared
from edge_agent import InferenceError, InvalidInputError, ModelLoadError, RuntimeUnavailableError
from edge_agent.runtimes import OnnxRuntime, TensorSpec, load_runtime
from shared._tensor_spec import MAX_RANK

from ._models import linear_classifier_weights

CPU = "CPUExecutionProvider"


@pytest.fixture(scope="module")
def linear(linear_onnx: Path) -> OnnxRuntime:
    return OnnxRuntime(linear_onnx, name="linear", version="3")


def _x(batch: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-4, 4, size=(batch, 16)).astype(np.float32)


def _expected(x: np.ndarray) -> np.ndarray:
    weight, bias = linear_classifier_weights()
    return x @ weight + bias


def test_package_exports_its_public_api() -> None:
    assert sorted(runtimes.__all__) == sorted(
        ["ModelRuntime", "OnnxRuntime", "TFLiteRuntime", "TensorSpec", "load_runtime"]
    )
    for name in runtimes.__all__:
        assert getattr(runtimes, name) is not None


def test_importing_runtimes_loads_no_inference_library() -> None:
    code = (
        "import sys, edge_agent.runtimes\n"
        "heavy = [m for m in ('onnxruntime', 'ai_edge_litert', 'tflite_runtime', 'torch')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_describes_the_model(linear: OnnxRuntime) -> None:
    assert linear.kind == "onnxruntime"
    assert (linear.name, linear.version) == ("linear", "3")
    assert linear.inputs == (TensorSpec("x", "FP32", (None, 16)),)
    assert linear.outputs == (TensorSpec("logits", "FP32", (None, 4)),)
    assert linear.providers[-1] == CPU
    assert linear.accelerator == linear.providers[0]
    assert linear.accelerator in repr(linear)


def _identity(name: str, dims: list[int | str]) -> bytes:
    """An ONNX model whose one input, ``name`` of ``dims``, is its output."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], ["y"])],
        "identity",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_specs_are_the_one_shared_tensor_spec(linear: OnnxRuntime) -> None:
    assert runtimes.TensorSpec is shared.TensorSpec is edge_agent.TensorSpec
    spec = linear.inputs[0]
    assert type(spec) is shared.TensorSpec
    assert spec.shape == (None, 16) and spec.dims == (-1, 16)  # None inside, -1 for Triton
    assert spec.describe() == "x: FP32[?, 16]"
    assert shared.TensorSpec.from_dict(spec.to_dict()) == spec


def test_shape_error_keeps_a_tensor_name_with_a_colon_whole() -> None:
    rt = OnnxRuntime(_identity("input:0", ["n", 3]), name="ident")
    with pytest.raises(InvalidInputError) as caught:
        rt.run({"input:0": np.zeros((1, 4), np.float32)})
    assert str(caught.value) == (
        "input 'input:0' of model 'ident' must have shape FP32[?, 3], got [1, 4]"
    )


def test_a_tensor_the_protocol_cannot_describe_is_a_load_error() -> None:
    too_deep = [1] * (MAX_RANK + 1)
    with pytest.raises(
        ModelLoadError, match=rf"ONNX model <\d+ bytes in memory>: .*up to {MAX_RANK}"
    ):
        OnnxRuntime(_identity("x", too_deep), name="deep")


@pytest.mark.parametrize("batch", [1, 5])
def test_outputs_match_numpy(linear: OnnxRuntime, batch: int) -> None:
    x = _x(batch)
    out = linear.run({"x": x})
    assert list(out) == ["logits"]
    assert out["logits"].dtype == np.float32
    assert out["logits"].shape == (batch, 4)
    np.testing.assert_allclose(out["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_gives_the_same_answer(linear: OnnxRuntime) -> None:
    x = np.asfortranarray(_x(5))
    np.testing.assert_allclose(linear.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_loads_from_bytes(linear_onnx: Path) -> None:
    rt = OnnxRuntime(linear_onnx.read_bytes(), name="mem")
    x = _x(2)
    np.testing.assert_allclose(rt.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_wrong_dtype_names_input_and_both_datatypes(linear: OnnxRuntime) -> None:
    with pytest.raises(InvalidInputError, match=r"'x'.*must be FP32, got FP64"):
        linear.run({"x": _x(1).astype(np.float64)})


def test_wrong_shape_names_declared_and_given_shape(linear: OnnxRuntime) -> None:
    with pytest.raises(InvalidInputError, match=r"'x'.*shape FP32\[\?, 16\], got \[1, 15\]"):
        linear.run({"x": np.zeros((1, 15), np.float32)})
    with pytest.raises(InvalidInputError, match=r"got \[16\]"):
        linear.run({"x": np.zeros(16, np.float32)})


def test_missing_and_unknown_inputs_are_named(linear: OnnxRuntime) -> None:
    with pytest.raises(InvalidInputError, match=r"missing \['x'\]"):
        linear.run({})
    with pytest.raises(InvalidInputError, match=r"missing \['x'\]; unknown \['input'\]"):
        linear.run({"input": _x(1)})
    with pytest.raises(InvalidInputError, match=r"unknown \['extra'\]"):
        linear.run({"x": _x(1), "extra": _x(1)})


def test_non_array_input_is_rejected(linear: OnnxRuntime) -> None:
    with pytest.raises(InvalidInputError, match="numpy array, got list"):
        linear.run({"x": [[0.0] * 16]})  # type: ignore[dict-item]


def test_oversized_input_is_rejected_before_running(linear_onnx: Path) -> None:
    rt = OnnxRuntime(linear_onnx, name="small", max_input_bytes=64)
    rt.run({"x": _x(1)})  # 64 bytes: at the limit
    with pytest.raises(InvalidInputError, match=r"128 bytes.*at most 64"):
        rt.run({"x": _x(2)})


def test_runtime_failure_on_valid_input_becomes_inference_error() -> None:
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rt = OnnxRuntime(model.SerializeToString(), name="reshape")
    assert rt.inputs[1] == TensorSpec("shape", "INT64", (2,))
    out = rt.run({"x": np.arange(6, dtype=np.float32), "shape": np.array([2, 3])})
    assert out["y"].shape == (2, 3)
    with pytest.raises(InferenceError, match="onnxruntime failed on model 'reshape'"):
        rt.run({"x": np.arange(6, dtype=np.float32), "shape": np.array([4, 4])})


def test_missing_file_is_a_load_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match="not found") as info:
        OnnxRuntime(path, name="nope")
    assert str(path) in str(info.value)


def test_corrupt_file_is_a_one_line_load_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"\x08\x07not a protobuf" * 8)
    with pytest.raises(ModelLoadError) as info:
        OnnxRuntime(path, name="corrupt")
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message
    assert not isinstance(info.value, RuntimeUnavailableError)


def test_truncated_model_is_a_load_error(tmp_path: Path, linear_onnx: Path) -> None:
    path = tmp_path / "truncated.onnx"
    path.write_bytes(linear_onnx.read_bytes()[:-40])
    with pytest.raises(ModelLoadError, match=r"truncated\.onnx"):
        OnnxRuntime(path, name="truncated")


def test_missing_onnxruntime_is_runtime_unavailable(
    linear_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what "not installed" looks like
    with pytest.raises(RuntimeUnavailableError, match="pip install onnxruntime"):
        OnnxRuntime(linear_onnx, name="linear")


def test_auto_picks_cpu_when_no_edge_accelerator_is_present(linear_onnx: Path) -> None:
    rt = OnnxRuntime(linear_onnx, name="linear", providers="auto")
    edge = {"QNN", "Nnapi", "CoreML", "OpenVINO", "Rknpu", "Xnnpack"}
    if not any(p.removesuffix("ExecutionProvider") in edge for p in ort.get_available_providers()):
        assert rt.accelerator == CPU
        assert rt.providers == (CPU,)
    assert rt.fallback_reason is None


def _unavailable_provider() -> str:
    missing = [p for p in ort.get_all_providers() if p not in ort.get_available_providers()]
    if not missing:
        pytest.skip("this onnxruntime build has every provider it knows")
    return missing[0]


def test_unavailable_accelerator_falls_back_to_cpu_and_says_why(linear_onnx: Path) -> None:
    wanted = _unavailable_provider()
    rt = OnnxRuntime(linear_onnx, name="linear", providers=[wanted])
    assert rt.accelerator == CPU
    assert rt.fallback_reason is not None
    assert wanted in rt.fallback_reason
    x = _x(3)
    np.testing.assert_allclose(rt.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_explicit_cpu_with_options_is_used_as_given(linear_onnx: Path) -> None:
    rt = OnnxRuntime(linear_onnx, name="linear", providers=[(CPU, {})], intra_op_threads=2)
    assert rt.providers == (CPU,)
    assert rt.fallback_reason is None


def test_unknown_provider_is_a_clear_error(linear_onnx: Path) -> None:
    with pytest.raises(
        ModelLoadError, match="unknown ONNX Runtime execution provider 'NPUProvider'"
    ):
        OnnxRuntime(linear_onnx, name="linear", providers=["NPUProvider"])
    with pytest.raises(ValueError, match="'auto' or a list"):
        OnnxRuntime(linear_onnx, name="linear", providers="cpu")


def test_thread_count_must_be_positive(linear_onnx: Path) -> None:
    with pytest.raises(ValueError, match="intra_op_threads"):
        OnnxRuntime(linear_onnx, name="linear", intra_op_threads=0)


def test_load_runtime_picks_onnx_by_suffix(linear_onnx: Path) -> None:
    rt = load_runtime(linear_onnx, version="7", intra_op_threads=1)
    assert isinstance(rt, OnnxRuntime)
    assert (rt.name, rt.version) == ("linear", "7")
    assert load_runtime(str(linear_onnx), name="other").name == "other"


def test_load_runtime_rejects_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match=r"model.pt.*'\.pt'.*\.onnx, \.tflite"):
        load_runtime(path)


# -- statically quantized (QDQ) INT8 model ----------------------------------------------------


class _Calibration(CalibrationDataReader):
    """Feeds the calibration batches, then ``None``."""

    def __init__(self, batches: list[np.ndarray]) -> None:
        self._batches: Iterator[np.ndarray] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {"x": batch}


@pytest.fixture(scope="module")
def qdq_onnx(linear_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import onnx

    rng = np.random.default_rng(7)
    batches = [rng.uniform(-4, 4, size=(8, 16)).astype(np.float32) for _ in range(16)]
    out = tmp_path_factory.mktemp("qdq") / "linear-int8.onnx"
    quantize_static(
        str(linear_onnx),
        str(out),
        _Calibration(batches),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    ops = {node.op_type for node in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    return out


def test_qdq_int8_model_keeps_float_io_and_stays_close_to_float(
    qdq_onnx: Path, linear: OnnxRuntime
) -> None:
    rt = OnnxRuntime(qdq_onnx, name="linear-int8")
    assert rt.inputs == linear.inputs
    assert [(s.name, s.datatype) for s in rt.outputs] == [("logits", "FP32")]
    x = _x(5, seed=3)
    got = rt.run({"x": x})["logits"]
    want = _expected(x)
    spread = float(np.ptp(want))
    assert np.max(np.abs(got - want)) < 0.05 * spread
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.8
