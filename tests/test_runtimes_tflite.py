"""TFLiteRuntime on real TFLite models from ``_tflite_models``: outputs, INT8, errors, threads."""

from __future__ import annotations

import ctypes.util
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_agent import InvalidInputError, ModelLoadError, RuntimeUnavailableError
from edge_agent.runtimes import OnnxRuntime, TensorSpec, TFLiteRuntime, load_runtime

from ._models import linear_classifier_weights
from ._tflite_models import (
    INPUT_TENSOR,
    OUTPUT_TENSOR,
    int8_params,
    linear_classifier_tflite,
    write_linear_classifier_tflite,
)


@pytest.fixture(scope="module")
def linear_tflite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_linear_classifier_tflite(tmp_path_factory.mktemp("tflite") / "linear.tflite")


@pytest.fixture
def linear(linear_tflite: Path) -> TFLiteRuntime:
    return TFLiteRuntime(linear_tflite, name="linear", version="2")


@pytest.fixture(scope="module")
def int8_model() -> TFLiteRuntime:
    return TFLiteRuntime(linear_classifier_tflite(quantized=True), name="linear-int8")


def _x(batch: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-4, 4, size=(batch, 16)).astype(np.float32)


def _expected(x: np.ndarray) -> np.ndarray:
    weight, bias = linear_classifier_weights()
    return x @ weight + bias


def test_describes_the_model_by_signature_names(linear: TFLiteRuntime) -> None:
    assert linear.kind == "tflite"
    assert (linear.name, linear.version) == ("linear", "2")
    assert linear.inputs == (TensorSpec("x", "FP32", (None, 16)),)
    assert linear.outputs == (TensorSpec("logits", "FP32", (None, 4)),)
    assert linear.accelerator == "CPU (XNNPACK)"
    assert linear.fallback_reason is None
    assert linear.quantization == {}


def test_without_a_signature_tensors_go_by_their_own_names() -> None:
    rt = TFLiteRuntime(linear_classifier_tflite(signature=False), name="plain")
    assert [s.name for s in rt.inputs] == [INPUT_TENSOR]
    assert [s.name for s in rt.outputs] == [OUTPUT_TENSOR]
    x = _x(2)
    out = rt.run({INPUT_TENSOR: x})[OUTPUT_TENSOR]
    np.testing.assert_allclose(out, _expected(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 5])
def test_outputs_match_numpy(linear: TFLiteRuntime, batch: int) -> None:
    x = _x(batch)
    out = linear.run({"x": x})
    assert list(out) == ["logits"]
    assert out["logits"].dtype == np.float32
    assert out["logits"].shape == (batch, 4)
    np.testing.assert_allclose(out["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_batch_size_changes_back_and_forth(linear: TFLiteRuntime) -> None:
    for seed, batch in enumerate([1, 5, 5, 1, 3, 1, 8]):
        x = _x(batch, seed)
        got = linear.run({"x": x})["logits"]
        np.testing.assert_allclose(got, _expected(x), rtol=1e-5, atol=1e-5)


def test_results_own_their_memory(linear: TFLiteRuntime) -> None:
    first = linear.run({"x": _x(1, seed=1)})["logits"]
    kept = first.copy()
    linear.run({"x": _x(1, seed=2)})
    np.testing.assert_array_equal(first, kept)


def test_non_contiguous_input_gives_the_same_answer(linear: TFLiteRuntime) -> None:
    x = np.asfortranarray(_x(4))
    np.testing.assert_allclose(linear.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_agrees_with_onnx_runtime_on_the_same_weights(
    linear: TFLiteRuntime, linear_onnx: Path
) -> None:
    onnx_rt = OnnxRuntime(linear_onnx, name="linear")
    assert onnx_rt.inputs == linear.inputs and onnx_rt.outputs == linear.outputs
    x = _x(6, seed=9)
    np.testing.assert_allclose(
        linear.run({"x": x})["logits"], onnx_rt.run({"x": x})["logits"], rtol=1e-5, atol=1e-5
    )


def test_xnnpack_can_be_turned_off(linear_tflite: Path) -> None:
    rt = TFLiteRuntime(linear_tflite, name="linear", xnnpack=False, num_threads=2)
    assert rt.accelerator == "CPU"
    x = _x(5)
    np.testing.assert_allclose(rt.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


# -- INT8 ------------------------------------------------------------------------------------


def test_int8_model_reports_real_dtypes_and_scales(int8_model: TFLiteRuntime) -> None:
    q = int8_params()
    assert int8_model.inputs == (TensorSpec("x", "INT8", (None, 16)),)
    assert int8_model.outputs == (TensorSpec("logits", "INT8", (None, 4)),)
    scale, zero_point = int8_model.quantization["x"]
    assert scale == pytest.approx(q.input_scale) and zero_point == q.input_zero_point
    scale, zero_point = int8_model.quantization["logits"]
    assert scale == pytest.approx(q.output_scale) and zero_point == q.output_zero_point


@pytest.mark.parametrize("batch", [1, 5])
def test_int8_model_dequantizes_close_to_float(int8_model: TFLiteRuntime, batch: int) -> None:
    in_scale, in_zp = int8_model.quantization["x"]
    out_scale, out_zp = int8_model.quantization["logits"]
    x = _x(batch, seed=4)
    xq = np.clip(np.round(x / in_scale) + in_zp, -128, 127).astype(np.int8)
    yq = int8_model.run({"x": xq})["logits"]
    assert yq.dtype == np.int8 and yq.shape == (batch, 4)
    y = (yq.astype(np.float32) - out_zp) * out_scale
    # Input rounding (half a step per feature, through the weights) plus one output step.
    weight, _ = linear_classifier_weights()
    bound = 0.5 * in_scale * np.abs(weight).sum(axis=0) + out_scale
    assert np.all(np.abs(y - _expected(x)) <= bound)


def test_int8_model_refuses_float_input_rather_than_quantizing(int8_model: TFLiteRuntime) -> None:
    with pytest.raises(InvalidInputError, match="must be INT8, got FP32"):
        int8_model.run({"x": _x(1)})
    with pytest.raises(InvalidInputError, match="must be INT8, got UINT8"):
        int8_model.run({"x": np.zeros((1, 16), np.uint8)})


# -- validation ------------------------------------------------------------------------------


def test_wrong_dtype_names_input_and_both_datatypes(linear: TFLiteRuntime) -> None:
    with pytest.raises(InvalidInputError, match=r"'x'.*must be FP32, got FP64"):
        linear.run({"x": _x(1).astype(np.float64)})


def test_wrong_shape_names_declared_and_given_shape(linear: TFLiteRuntime) -> None:
    with pytest.raises(InvalidInputError, match=r"'x'.*\[\?, 16\], got \[2, 17\]"):
        linear.run({"x": np.zeros((2, 17), np.float32)})
    with pytest.raises(InvalidInputError, match=r"got \[1, 1, 16\]"):
        linear.run({"x": np.zeros((1, 1, 16), np.float32)})


def test_missing_and_unknown_inputs_are_named(linear: TFLiteRuntime) -> None:
    with pytest.raises(InvalidInputError, match=r"missing \['x'\]"):
        linear.run({})
    with pytest.raises(
        InvalidInputError, match=r"missing \['x'\]; unknown \['serving_default_x:0'\]"
    ):
        linear.run({INPUT_TENSOR: _x(1)})


def test_oversized_input_is_rejected(linear_tflite: Path) -> None:
    rt = TFLiteRuntime(linear_tflite, name="small", max_input_bytes=64 * 4)
    rt.run({"x": _x(4)})
    with pytest.raises(InvalidInputError, match=r"320 bytes.*at most 256"):
        rt.run({"x": _x(5)})


def test_a_rejected_call_does_not_disturb_the_next(linear: TFLiteRuntime) -> None:
    with pytest.raises(InvalidInputError):
        linear.run({"x": np.zeros((3, 15), np.float32)})
    x = _x(3)
    np.testing.assert_allclose(linear.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


# -- loading ---------------------------------------------------------------------------------


def test_loads_from_bytes() -> None:
    rt = TFLiteRuntime(linear_classifier_tflite(), name="mem")
    x = _x(2)
    np.testing.assert_allclose(rt.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_missing_file_is_a_load_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.tflite"
    with pytest.raises(ModelLoadError, match="not found") as info:
        TFLiteRuntime(path, name="nope")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"garbage" * 20, b"", linear_classifier_tflite()[:100]],
    ids=["garbage", "empty", "truncated"],
)
def test_corrupt_file_is_a_one_line_load_error_naming_it(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corrupt.tflite"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError) as info:
        TFLiteRuntime(path, name="corrupt")
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message
    assert not isinstance(info.value, RuntimeUnavailableError)


def test_corrupt_bytes_are_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="140 bytes in memory"):
        TFLiteRuntime(b"garbage" * 20, name="corrupt")


def test_missing_tflite_runtime_names_both_packages(
    linear_tflite: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("ai_edge_litert", "ai_edge_litert.interpreter", "tflite_runtime"):
        monkeypatch.setitem(sys.modules, module, None)  # what "not installed" looks like
    with pytest.raises(RuntimeUnavailableError, match=r"ai-edge-litert.*tflite-runtime"):
        TFLiteRuntime(linear_tflite, name="linear")


def test_thread_count_must_be_positive(linear_tflite: Path) -> None:
    with pytest.raises(ValueError, match="num_threads"):
        TFLiteRuntime(linear_tflite, name="linear", num_threads=0)


def test_load_runtime_picks_tflite_by_suffix(linear_tflite: Path) -> None:
    rt = load_runtime(linear_tflite, version="5", num_threads=1)
    assert isinstance(rt, TFLiteRuntime)
    assert (rt.name, rt.version) == ("linear", "5")


# -- delegates -------------------------------------------------------------------------------


def test_delegate_that_does_not_exist_falls_back_to_cpu(linear_tflite: Path) -> None:
    rt = TFLiteRuntime(linear_tflite, name="linear", delegates=["libno_such_delegate.so"])
    assert rt.accelerator == "CPU (XNNPACK)"
    assert rt.fallback_reason is not None
    assert "libno_such_delegate.so did not load" in rt.fallback_reason
    x = _x(2)
    np.testing.assert_allclose(rt.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


def test_library_that_is_not_a_delegate_falls_back_to_cpu(linear_tflite: Path) -> None:
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to load")
    rt = TFLiteRuntime(
        linear_tflite, name="linear", delegates=[(libm, {"device": "usb"}), "libnope.so"]
    )
    assert rt.accelerator == "CPU (XNNPACK)"
    assert rt.fallback_reason is not None
    assert libm in rt.fallback_reason and "libnope.so" in rt.fallback_reason
    x = _x(2)
    np.testing.assert_allclose(rt.run({"x": x})["logits"], _expected(x), rtol=1e-5, atol=1e-5)


# -- threads ---------------------------------------------------------------------------------


def test_concurrent_calls_with_different_batch_sizes_get_their_own_answers(
    linear: TFLiteRuntime,
) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        try:
            start.wait()
            for i in range(60):
                x = _x(1 + (seed + i) % 6, seed=seed * 1000 + i)
                got = linear.run({"x": x})["logits"]
                np.testing.assert_allclose(got, _expected(x), rtol=1e-5, atol=1e-5)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
