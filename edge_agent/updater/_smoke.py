"""Load a verified model from memory and check that it answers as its publisher says.

Invariants: a runtime is handed out only after the manifest's smoke test
passed (every expected output present, same shape, within ``atol``,
elementwise, no relative slack); a manifest without a smoke test still has
its model run once on zeros shaped like its inputs, so a model that loads
but cannot run is caught before it serves. Any failure is a
``SmokeTestError``; the runtime it loaded is closed.

A package (a language model folder) loads as a ``LanguageRuntime`` only on a
device whose ``onnxruntime_genai`` is at least the manifest's
``requires.min_version``, and passes when its greedy generation from the
manifest's prompt (``shared.greedy_ids``, as the publisher ran it) gives the
same prompt ids and at least ``min_matching`` leading output ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shared import ManifestError, ModelManifest, greedy_ids, numpy_dtype

from .._errors import EdgeError, SmokeTestError
from ..language import LanguageRuntime
from ..runtimes import ModelRuntime, OnnxRuntime, TFLiteRuntime

__all__ = ["load_checked_language", "load_checked_runtime"]

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


def load_checked_language(manifest: ModelManifest, directory: Path) -> LanguageRuntime:
    """A language runtime for the verified package folder ``directory`` that passed its
    smoke generation."""
    what = f"{manifest.name}@{manifest.version}"
    _check_runtime_version(manifest, what)
    try:
        runtime = LanguageRuntime(directory, name=manifest.name, version=str(manifest.version))
    except EdgeError as e:
        raise SmokeTestError(f"{what} does not load: {e}") from e
    try:
        _smoke_generate(runtime, manifest, what)
    except BaseException:
        runtime.close()
        raise
    return runtime


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _check_runtime_version(manifest: ModelManifest, what: str) -> None:
    floor = manifest.requires.get("min_version")
    if not isinstance(floor, str):
        return
    try:
        import onnxruntime_genai as og
    except ImportError as e:
        raise SmokeTestError(f"{what} needs onnxruntime-genai: pip install 'tandem[llm]'") from e
    have = str(getattr(og, "__version__", "0"))
    if _version_tuple(have) < _version_tuple(floor):
        raise SmokeTestError(f"{what} needs onnxruntime-genai >= {floor}; this device has {have}")


def _smoke_generate(runtime: LanguageRuntime, manifest: ModelManifest, what: str) -> None:
    try:
        smoke = manifest.generation_smoke()
    except ManifestError as e:
        raise SmokeTestError(f"{what}: {e}") from e
    if runtime.encode(smoke.prompt) != smoke.prompt_ids:
        raise SmokeTestError(f"{what} smoke test: its tokenizer encodes the prompt otherwise")
    wanted = smoke.output_ids
    try:
        generator = runtime.new_generator(
            {"do_sample": False, "max_length": len(smoke.prompt_ids) + len(wanted)}
        )
    except EdgeError as e:
        raise SmokeTestError(f"{what} fails its smoke generation: {e}") from e
    try:
        got = greedy_ids(generator, smoke.prompt_ids, len(wanted))
    except Exception as e:  # ONNX Runtime GenAI's own errors
        raise SmokeTestError(f"{what} fails its smoke generation: {e}") from e
    finally:
        runtime.release(generator)
    if got[: smoke.min_matching] != wanted[: smoke.min_matching]:
        raise SmokeTestError(
            f"{what} smoke test: generated {got[: smoke.min_matching]}, "
            f"the publisher's model generated {wanted[: smoke.min_matching]}"
        )
