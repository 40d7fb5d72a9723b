"""``publish_model``: from a float model to a signed, registered, downloadable version.

Steps: float ONNX (a file, with its external weights inlined; bytes; or a
torch module exported here) → quantize → validate against the float model
on held-out samples → compress (zstd) → refuse a model byte for byte the
same as a published version (unless ``allow_same``) → a delta from the
previous version when smaller →
build the manifest (specs, requirements, sizes, the validation report, a
smoke test) → sign it → hand the release (signed manifest, blob, delta) to
a target, which stores the blobs and registers the manifest.

Invariants:

- Nothing is stored or registered unless validation passed: a quantized
  model that agrees with the float one on fewer than ``min_agreement`` of
  the held-out samples raises ``ValidationError`` before the first write.
- Nothing is written until the manifest is built and signed. Then blobs are
  stored before the manifest is registered, so a registered manifest never
  names a missing blob; a failure in between leaves only unreferenced,
  content-addressed blobs, which are harmless.
- A delta is published only if it is smaller than the full blob and applying
  it here rebuilds the new model byte for byte; of the two delta methods
  (``DeltaRef.METHODS``) the smaller one is kept.
- The version is checked against the target before any work, and the
  registry checks it again atomically when the manifest is added (a
  concurrent publisher loses with ``VersionConflictError``).
- The pipeline makes artifacts only; one ``PublishTarget`` call stores and
  registers them (``_targets``): the CDN's admin API, or a registry and a
  store at hand, so both ways publish the same release.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from shared import (
    NAME_PATTERN,
    BlobRef,
    DeltaRef,
    ManifestError,
    ModelManifest,
    SigningKey,
    apply_delta,
    compress_blob,
    decompress_blob,
    digest,
    format_time,
    make_delta,
    numpy_dtype,
    sign_document,
)
from shared.server.store import BlobStore

from .._errors import (
    BlobNotFoundError,
    IdenticalModelError,
    InvalidNameError,
    PublishError,
    VersionConflictError,
)
from ..registry._base import Registry
from ._export import export_torch
from ._onnx_file import read_onnx_file, require_self_contained
from ._quantize import METHODS, quantize_model, scheme_of
from ._runner import OnnxModel, batches
from ._smoke import pick_smoke_inputs, smoke_test, synthetic_inputs
from ._targets import LatestVersion, LocalTarget, PublishTarget, Release
from ._tflite import TFLiteModel, load_tflite
from ._validate import agreement_report, check_agreement

if TYPE_CHECKING:
    import torch

__all__ = ["PublishResult", "publish_model"]

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class PublishResult:
    manifest: ModelManifest
    signed: dict[str, Any]  # what the registry stores and devices verify
    report: dict[str, Any]  # the validation report, as in manifest.quantization
    blob_digest: str
    delta_digests: list[str]


def publish_model(
    source: Path | str | bytes | torch.nn.Module,
    *,
    name: str,
    signing_key: SigningKey,
    registry: Registry | None = None,
    store: BlobStore | None = None,
    target: PublishTarget | None = None,
    version: int | None = None,
    quantize: Literal["int8-static", "int8-dynamic", "fp16", "none"] | None = None,
    calibration: np.ndarray | None = None,
    validation: tuple[np.ndarray, np.ndarray | None] | None = None,
    min_agreement: float = 0.97,
    format: Literal["onnx", "tflite"] = "onnx",
    tflite_file: Path | None = None,
    labels: list[str] | None = None,
    expires_in_days: float = 365.0,
    example_input: np.ndarray | None = None,
    progress: Progress | None = None,
    allow_same: bool = False,
) -> PublishResult:
    """Publish ``source`` as ``name`` version ``version`` (default: the latest + 1).

    ``source`` is the float model: an ONNX file path (external weights beside
    it are read and inlined), ONNX bytes or a ``torch.nn.Module``. ``quantize``
    defaults to ``int8-static``. ``format="tflite"`` publishes ``tflite_file``
    as converted (``quantize`` must then be ``"none"`` or left out: quantize
    when converting) and validates it against ``source`` when a TFLite
    interpreter is installed. A model byte for byte the same as a version
    already published raises ``IdenticalModelError`` unless ``allow_same``. The
    release goes to ``target`` (``AdminApiTarget``: the CDN's admin API), or
    to ``registry`` and ``store`` (``LocalTarget``).
    """
    step: Progress = progress or (lambda stage, fraction: None)
    method = _check_arguments(name, quantize, format, tflite_file, min_agreement, expires_in_days)
    _check_samples(method, format, calibration, validation)
    destination = _destination(target, registry, store)
    latest = destination.latest(name)
    if version is None:
        version = latest.version + 1 if latest else 1
    elif latest is not None and version <= latest.version:
        raise VersionConflictError(f"{name} version {version} is not above {latest.version}")
    val_inputs, val_labels = validation if validation is not None else (None, None)
    with _stage(step, "load float model"):
        float_raw = _float_model(source, example_input, calibration, val_inputs)
        reference = OnnxModel.load(float_raw, "float")
        datatype = reference.input.datatype
        calibration, val_inputs, example_input = (
            _typed(x, datatype) for x in (calibration, val_inputs, example_input)
        )
    if labels is not None:
        _check_labels(labels, reference.outputs)
    model = _candidate(
        step, float_raw, reference, method, format, tflite_file, calibration, _label(source)
    )
    with _stage(step, "validate"):
        validated = _validate(
            reference, model.candidate, model.plain, val_inputs, val_labels, min_agreement
        )
    report = model.report(validated, len(float_raw), calibration)
    samples = pick_smoke_inputs([val_inputs, calibration, example_input], reference.fixed_batch)
    if samples is None:
        samples = synthetic_inputs(reference.input, reference.fixed_batch)
    smoke = _smoke(model, samples, validated.get("kernel_max_abs_diff", 0.0))
    with _stage(step, "compress"):
        blob = compress_blob(model.artifact)
    if not allow_same:
        _check_changed(destination, name, latest, blob, model.artifact)
    with _stage(step, "delta"):
        delta = _delta(destination, latest, format, model.artifact, len(blob))
    manifest, signed = _signed_manifest(
        name, version, model, blob, delta, report, smoke, labels, expires_in_days, signing_key
    )
    blobs = {manifest.blob.digest: blob, **({delta[0].digest: delta[1]} if delta else {})}
    with _stage(step, "store and register"):
        destination.add(Release(name, version, signed, blobs))
    return PublishResult(manifest, signed, report, manifest.blob.digest, list(blobs)[1:])


def _destination(
    target: PublishTarget | None, registry: Registry | None, store: BlobStore | None
) -> PublishTarget:
    if target is not None:
        if registry is not None or store is not None:
            raise PublishError("give a target, or a registry and a store, not both")
        return target
    if registry is None or store is None:
        raise PublishError("publish_model needs a target, or a registry and a store")
    return LocalTarget(registry, store)


@dataclass(frozen=True)
class _Candidate:
    """The model to publish, loaded to check it: its bytes, how they were made, runtimes."""

    format: str  # onnx or tflite
    method: str
    artifact: bytes
    candidate: OnnxModel | TFLiteModel | str  # str: why no interpreter could load it here
    # The same model with no graph optimization runs ONNX Runtime's reference kernels
    # instead of fused ones: how far the two differ is how far devices may differ.
    plain: OnnxModel | None

    def report(
        self, validated: dict[str, Any], float_bytes: int, calibration: np.ndarray | None
    ) -> dict[str, Any]:
        report: dict[str, Any] = {
            "method": self.method,
            **scheme_of(self.method),
            **validated,
            "float_bytes": float_bytes,
            "quantized_bytes": len(self.artifact),
        }
        if self.method == "int8-static" and calibration is not None:
            report["calibration_samples"] = len(calibration)
        return report


def _candidate(
    step: Progress,
    float_raw: bytes,
    reference: OnnxModel,
    quantize: str,
    format: str,
    tflite_file: Path | None,
    calibration: np.ndarray | None,
    label: str,
) -> _Candidate:
    if format != "onnx":
        try:
            artifact = Path(tflite_file).read_bytes()  # type: ignore[arg-type]  # checked
        except OSError as e:
            raise PublishError(f"cannot read the TFLite file {tflite_file}: {e}") from e
        return _Candidate("tflite", "tflite-file", artifact, load_tflite(artifact), None)
    with _stage(step, "quantize"):
        artifact = quantize_model(
            float_raw,
            quantize,
            input_name=reference.input.name,
            calibration=calibration,
            fixed_batch=reference.fixed_batch,
            label=label,
        )
        candidate = OnnxModel.load(artifact, "quantized")
    plain = OnnxModel.load(artifact, "quantized", optimize=False)
    return _Candidate("onnx", quantize, artifact, candidate, plain)


def _signed_manifest(
    name: str,
    version: int,
    model: _Candidate,
    blob: bytes,
    delta: tuple[DeltaRef, bytes] | None,
    report: dict[str, Any],
    smoke: dict[str, Any] | None,
    labels: list[str] | None,
    expires_in_days: float,
    signing_key: SigningKey,
) -> tuple[ModelManifest, dict[str, Any]]:
    inputs, outputs, requires = _describe(model.candidate, model.artifact)
    now = datetime.now(UTC).replace(microsecond=0)
    raw = model.artifact
    try:
        manifest = ModelManifest(
            name=name,
            version=version,
            format=model.format,
            requires=requires,
            inputs=inputs,
            outputs=outputs,
            labels=tuple(labels) if labels is not None else None,
            blob=BlobRef(digest(blob), len(blob), len(raw), "zstd", digest(raw)),
            deltas=(delta[0],) if delta else (),
            quantization=report,
            smoke_test=smoke,
            published_at=format_time(now),
            expires_at=format_time(now + timedelta(days=expires_in_days)),
        )
        return manifest, sign_document(manifest.to_dict(), signing_key)
    except ManifestError as e:
        raise PublishError(f"cannot build the manifest of {name}@{version}: {e}") from e


@contextlib.contextmanager
def _stage(progress: Progress, name: str) -> Iterator[None]:
    progress(name, 0.0)
    yield
    progress(name, 1.0)


def _check_arguments(
    name: str,
    quantize: str | None,
    format: str,
    tflite_file: Path | None,
    min_agreement: float,
    expires_in_days: float,
) -> str:
    """The quantization method to use, once the arguments are checked."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidNameError(f"invalid model name {name!r:.80}: use A-Z a-z 0-9 . _ -")
    if quantize is not None and quantize not in METHODS:
        raise PublishError(f"unknown quantization {quantize!r}; use one of {', '.join(METHODS)}")
    if format not in ("onnx", "tflite"):
        raise PublishError(f"format must be onnx or tflite, got {format!r}")
    if format == "tflite" and tflite_file is None:
        raise PublishError("format='tflite' publishes a converted file: pass tflite_file")
    if format == "tflite" and quantize not in (None, "none"):
        raise PublishError(
            f"quantization {quantize} does not apply to a TFLite file, which is published as "
            "converted: quantize it when converting, and leave quantization out (or none)"
        )
    if not 0.0 <= min_agreement <= 1.0:
        raise PublishError(f"min_agreement must be within [0, 1], got {min_agreement}")
    if not expires_in_days > 0:
        raise PublishError(f"expires_in_days must be positive, got {expires_in_days}")
    return quantize or ("int8-static" if format == "onnx" else "none")


def _check_samples(
    method: str, format: str, calibration: np.ndarray | None, validation: object
) -> None:
    if format == "onnx" and method == "int8-static" and calibration is None:
        raise PublishError("int8-static quantization needs calibration inputs")
    if format == "onnx" and method != "none" and validation is None:
        raise PublishError(f"{method} needs validation inputs: agreement is the publish gate")


def _check_changed(
    target: PublishTarget, name: str, latest: LatestVersion | None, blob: bytes, raw: bytes
) -> None:
    """Refuse a model that is byte for byte one already published (a re-run, most likely)."""
    same = None
    if latest is not None:
        ref = latest.blob()
        if ref is not None and digest(raw) in (ref.raw_digest, ref.digest):
            same = latest.version
    if same is None:
        same = target.version_with_blob(name, digest(blob))
    if same is not None:
        raise IdenticalModelError(
            f"the model is byte for byte {name}@{same}, already published: "
            "nothing new to publish (another quantize mode builds a different version; "
            "allow_same publishes it anyway)",
            version=same,
        )


def _label(source: object) -> str:
    """How errors name the float model: the user's file where there is one."""
    if isinstance(source, str | os.PathLike):
        return str(source)
    return "the model bytes" if isinstance(source, bytes | bytearray) else "the exported module"


def _typed(inputs: np.ndarray | None, datatype: str) -> np.ndarray | None:
    if inputs is None or datatype == "BYTES":
        return inputs
    return np.ascontiguousarray(inputs, dtype=numpy_dtype(datatype))


def _float_model(
    source: Path | str | bytes | torch.nn.Module,
    example_input: np.ndarray | None,
    calibration: np.ndarray | None,
    val_inputs: np.ndarray | None,
) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        require_self_contained(bytes(source), "the model bytes")
        return bytes(source)
    if isinstance(source, str | os.PathLike):
        return read_onnx_file(Path(source))  # external weights inlined: one file to publish
    example = next((x for x in (example_input, calibration, val_inputs) if x is not None), None)
    if example is None:
        raise PublishError("exporting a torch module needs example_input (or sample inputs)")
    return export_torch(source, np.asarray(example[:2], dtype=np.float32))


def _validate(
    reference: OnnxModel,
    candidate: OnnxModel | TFLiteModel | str,
    plain: OnnxModel | None,
    inputs: np.ndarray | None,
    labels: np.ndarray | None,
    min_agreement: float,
) -> dict[str, Any]:
    if isinstance(candidate, str):
        return {"validated": False, "reason": candidate}
    if inputs is None:  # allowed for "none" and TFLite files only (checked up front)
        return {"validated": False, "reason": "no validation inputs given"}
    expected = reference.first_output(inputs)
    if isinstance(candidate, OnnxModel):
        got = candidate.first_output(inputs)
    else:
        shape = candidate.input_records[0].shape
        if len(shape) != inputs.ndim or any(
            s is not None and s != n for s, n in zip(shape[1:], inputs.shape[1:], strict=True)
        ):
            return {
                "validated": False,
                "reason": f"the TFLite input {list(shape)} does not take the float model's "
                f"samples {list(inputs.shape)}",
            }
        got = np.concatenate([candidate.run_float(chunk) for chunk in batches(inputs, None)])
    report = agreement_report(expected[: len(got)], got, labels)
    check_agreement(report, min_agreement)
    report["min_agreement"] = min_agreement
    if plain is not None:
        report["kernel_max_abs_diff"] = _max_diff({"": got}, {"": plain.first_output(inputs)})
    return {"validated": True, **report}


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return round(
        max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a),
        6,
    )


def _smoke(
    model: _Candidate, samples: np.ndarray | None, kernel_diff: float
) -> dict[str, Any] | None:
    candidate, plain, method = model.candidate, model.plain, model.method
    if samples is None or isinstance(candidate, str):
        return None
    if isinstance(candidate, TFLiteModel):
        quantized = candidate.quantize_input(samples)
        return smoke_test(candidate.inputs[0][0], quantized, candidate.run(quantized), method)
    outputs = candidate.run(samples)
    if plain is not None:
        kernel_diff = max(kernel_diff, _max_diff(outputs, plain.run(samples)))
    return smoke_test(candidate.input.name, samples, outputs, method, kernel_diff)


def _describe(
    candidate: OnnxModel | TFLiteModel | str, artifact: bytes
) -> tuple[tuple[Any, ...], tuple[Any, ...], dict[str, Any]]:
    """(inputs, outputs, requires) of the published model."""
    if isinstance(candidate, OnnxModel):
        import onnx

        model = onnx.load_model_from_string(artifact)
        opset = max(
            (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0
        )
        return candidate.inputs, candidate.outputs, {"runtime": "onnxruntime", "opset": opset}
    if isinstance(candidate, TFLiteModel):
        return candidate.input_records, candidate.output_records, {"runtime": "tflite"}
    return (), (), {"runtime": "tflite"}  # no interpreter here to read the specs


def _check_labels(labels: list[str], outputs: tuple[Any, ...]) -> None:
    if not all(isinstance(x, str) for x in labels):
        raise PublishError("labels must be strings")
    classes = outputs[0].shape[-1] if outputs and outputs[0].shape else None  # first output
    if classes is not None and classes != len(labels):
        raise PublishError(f"{len(labels)} labels for a model with {classes} outputs")


def _delta(
    target: PublishTarget,
    latest: LatestVersion | None,
    format: str,
    new_raw: bytes,
    full_size: int,
) -> tuple[DeltaRef, bytes] | None:
    """A delta from the latest version's model (not stored yet), when at hand and it pays.

    Both delta methods are made (a zstd patch with the old model as dictionary,
    and zstd of the byte-wise difference); the smaller one that rebuilds the
    new model byte for byte wins, if it is smaller than the full blob.
    """
    if latest is None:
        return None
    previous = latest.manifest.get("signed", {})
    ref = latest.blob()
    if not isinstance(previous, dict) or previous.get("format") != format or ref is None:
        return None
    try:
        data = target.blob(ref)
        old_raw = decompress_blob(data, ref.raw_size) if ref.compression == "zstd" else data
    except (ManifestError, BlobNotFoundError):
        return None  # a damaged or missing blob is no base for a patch
    best: tuple[DeltaRef, bytes] | None = None
    for method in DeltaRef.METHODS:  # the smallest that rebuilds the model, if any
        patch = make_delta(old_raw, new_raw, method=method)
        if len(patch) >= (len(best[1]) if best else full_size):
            continue
        if apply_delta(old_raw, patch, len(new_raw), method=method) != new_raw:
            continue
        best = DeltaRef(latest.version, digest(patch), len(patch), method), patch
    return best
