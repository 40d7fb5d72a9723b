"""``publish_package``: an ONNX Runtime GenAI model folder as one signed, versioned package.

Steps: read the folder (regular files at its top level only:
``shared.read_directory``) → check it is an ONNX Runtime GenAI model
(``genai_config.json``, its decoder file present) → load it with
``onnxruntime_genai`` and run the smoke generation (``shared.greedy_ids``:
greedy, from a fixed prompt; its output ids go into the manifest, and a
device runs it again after unpacking) → the canonical archive of the files
(``shared.pack_files``) → compress (zstd) → refuse a package byte for byte a
published version (unless ``allow_same``) → a delta from the previous
version's archive when smaller (the pipeline's own: zstd with the old archive
as dictionary, or the byte diff; the archive is canonical, so an unchanged
tokenizer or config lines up with its old bytes) → manifest (``format:
"onnx-genai"``, each file's size and SHA-256, what the runtime needs) → sign
→ the target stores the blobs and registers the manifest.

There is no quantize step: the model builder quantized already (INT4 for a
device, FP32 or FP16 for a hub); the quantization report says which weights
the graph holds (``int4`` when it has ``MatMulNBits`` nodes). The invariants
of ``_pipeline`` hold here too: nothing is stored before the package loaded,
generated and was signed; blobs are stored before the manifest is
registered; the version is checked before any work and again by the
registry.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shared import (
    MAX_BLOB_BYTES,
    BlobRef,
    ManifestError,
    ModelManifest,
    PackageError,
    PackageListing,
    SigningKey,
    compress_blob,
    digest,
    format_time,
    genai_execution_provider,
    greedy_ids,
    pack_files,
    read_directory,
    sign_document,
)
from shared.server.store import BlobStore

from .._errors import PublishError, VersionConflictError
from ..registry._base import Registry
from ._pipeline import (
    Progress,
    PublishResult,
    _check_arguments,
    _check_changed,
    _delta,
    _destination,
    _stage,
)
from ._targets import PublishTarget, Release

__all__ = ["DEFAULT_SMOKE_PROMPT", "PACKAGE_FORMAT", "is_package_dir", "publish_package"]

PACKAGE_FORMAT = "onnx-genai"
DEFAULT_SMOKE_PROMPT = "The "
_SMOKE_TOKENS = 8
_MAX_RAW_BYTES = 4 * 1024**3  # a folder above this is refused before it is read whole


def is_package_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ONNX Runtime GenAI model folder (it holds ``genai_config.json``)."""
    return Path(path).is_dir() and (Path(path) / "genai_config.json").is_file()


def publish_package(
    directory: str | os.PathLike[str],
    *,
    name: str,
    signing_key: SigningKey,
    registry: Registry | None = None,
    store: BlobStore | None = None,
    target: PublishTarget | None = None,
    version: int | None = None,
    expires_in_days: float = 365.0,
    smoke_prompt: str = DEFAULT_SMOKE_PROMPT,
    smoke_tokens: int = _SMOKE_TOKENS,
    progress: Progress | None = None,
    allow_same: bool = False,
) -> PublishResult:
    """Publish the model folder ``directory`` as ``name`` version ``version`` (default: the
    latest + 1); see the module docstring. Raises ``PublishError`` (and its subclasses)."""
    step: Progress = progress or (lambda stage, fraction: None)
    _check_arguments(name, None, "onnx", None, 0.0, expires_in_days)
    if not smoke_prompt or not 1 <= smoke_tokens <= 256:
        raise PublishError("the smoke test needs a prompt and 1 to 256 tokens")
    destination = _destination(target, registry, store)
    latest = destination.latest(name)
    if version is None:
        version = latest.version + 1 if latest else 1
    elif latest is not None and version <= latest.version:
        raise VersionConflictError(f"{name} version {version} is not above {latest.version}")
    with _stage(step, "read folder"):
        files, config = _read_package(Path(directory))
    with _stage(step, "validate"):
        smoke, report = _generate(Path(directory), smoke_prompt, smoke_tokens)
    report.update(_weights(files, config))
    with _stage(step, "compress"):
        raw = pack_files(files)
        blob = compress_blob(raw)
    if len(blob) > MAX_BLOB_BYTES:
        raise PublishError(f"the package compresses to {len(blob)} bytes; the CDN takes at most "
                           f"{MAX_BLOB_BYTES}")  # fmt: skip
    if not allow_same:
        _check_changed(destination, name, latest, blob, raw)
    with _stage(step, "delta"):
        delta = _delta(destination, latest, PACKAGE_FORMAT, raw, len(blob))
    now = datetime.now(UTC).replace(microsecond=0)
    try:
        manifest = ModelManifest(
            name=name,
            version=version,
            format=PACKAGE_FORMAT,
            requires=_requires(config),
            blob=BlobRef(digest(blob), len(blob), len(raw), "zstd", digest(raw)),
            deltas=(delta[0],) if delta else (),
            quantization=report,
            smoke_test=smoke,
            package=PackageListing.of(files),
            published_at=format_time(now),
            expires_at=format_time(now + timedelta(days=expires_in_days)),
        )
        signed = sign_document(manifest.to_dict(), signing_key)
    except ManifestError as e:
        raise PublishError(f"cannot build the manifest of {name}@{version}: {e}") from e
    blobs = {manifest.blob.digest: blob, **({delta[0].digest: delta[1]} if delta else {})}
    with _stage(step, "store and register"):
        destination.add(Release(name, version, signed, blobs))
    return PublishResult(manifest, signed, report, manifest.blob.digest, list(blobs)[1:])


def _read_package(directory: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The folder's files and its parsed ``genai_config.json``."""
    try:
        files = read_directory(directory, max_bytes=_MAX_RAW_BYTES)
    except (PackageError, OSError) as e:
        raise PublishError(f"cannot publish {directory} as a package: {e}") from e
    try:
        config = json.loads(files["genai_config.json"])
        decoder = config["model"]["decoder"]["filename"]
    except KeyError as e:
        raise PublishError(
            f"{directory} is not an ONNX Runtime GenAI model folder: no {e} in genai_config.json"
        ) from e
    except ValueError as e:
        raise PublishError(f"{directory}/genai_config.json is not JSON: {e}") from e
    if decoder not in files:
        raise PublishError(f"{directory}: genai_config.json names {decoder!r}, which is missing")
    return files, config


def _generate(directory: Path, prompt: str, tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the folder as a device will and record the smoke generation."""
    try:
        import onnxruntime_genai as og
    except ImportError as e:
        raise PublishError("publishing a package needs onnxruntime-genai: tandem[llm]") from e
    try:
        model = og.Model(str(directory))
        tokenizer = og.Tokenizer(model)
        prompt_ids = [int(t) for t in tokenizer.encode(prompt)]
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + tokens)
        output_ids = greedy_ids(og.Generator(model, params), prompt_ids, tokens)
    except Exception as e:  # ONNX Runtime GenAI's own errors
        raise PublishError(f"{directory} does not load and generate: {e}") from e
    if not prompt_ids or not output_ids:
        raise PublishError(f"{directory}: the smoke prompt {prompt!r} gave no tokens")
    smoke = {"prompt": prompt, "prompt_ids": prompt_ids, "output_ids": output_ids,
             "min_matching": len(output_ids)}  # fmt: skip
    report = {"method": "prebuilt", "validated": True, "smoke_tokens": len(output_ids),
              "runtime_version": og.__version__}  # fmt: skip
    return smoke, report


def _requires(config: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime_genai as og

    major_minor = ".".join(str(og.__version__).split(".")[:2])
    return {
        "runtime": "onnxruntime-genai",
        "min_version": major_minor,  # what validated it; older releases are not known to work
        "execution_provider": genai_execution_provider(config),
    }


def _weights(files: dict[str, bytes], config: dict[str, Any]) -> dict[str, Any]:
    """Which weights the graph holds, read from the graph (not its external data)."""
    import onnx

    graph = onnx.load_model_from_string(files[config["model"]["decoder"]["filename"]]).graph
    if any(node.op_type == "MatMulNBits" for node in graph.node):
        weights = "int4"
    else:
        types = {i.data_type for i in graph.initializer}
        weights = "fp16" if onnx.TensorProto.FLOAT16 in types else "fp32"
    total = sum(len(v) for v in files.values())
    return {"weights": weights, "float_bytes": total, "quantized_bytes": total}
