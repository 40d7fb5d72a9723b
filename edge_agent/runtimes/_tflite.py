"""TFLite (LiteRT) behind ``ModelRuntime``.

The interpreter comes from ``ai_edge_litert`` (the current package) or, on
older devices, ``tflite_runtime``; either is imported when the first model
loads, so the SDK imports without them.

Invariants:

- One interpreter per runtime, and it is not thread-safe (inputs and outputs
  live in its own buffers between ``set_tensor`` and ``get_tensor``), so
  ``_run`` holds a lock for the whole resize-set-invoke-get sequence.
- Input shapes are cached: the interpreter is resized and its tensors
  reallocated only when a call's shape differs from the last one, because
  reallocation costs far more than the inference of a small model.
- Quantized models keep their real tensor types: an INT8 input is declared
  INT8 and must be given as int8. Quantizing silently would hide a
  float-vs-int8 mix-up; ``quantization`` gives callers the scales to do it.
- A delegate that cannot be loaded, or that refuses the model, is dropped and
  the model runs on the CPU; ``fallback_reason`` says why. A device must keep
  a working model.
- With a single signature (what the TFLite converter writes), tensors go by
  the signature's names (``x``) rather than the converter's tensor names
  (``serving_default_x:0``), so the same request fits the ONNX export too.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shared import TensorError, TensorSpec, datatype_of

from .._errors import ModelLoadError, RuntimeUnavailableError
from ._base import ModelRuntime

__all__ = ["TFLiteRuntime"]

DelegateEntry = str | os.PathLike[str] | tuple[str | os.PathLike[str], Mapping[str, Any]]


class TFLiteRuntime(ModelRuntime):
    """A TFLite model in a TFLite/LiteRT ``Interpreter``.

    ``model`` is a file path or the model's bytes. ``num_threads`` is the
    interpreter's CPU thread count (``None``: the runtime's default, one).
    ``delegates`` are delegate libraries to try in order, each a path or name
    for ``load_delegate`` or a ``(library, options)`` pair. ``xnnpack=False``
    turns off the default XNNPACK CPU delegate (for debugging kernels).
    """

    kind: ClassVar[str] = "tflite"

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        name: str,
        version: str = "0",
        num_threads: int | None = None,
        delegates: Sequence[DelegateEntry] = (),
        xnnpack: bool = True,
        max_input_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        super().__init__(name=name, version=version, max_input_bytes=max_input_bytes)
        tfl = _import_interpreter_module()
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if isinstance(model, bytes | bytearray):
            source = f"<{len(model)} bytes in memory>"
            content: dict[str, Any] = {"model_content": bytes(model)}
        else:
            source = os.fspath(model)
            if not Path(model).is_file():
                raise ModelLoadError(f"TFLite model file not found: {source}")
            content = {"model_path": source}
        options: dict[str, Any] = {**content, "num_threads": num_threads}
        resolver = getattr(tfl, "OpResolverType", None)
        if not xnnpack and resolver is not None:
            options["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES

        problems: list[str] = []
        loaded, labels = _load_delegates(tfl, delegates, problems)
        interpreter = None
        if loaded:
            try:
                interpreter = _create(tfl, options, loaded)
            except Exception as e:
                problems.append(f"{', '.join(labels)} could not run the model ({_first_line(e)})")
                loaded, labels = [], []
        if interpreter is None:
            try:
                interpreter = _create(tfl, options, [])
            except Exception as e:
                raise ModelLoadError(f"cannot load TFLite model {source}: {_first_line(e)}") from e

        #: Why the model runs on the CPU although delegates were asked for, or None.
        self.fallback_reason: str | None = "; ".join(problems) or None
        self._delegates = loaded  # the interpreter uses them: keep them alive as long
        self._interpreter = interpreter
        if labels:
            self._accelerator = labels[0]
        else:
            self._accelerator = "CPU (XNNPACK)" if xnnpack and resolver is not None else "CPU"
        in_details, out_details = _named_details(interpreter)
        self._inputs = tuple(_spec(n, d, source) for n, d in in_details)
        self._outputs = tuple(_spec(n, d, source) for n, d in out_details)
        self._quantization = {
            n: (float(d["quantization"][0]), int(d["quantization"][1]))
            for n, d in (*in_details, *out_details)
            if d["quantization"][0] != 0.0
        }
        self._input_slots = [(int(d["index"]), n) for n, d in in_details]
        self._output_slots = [(int(d["index"]), n) for n, d in out_details]
        self._shapes: dict[int, tuple[int, ...] | None] = {
            int(d["index"]): tuple(int(s) for s in d["shape"]) for _, d in in_details
        }
        self._lock = threading.Lock()

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
    def quantization(self) -> dict[str, tuple[float, int]]:
        """``{tensor: (scale, zero_point)}`` for quantized inputs and outputs.

        ``real = scale * (q - zero_point)``; tensors that are not quantized are absent.
        """
        return dict(self._quantization)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            interpreter = self._interpreter
            shapes = self._shapes
            resized = False
            try:
                for index, name in self._input_slots:
                    shape = inputs[name].shape
                    if shape != shapes[index]:
                        shapes[index] = None  # unknown until the resize succeeds
                        interpreter.resize_tensor_input(index, shape)
                        shapes[index] = shape
                        resized = True
                if resized:
                    interpreter.allocate_tensors()
            except BaseException:
                for index in shapes:  # resize again next time, whatever state it is in
                    shapes[index] = None
                raise
            for index, name in self._input_slots:
                interpreter.set_tensor(index, inputs[name])
            interpreter.invoke()
            # get_tensor copies: the result must outlive the next invoke.
            return {name: interpreter.get_tensor(index) for index, name in self._output_slots}

    def close(self) -> None:
        """Drop the interpreter, then its delegates (the order TFLite needs)."""
        with self._lock:
            self._interpreter = None
            self._delegates = []


def _import_interpreter_module() -> Any:
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter
        except ImportError as e:
            raise RuntimeUnavailableError(
                "TFLite models need ai-edge-litert (pip install ai-edge-litert) or "
                "tflite-runtime; neither is installed"
            ) from e
    return interpreter


def _load_delegates(
    tfl: Any, entries: Sequence[DelegateEntry], problems: list[str]
) -> tuple[list[Any], list[str]]:
    """The delegates that load, with their labels; a note in ``problems`` for each that does not."""
    loaded: list[Any] = []
    labels: list[str] = []
    for entry in entries:
        library, options = (entry, None) if not isinstance(entry, tuple) else entry
        label = Path(library).name
        try:
            _check_plugin(os.fspath(library))
            loaded.append(tfl.load_delegate(os.fspath(library), dict(options or {})))
        # ValueError: the plugin refused its options or found no device.
        except (OSError, ValueError, RuntimeError) as e:
            problems.append(f"delegate {label} did not load ({_first_line(e)})")
            continue
        labels.append(label)
    return loaded, labels


def _check_plugin(library: str) -> None:
    """Raise ``OSError`` unless ``library`` loads and exports the delegate plugin API.

    Checked before ``load_delegate`` because a ``Delegate`` that fails half-way
    through its constructor raises again from ``__del__`` (an "Exception
    ignored" on stderr at best).
    """
    lib = ctypes.CDLL(library)
    for symbol in ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"):
        if not hasattr(lib, symbol):
            raise OSError(f"{library} is not a TFLite delegate plugin: no {symbol}")


def _create(tfl: Any, options: dict[str, Any], delegates: list[Any]) -> Any:
    interpreter = tfl.Interpreter(**options, experimental_delegates=delegates or None)
    interpreter.allocate_tensors()
    return interpreter


def _named_details(interpreter: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(name, details) of inputs and outputs, named by the single signature when there is one."""
    inputs = interpreter.get_input_details()
    outputs = interpreter.get_output_details()
    by_tensor = (
        [(d["name"], d) for d in inputs],
        [(d["name"], d) for d in outputs],
    )
    if len(interpreter.get_signature_list()) != 1:
        return by_tensor
    runner = interpreter.get_signature_runner()
    sig_in = runner.get_input_details()
    sig_out = runner.get_output_details()
    # Only when the signature covers exactly the main graph's inputs and outputs.
    if {d["index"] for d in sig_in.values()} != {d["index"] for d in inputs} or {
        d["index"] for d in sig_out.values()
    } != {d["index"] for d in outputs}:
        return by_tensor
    return list(sig_in.items()), list(sig_out.items())


def _spec(name: str, details: Mapping[str, Any], source: str) -> TensorSpec:
    try:
        datatype = datatype_of(np.empty(0, dtype=details["dtype"]))
    except TensorError as e:
        raise ModelLoadError(f"TFLite model {source}: tensor {name!r}: {e}") from e
    signature = details.get("shape_signature")
    dims = signature if signature is not None and len(signature) else details["shape"]
    try:
        return TensorSpec(name, datatype, tuple(None if d < 0 else int(d) for d in dims))
    except TensorError as e:  # a name or rank the protocol cannot carry
        raise ModelLoadError(f"TFLite model {source}: {e}") from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
