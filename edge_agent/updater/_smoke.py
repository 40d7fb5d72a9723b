"""Load a verified model from memory and check that it answers as its publisher says.

Invariants: a runtime is handed out only after the manifest's smoke test
passed (every expected output present, same shape, within ``atol``,
elementwise, no relative slack); a manifest without a smoke test still has
its model run once on zeros shaped like its inputs, so a model that loads
but cannot run is caught before it serves. Any failure is a
``SmokeTestError``; the runtime it loaded is closed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shared import ModelManifest, numpy_dtype

from .._errors import EdgeError, SmokeTestError
from ..runtimes import ModelRuntime, OnnxRuntime, TFLiteRuntime

__all__ = ["load_checked_runtime"]

_BY_FORMAT: dict[str, Callable[..., ModelRuntime]] = {
    "onnx": OnnxRuntime,
    "tflite": TFLiteRuntime,
}


def load_checked_runtime(manifest: ModelManifest, raw: bytes) -> ModelRuntime:
    """A runtime for ``raw`` (the verified model bytes) that passed its smoke test."""
    what = f"{manifest.name}@{manifest.version}"
    loader = _BY_FORMAT.get(manifest.format)
    if loader is None:
        raise SmokeTestError(f"{what}: no runtime for format {manifest.format!r}")
    try:
        runtime = loader(raw, name=manifest.name, version=str(manifest.version))
    except (EdgeError, ValueError, OSError) as e:
        raise SmokeTestError(f"{what} does not load: {e}") from e
    try:
        _smoke_test(runtime, manifest, what)
    except BaseException:
        runtime.close()
        raise
    return runtime


def _smoke_test(runtime: ModelRuntime, manifest: ModelManifest, what: str) -> None:
    if manifest.smoke_test is None:
        inputs = {
            spec.name: np.zeros(
                tuple(1 if d is None else d for d in spec.shape), numpy_dtype(spec.datatype)
            )
            for spec in runtime.inputs
        }
        expected: dict[str, np.ndarray] = {}
        atol = 0.0
    else:
        inputs, expected, atol = manifest.smoke_samples()
    try:
        outputs = runtime.run(inputs)
    except EdgeError as e:
        raise SmokeTestError(f"{what} fails its smoke test: {e}") from e
    for name, want in expected.items():
        got = outputs.get(name)
        if got is None:
            raise SmokeTestError(f"{what} smoke test: the model has no output {name!r}")
        got = np.asarray(got)
        if got.shape != want.shape:
            raise SmokeTestError(
                f"{what} smoke test: output {name!r} has shape {list(got.shape)}, "
                f"expected {list(want.shape)}"
            )
        if not np.allclose(got, want, rtol=0.0, atol=atol):
            worst = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            raise SmokeTestError(
                f"{what} smoke test: output {name!r} is off by up to {worst:.3g} (atol {atol:g})"
            )
