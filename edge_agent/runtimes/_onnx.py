"""ONNX Runtime behind ``ModelRuntime``.

Execution providers: with ``providers="auto"`` the session gets the first
edge accelerator this onnxruntime build offers (``_EDGE_PREFERENCE``), then
``CPUExecutionProvider``, which always comes last so that nodes an
accelerator cannot take (and whole models, if the accelerator refuses to
build a session) still run. An explicit list names providers in order;
a name onnxruntime has never heard of is a configuration mistake and fails
loudly, while a real provider that this build or device lacks is skipped,
with the reason kept in ``fallback_reason`` — a device must keep a working
model. ``accelerator`` is the provider the session actually got first.

Runs call the session's C++ ``run`` directly (``_direct_run``): the Python
``InferenceSession.run`` around it only repeats checks that ``validate``
has made, and costs several microseconds per call.

onnxruntime is imported when the first model loads, not when this module is
imported, so the SDK imports quickly and a device without it gets a
``RuntimeUnavailableError`` at load time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from shared import ONNX_DATATYPES, TensorError, TensorSpec

from .._errors import ModelLoadError, RuntimeUnavailableError
from ._base import ModelRuntime

if TYPE_CHECKING:
    import onnxruntime

__all__ = ["OnnxRuntime"]

_log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"

# NPU / on-device accelerators, best first. Desktop and data-centre providers
# (CUDA, TensorRT, DirectML, ROCm) are left to an explicit list: "auto" is
# for phones and boards, where these are the ones that ship.
_EDGE_PREFERENCE: tuple[str, ...] = (
    "QNNExecutionProvider",  # Qualcomm Hexagon NPU
    "NnapiExecutionProvider",  # Android NN API
    "CoreMLExecutionProvider",  # Apple Neural Engine / GPU
    "OpenVINOExecutionProvider",  # Intel NPU / iGPU
    "RknpuExecutionProvider",  # Rockchip NPU
    "XnnpackExecutionProvider",  # optimised Arm/x86 CPU kernels
)


ProviderEntry = str | tuple[str, Mapping[str, Any]]


class OnnxRuntime(ModelRuntime):
    """An ONNX model in an ``onnxruntime.InferenceSession``.

    ``model`` is a file path or the serialized model. ``intra_op_threads``
    defaults to 1 (see ``_session_options``). ``InferenceSession.run`` is
    thread-safe, so ``run`` takes no lock.
    """

    kind: ClassVar[str] = "onnxruntime"

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        name: str,
        version: str = "0",
        providers: str | Sequence[ProviderEntry] = "auto",
        intra_op_threads: int | None = None,
        max_input_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        super().__init__(name=name, version=version, max_input_bytes=max_input_bytes)
        ort = _import_onnxruntime()
        source = _describe_source(model)
        if isinstance(model, bytes | bytearray):
            model = bytes(model)
        else:
            path = Path(model)
            if not path.is_file():
                raise ModelLoadError(f"ONNX model file not found: {source}")
            model = str(path)
        if intra_op_threads is not None and intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be >= 1, got {intra_op_threads}")

        wanted, skipped_reason = _resolve_providers(ort, providers)
        options = _session_options(ort, intra_op_threads)
        self._session, failed_reason = _create_session(ort, model, options, wanted, source)
        #: Why the session runs on something other than what was asked for, or None.
        self.fallback_reason: str | None = failed_reason or skipped_reason
        self._inputs = tuple(_spec(arg, source) for arg in self._session.get_inputs())
        self._outputs = tuple(_spec(arg, source) for arg in self._session.get_outputs())
        # Computed once: ``_run`` is the hot path.
        self._output_names = [spec.name for spec in self._outputs]
        self._providers: tuple[str, ...] = tuple(self._session.get_providers())
        self._accelerator = self._providers[0]
        self._direct = _direct_run(self._session)
        state = getattr(getattr(ort, "capi", None), "onnxruntime_pybind11_state", None)
        self._ep_fail: Any = getattr(state, "EPFail", ())

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    @property
    def accelerator(self) -> str:
        return self._accelerator

    @property
    def providers(self) -> tuple[str, ...]:
        """The session's providers in the order it tries them."""
        return self._providers

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self._output_names
        direct = self._direct
        if direct is None:
            return dict(zip(names, self._session.run(names, inputs), strict=True))
        try:
            outputs = direct(names, inputs, None)
        except self._ep_fail:
            # The public method retries on the session's fallback providers, which
            # replaces the C++ session: run through it, then call the new one.
            outputs = self._session.run(names, inputs)
            self._direct = _direct_run(self._session)
        return dict(zip(names, outputs, strict=True))

    def close(self) -> None:
        """Drop the session; onnxruntime frees it with the last reference."""
        self._direct = None
        self._session = None


def _direct_run(session: Any) -> Callable[..., list[Any]] | None:
    """The C++ ``run`` under ``InferenceSession.run``, when calling it directly skips nothing.

    The Python method checks that every required input is in the feed (``validate``
    has, for every declared input), that no ``OrtValue`` in it belongs to another
    device (we feed numpy arrays) and that WebGPU graph capture is off (checked
    here, once), then calls ``session._sess.run(names, feed, run_options)``.
    ``_sess`` is onnxruntime's, not public API: without it (another onnxruntime)
    runs go through the public method.
    """
    sess = getattr(session, "_sess", None)
    run = getattr(sess, "run", None)
    if not callable(run):
        return None
    capture = getattr(sess, "is_webgpu_graph_capture_enabled", None)
    try:
        if capture is not None and capture():
            return None
    except Exception:
        return None
    return run


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise RuntimeUnavailableError(
            "ONNX models need onnxruntime, which is not installed (pip install onnxruntime)"
        ) from e
    return onnxruntime


def _describe_source(model: str | os.PathLike[str] | bytes | bytearray) -> str:
    if isinstance(model, bytes | bytearray):
        return f"<{len(model)} bytes in memory>"
    return os.fspath(model)


def _resolve_providers(
    ort: Any, providers: str | Sequence[ProviderEntry]
) -> tuple[list[ProviderEntry], str | None]:
    """The provider list for the session, CPU last, and why any asked-for one was dropped."""
    available = ort.get_available_providers()
    if isinstance(providers, str):
        if providers != "auto":
            raise ValueError(f"providers must be 'auto' or a list of names, got {providers!r}")
        accelerators: list[ProviderEntry] = [p for p in _EDGE_PREFERENCE if p in available]
        return [*accelerators[:1], CPU], None

    known = set(ort.get_all_providers())
    chosen: list[ProviderEntry] = []
    skipped: list[str] = []
    for entry in providers:
        provider = entry if isinstance(entry, str) else entry[0]
        if provider not in known:
            raise ModelLoadError(
                f"unknown ONNX Runtime execution provider {provider!r}; "
                f"this onnxruntime offers {', '.join(available)}"
            )
        if provider in available:
            chosen.append(entry)
        else:
            skipped.append(provider)
    if not any((p if isinstance(p, str) else p[0]) == CPU for p in chosen):
        chosen.append(CPU)
    reason = None
    if skipped:
        reason = (
            f"{', '.join(skipped)} not available in this onnxruntime "
            f"(available: {', '.join(available)})"
        )
        _log.info("onnxruntime: %s; using %s", reason, chosen)
    return chosen, reason


def _session_options(ort: Any, intra_op_threads: int | None) -> onnxruntime.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # One intra-op thread by default: for the small batch-1 models an edge
    # device runs, a 16->4 linear model measured the same median latency with
    # 1, 2 or "all cores" threads (~9-18 us, all within noise on a 2-core
    # box), while a pool spins its idle workers, costing battery and CPU the
    # app needs. Bigger models can ask for more.
    options.intra_op_num_threads = intra_op_threads or 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: onnxruntime warns on stderr otherwise
    return options


def _create_session(
    ort: Any,
    model: str | bytes,
    options: Any,
    providers: list[ProviderEntry],
    source: str,
) -> tuple[onnxruntime.InferenceSession, str | None]:
    """A session on ``providers``, or, if an accelerator refuses the model, one on CPU alone."""
    try:
        return ort.InferenceSession(model, options, providers=providers), None
    except Exception as e:
        if providers == [CPU]:
            raise ModelLoadError(f"cannot load ONNX model {source}: {_first_line(e)}") from e
        first = providers[0] if isinstance(providers[0], str) else providers[0][0]
        reason = f"session on {first} failed ({_first_line(e)}); running on CPU"
    _log.warning("onnxruntime: model %s: %s", source, reason)
    try:
        return ort.InferenceSession(model, options, providers=[CPU]), reason
    except Exception as e:
        raise ModelLoadError(f"cannot load ONNX model {source}: {_first_line(e)}") from e


def _spec(arg: Any, source: str) -> TensorSpec:
    datatype = ONNX_DATATYPES.get(arg.type)
    if datatype is None:
        raise ModelLoadError(
            f"ONNX model {source}: tensor {arg.name!r} has type {arg.type}, "
            "which has no Open Inference Protocol datatype"
        )
    # Symbolic ("batch") and unknown dims are free.
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape or ())
    try:
        return TensorSpec(arg.name, datatype, shape)
    except TensorError as e:  # a name or rank the protocol cannot carry
        raise ModelLoadError(f"ONNX model {source}: {e}") from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
