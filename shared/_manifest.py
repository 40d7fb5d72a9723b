"""Model manifests and assignments: the signed documents that move models to devices.

A **manifest** describes one published model version; it travels signed
(``_signing``) as ``{"signed": {...}, "signatures": [...]}``::

    {"type": "manifest", "spec_version": "1.0",
     "name": "mnist", "version": 3, "format": "onnx",
     "requires": {"runtime": "onnxruntime", "opset": 17},
     "inputs":  [{"name": "image", "datatype": "FP32", "shape": [null, 1, 28, 28]}],
     "outputs": [{"name": "logits", "datatype": "FP32", "shape": [null, 10]}],
     "labels": ["0", …, "9"],
     "blob": {"digest": "sha256:…", "size": 4123, "raw_size": 13600, "compression": "zstd"},
     "deltas": [{"from_version": 2, "digest": "sha256:…", "size": 1200,
                 "compression": "zstd-patch"}],
     "quantization": {"method": "int8-static", "agreement": 0.991, …},
     "smoke_test": {"inputs": {...}, "outputs": {...}, "atol": 0.01},
     "published_at": "2026-11-30T09:00:00Z", "expires_at": "2027-11-30T09:00:00Z"}

An **assignment** tells one device which version to run; it is signed by the
assigner role's keys (``_root``: the online key of the rollout server; with
keys pinned the old way, the same publisher key), so a rollback to a lower
version is something only they can order, and a model only the publisher
role can vouch for::

    {"type": "assignment", "spec_version": "1.0", "device": "cam-7", "model": "mnist",
     "version": 2, "rollback": true, "rollout": "r-12",
     "issued_at": "…", "expires_at": "…"}

Both validate in their constructor, refuse an unknown major ``spec_version``,
and keep unknown fields (``extra``) so that a newer publisher's fields survive
a round trip and stay covered by the signature.

A **package** (``format: "onnx-genai"``: an ONNX Runtime GenAI model folder as
one blob, ``shared._package`` has its fields) has ``blob`` = the zstd of the
folder's canonical archive, ``package`` = each file's name, size and SHA-256,
``smoke_test`` = a greedy generation (prompt, its ids, output ids) and empty
``inputs``/``outputs``. A device built before packages refuses one at
``format`` ("format must be onnx or tflite, got 'onnx-genai'") before it
downloads anything; every manifest it could read before reads the same.

Smoke-test tensors are ``{"datatype", "shape", "data"}`` with ``data`` the
base64 of little-endian row-major bytes (never pickle), or, with
``"compression": "zstd"``, the base64 of one zstd frame of those bytes. A
device decompresses no further than the shape's size (the shape times the item size,
1 MiB at most per tensor and :data:`MAX_SMOKE_BYTES` for all of them), so a
small signed document cannot make it allocate more.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import numpy as np

from ._blobs import DELTA_METHODS, compress_blob, decompress_blob
from ._cdn_paths import DIGEST_PATTERN
from ._errors import ExpiredError, ManifestError, TensorError
from ._limits import MAX_DOCUMENT_BYTES
from ._package import PACKAGE_FORMATS, GenerationSmokeTest, PackageListing
from ._signing import PublicKey, canonical_json, verify_signed
from ._tensor_spec import TensorSpec
from ._tensors import DATATYPES, datatype_of
from ._topics import NAME_PATTERN

__all__ = [
    "SPEC_VERSION",
    "Assignment",
    "BlobRef",
    "DeltaRef",
    "ModelManifest",
    "claimed_version",
    "decode_sample",
    "encode_sample",
    "format_time",
    "parse_time",
    "verify_assignment",
    "verify_manifest",
]

SPEC_VERSION = "1.0"
MAX_SMOKE_BYTES = 1024 * 1024  # decoded smoke-test tensors in all: what zstd may expand to
_METHOD = re.compile(r"[a-z0-9][a-z0-9.+-]{0,39}")
_FORMATS = frozenset({"onnx", "tflite"}) | PACKAGE_FORMATS


def claimed_version(raw: bytes | str) -> int | None:
    """The version an unverified signed document claims, or None: only to label a report
    about refusing it (never to act on)."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        return None
    try:
        version = json.loads(raw)["signed"]["version"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if isinstance(version, int) and not isinstance(version, bool) and version >= 1:
        return version
    return None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, what: str) -> datetime:
    if not isinstance(value, str):
        raise ManifestError(f"{what} must be an RFC 3339 UTC time string")
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError as e:
        raise ManifestError(f"{what} {value!r} is not YYYY-MM-DDTHH:MM:SSZ") from e
    return moment.replace(tzinfo=UTC)


def _spec_version(value: object) -> None:
    if not isinstance(value, str) or not re.fullmatch(r"\d+\.\d+", value):
        raise ManifestError(f"spec_version must read 'MAJOR.MINOR', got {value!r}")
    if value.split(".")[0] != SPEC_VERSION.split(".")[0]:
        raise ManifestError(f"spec_version {value} is not {SPEC_VERSION.split('.')[0]}.x")


def _int(value: object, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ManifestError(f"{what} must be an integer >= {minimum}, got {value!r:.40}")
    return value


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ManifestError(f"{what} {value!r:.60} is not a valid name (A-Z a-z 0-9 . _ -)")
    return value


@dataclass(frozen=True)
class BlobRef:
    digest: str  # "sha256:<hex>" of the stored (compressed) bytes
    size: int  # stored bytes
    raw_size: int  # bytes after decompression: the model file
    compression: str = "zstd"  # "zstd" | "none"
    raw_digest: str | None = None  # digest of the raw model: what a delta install must rebuild

    @classmethod
    def from_dict(cls, d: object, what: str = "blob") -> BlobRef:
        if not isinstance(d, dict):
            raise ManifestError(f"{what} must be an object")
        digest = d.get("digest")
        if not isinstance(digest, str) or not DIGEST_PATTERN.fullmatch(digest):
            raise ManifestError(f"{what}.digest must be 'sha256:<64 hex>', got {digest!r:.80}")
        compression = d.get("compression", "zstd")
        if compression not in ("zstd", "none"):
            raise ManifestError(f"{what}.compression must be zstd or none, got {compression!r}")
        raw_digest = d.get("raw_digest")
        if raw_digest is not None and (
            not isinstance(raw_digest, str) or not DIGEST_PATTERN.fullmatch(raw_digest)
        ):
            raise ManifestError(f"{what}.raw_digest must be 'sha256:<64 hex>'")
        return cls(
            digest,
            _int(d.get("size"), f"{what}.size", 1),
            _int(d.get("raw_size"), f"{what}.raw_size", 1),
            compression,
            raw_digest,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "digest": self.digest,
            "size": self.size,
            "raw_size": self.raw_size,
            "compression": self.compression,
        }
        if self.raw_digest is not None:
            d["raw_digest"] = self.raw_digest
        return d


@dataclass(frozen=True)
class DeltaRef:
    """A delta that rebuilds this version's raw model from ``from_version``'s.

    ``compression`` names how (``shared._blobs``): ``"zstd-patch"`` (the
    default, and what a delta without the field is) or ``"zstd-bytediff"``.
    Any other method name is kept, not refused, so that a manifest from a
    newer publisher still verifies here; ``supported`` is false for it and a
    device downloads the full blob instead.
    """

    METHODS: ClassVar[tuple[str, ...]] = DELTA_METHODS

    from_version: int
    digest: str
    size: int
    compression: str = "zstd-patch"

    @property
    def supported(self) -> bool:
        return self.compression in DELTA_METHODS

    @classmethod
    def from_dict(cls, d: object) -> DeltaRef:
        if not isinstance(d, dict):
            raise ManifestError("deltas[] must be objects")
        digest = d.get("digest")
        if not isinstance(digest, str) or not DIGEST_PATTERN.fullmatch(digest):
            raise ManifestError(f"deltas[].digest must be 'sha256:<64 hex>', got {digest!r:.80}")
        compression = d.get("compression", "zstd-patch")
        if not isinstance(compression, str) or not _METHOD.fullmatch(compression):
            raise ManifestError(
                f"deltas[].compression must name a method (e.g. {' or '.join(DELTA_METHODS)}), "
                f"got {compression!r:.40}"
            )
        return cls(
            _int(d.get("from_version"), "deltas[].from_version", 1),
            digest,
            _int(d.get("size"), "deltas[].size", 1),
            compression,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "from_version": self.from_version,
            "digest": self.digest,
            "size": self.size,
            "compression": self.compression,
        }


def _tensor_specs(items: object, what: str) -> tuple[TensorSpec, ...]:
    if not isinstance(items, list):
        raise ManifestError(f"{what} must be a list of tensor specs")
    try:
        return tuple(TensorSpec.from_dict(x) for x in items)
    except TensorError as e:
        raise ManifestError(f"{what}: {e}") from None


def encode_sample(array: np.ndarray, *, compress: bool = False) -> dict[str, Any]:
    """A smoke-test tensor as JSON; with ``compress``, zstd before base64 when that is smaller."""
    array = np.ascontiguousarray(array)
    datatype = datatype_of(array)
    if datatype == "BYTES":
        raise ManifestError("smoke-test tensors must be numeric")
    raw = array.astype(DATATYPES[datatype], copy=False).tobytes()
    sample: dict[str, Any] = {"datatype": datatype, "shape": list(array.shape)}
    packed = compress_blob(raw) if compress else raw
    if len(packed) < len(raw):
        sample["compression"] = "zstd"
    else:
        packed = raw
    sample["data"] = base64.b64encode(packed).decode()
    return sample


def decode_sample(d: object, what: str = "sample") -> np.ndarray:
    if not isinstance(d, dict):
        raise ManifestError(f"{what} must be an object with datatype, shape and data")
    datatype, shape, data = d.get("datatype"), d.get("shape"), d.get("data")
    compression = d.get("compression", "none")
    if datatype not in DATATYPES or datatype == "BYTES":
        raise ManifestError(f"{what}: unsupported datatype {datatype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise ManifestError(f"{what}: shape must be a list of non-negative ints")
    if compression not in ("none", "zstd"):
        raise ManifestError(f"{what}: compression must be none or zstd, got {compression!r:.40}")
    if not isinstance(data, str) or len(data) > MAX_DOCUMENT_BYTES:
        raise ManifestError(f"{what}: data must be base64 text")
    dtype = DATATYPES[str(datatype)]
    size = math.prod(shape) * dtype.itemsize
    if size > MAX_DOCUMENT_BYTES:
        raise ManifestError(f"{what}: sample larger than a manifest may carry")
    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error as e:
        raise ManifestError(f"{what}: data is not base64: {e}") from e
    if compression == "zstd":
        try:
            raw = decompress_blob(raw, size)  # bounded: never more than the shape holds
        except ManifestError as e:
            raise ManifestError(f"{what}: {e}") from e
    if len(raw) != size:
        raise ManifestError(f"{what}: {len(raw)} bytes do not fill shape {shape} of {datatype}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _decode_samples(samples: dict[str, Any], what: str, budget: list[int]) -> dict[str, np.ndarray]:
    """Decode one after the other, so compressed samples cannot add up past the budget."""
    decoded = {}
    for name, sample in samples.items():
        array = decode_sample(sample, f"{what}.{name}")
        budget[0] -= array.nbytes
        if budget[0] < 0:
            raise ManifestError(f"smoke_test: samples above {MAX_SMOKE_BYTES} bytes in all")
        decoded[name] = array
    return decoded


_MANIFEST_KEYS = frozenset(
    {
        "type",
        "spec_version",
        "name",
        "version",
        "format",
        "requires",
        "inputs",
        "outputs",
        "labels",
        "blob",
        "deltas",
        "quantization",
        "smoke_test",
        "published_at",
        "expires_at",
        "package",
    }
)


@dataclass(frozen=True, kw_only=True)
class ModelManifest:
    name: str
    version: int
    format: str
    blob: BlobRef
    published_at: str
    expires_at: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    requires: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None
    deltas: tuple[DeltaRef, ...] = ()
    quantization: dict[str, Any] = field(default_factory=dict)
    smoke_test: dict[str, Any] | None = None
    package: PackageListing | None = None  # the files of a package (formats PACKAGE_FORMATS)
    spec_version: str = SPEC_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _spec_version(self.spec_version)
        _name(self.name, "model name")
        _int(self.version, "version", 1)
        if self.format not in _FORMATS:
            raise ManifestError(f"format must be onnx, tflite or onnx-genai, got {self.format!r}")
        if self.is_package != (self.package is not None):
            raise ManifestError(f"a package lists its files, and only a package: {self.format}")
        if self.package is not None and self.package.total_size >= self.blob.raw_size:
            raise ManifestError("package files add up to more than the archive's raw_size")
        if parse_time(self.expires_at, "expires_at") <= parse_time(
            self.published_at, "published_at"
        ):
            raise ManifestError("expires_at must be after published_at")
        if not isinstance(self.requires, dict) or not isinstance(self.quantization, dict):
            raise ManifestError("requires and quantization must be objects")
        if self.labels is not None and not all(isinstance(x, str) for x in self.labels):
            raise ManifestError("labels must be strings")
        if self.smoke_test is not None and self.is_package:
            self.generation_smoke()  # validates
        elif self.smoke_test is not None:
            self.smoke_samples()  # validates

    @property
    def is_package(self) -> bool:
        """Whether the blob is a folder's archive (``package``) rather than one model file."""
        return self.format in PACKAGE_FORMATS

    @property
    def model_file(self) -> str:
        return "package" if self.is_package else f"model.{self.format}"

    def generation_smoke(self) -> GenerationSmokeTest:
        """A package's smoke test (``ManifestError`` if it carries none, or a bad one)."""
        return GenerationSmokeTest.from_dict(self.smoke_test)

    def expired(self, now: datetime | None = None) -> bool:
        return (now or datetime.now(UTC)) >= parse_time(self.expires_at, "expires_at")

    def smoke_samples(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
        """(inputs, expected outputs, absolute tolerance) for the device's smoke test."""
        st = self.smoke_test
        if not isinstance(st, dict):
            raise ManifestError("this manifest carries no smoke test")
        ins, outs, atol = st.get("inputs"), st.get("outputs"), st.get("atol", 1e-3)
        if not isinstance(ins, dict) or not isinstance(outs, dict) or not ins or not outs:
            raise ManifestError("smoke_test needs non-empty inputs and outputs objects")
        if not isinstance(atol, int | float) or isinstance(atol, bool) or not atol >= 0:
            raise ManifestError("smoke_test.atol must be a non-negative number")
        budget = [MAX_SMOKE_BYTES]
        return (
            _decode_samples(ins, "smoke_test.inputs", budget),
            _decode_samples(outs, "smoke_test.outputs", budget),
            float(atol),
        )

    @classmethod
    def from_dict(cls, d: object) -> ModelManifest:
        if not isinstance(d, dict):
            raise ManifestError("a manifest must be a JSON object")
        if d.get("type") != "manifest":
            raise ManifestError(f"type must be 'manifest', got {d.get('type')!r:.40}")
        for key in ("inputs", "outputs", "deltas"):
            if not isinstance(d.get(key, []), list):
                raise ManifestError(f"{key} must be a list")
        labels = d.get("labels")
        if labels is not None and not isinstance(labels, list):
            raise ManifestError("labels must be a list of strings")
        return cls(
            spec_version=d.get("spec_version"),  # type: ignore[arg-type]  # validated
            name=d.get("name"),  # type: ignore[arg-type]
            version=d.get("version"),  # type: ignore[arg-type]
            format=d.get("format"),  # type: ignore[arg-type]
            requires=d.get("requires", {}),
            inputs=_tensor_specs(d.get("inputs", []), "inputs"),
            outputs=_tensor_specs(d.get("outputs", []), "outputs"),
            labels=tuple(labels) if labels is not None else None,
            blob=BlobRef.from_dict(d.get("blob")),
            deltas=tuple(DeltaRef.from_dict(x) for x in d.get("deltas", [])),
            quantization=d.get("quantization", {}),
            smoke_test=d.get("smoke_test"),
            package=PackageListing.from_dict(d["package"]) if "package" in d else None,
            published_at=d.get("published_at"),  # type: ignore[arg-type]
            expires_at=d.get("expires_at"),  # type: ignore[arg-type]
            extra={k: v for k, v in d.items() if k not in _MANIFEST_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            type="manifest",
            spec_version=self.spec_version,
            name=self.name,
            version=self.version,
            format=self.format,
            requires=self.requires,
            inputs=[t.to_dict() for t in self.inputs],
            outputs=[t.to_dict() for t in self.outputs],
            blob=self.blob.to_dict(),
            deltas=[x.to_dict() for x in self.deltas],
            quantization=self.quantization,
            published_at=self.published_at,
            expires_at=self.expires_at,
        )
        if self.labels is not None:
            d["labels"] = list(self.labels)
        if self.smoke_test is not None:
            d["smoke_test"] = self.smoke_test
        if self.package is not None:
            d["package"] = self.package.to_dict()
        canonical_json(d)  # fails early on what cannot be signed
        return d


_ASSIGNMENT_KEYS = frozenset(
    {
        "type",
        "spec_version",
        "device",
        "model",
        "version",
        "rollback",
        "rollout",
        "issued_at",
        "expires_at",
    }
)


@dataclass(frozen=True, kw_only=True)
class Assignment:
    device: str
    model: str
    version: int
    issued_at: str
    expires_at: str
    rollback: bool = False  # permits going below the highest version the device accepted
    rollout: str | None = None
    spec_version: str = SPEC_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _spec_version(self.spec_version)
        _name(self.device, "device id")
        _name(self.model, "model name")
        _int(self.version, "version", 1)
        if not isinstance(self.rollback, bool):
            raise ManifestError("rollback must be true or false")
        if self.rollout is not None and not isinstance(self.rollout, str):
            raise ManifestError("rollout must be a string")
        if parse_time(self.expires_at, "expires_at") <= parse_time(self.issued_at, "issued_at"):
            raise ManifestError("expires_at must be after issued_at")

    def expired(self, now: datetime | None = None) -> bool:
        return (now or datetime.now(UTC)) >= parse_time(self.expires_at, "expires_at")

    @classmethod
    def from_dict(cls, d: object) -> Assignment:
        if not isinstance(d, dict) or d.get("type") != "assignment":
            raise ManifestError("an assignment is an object with type 'assignment'")
        return cls(
            spec_version=d.get("spec_version"),  # type: ignore[arg-type]
            device=d.get("device"),  # type: ignore[arg-type]
            model=d.get("model"),  # type: ignore[arg-type]
            version=d.get("version"),  # type: ignore[arg-type]
            rollback=d.get("rollback", False),
            rollout=d.get("rollout"),
            issued_at=d.get("issued_at"),  # type: ignore[arg-type]
            expires_at=d.get("expires_at"),  # type: ignore[arg-type]
            extra={k: v for k, v in d.items() if k not in _ASSIGNMENT_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            type="assignment",
            spec_version=self.spec_version,
            device=self.device,
            model=self.model,
            version=self.version,
            rollback=self.rollback,
            issued_at=self.issued_at,
            expires_at=self.expires_at,
        )
        if self.rollout is not None:
            d["rollout"] = self.rollout
        return d


def _load(raw: bytes | str | Mapping[str, Any]) -> object:
    if isinstance(raw, Mapping):
        return dict(raw)
    import json

    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ManifestError(
            f"signed document of {len(raw)} bytes; the limit is {MAX_DOCUMENT_BYTES}"
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"signed document is not JSON: {e}") from e


def verify_manifest(
    raw: bytes | str | Mapping[str, Any],
    trusted: Mapping[str, PublicKey] | list[PublicKey],
    *,
    now: datetime | None = None,
    threshold: int = 1,
) -> ModelManifest:
    """A manifest that ``threshold`` distinct trusted keys signed and that has not expired
    (``shared.TrustedRoot.verify_manifest`` passes the publisher role's keys)."""
    manifest = ModelManifest.from_dict(verify_signed(_load(raw), trusted, threshold=threshold))
    if manifest.expired(now):
        raise ExpiredError(
            f"manifest {manifest.name}@{manifest.version} expired at {manifest.expires_at}"
        )
    return manifest


def verify_assignment(
    raw: bytes | str | Mapping[str, Any],
    trusted: Mapping[str, PublicKey] | list[PublicKey],
    *,
    now: datetime | None = None,
    threshold: int = 1,
) -> Assignment:
    """An assignment that ``threshold`` distinct trusted keys signed and that has not expired
    (``shared.TrustedRoot.verify_assignment`` passes the assigner role's keys)."""
    assignment = Assignment.from_dict(verify_signed(_load(raw), trusted, threshold=threshold))
    if assignment.expired(now):
        raise ExpiredError(f"assignment for {assignment.device} expired at {assignment.expires_at}")
    return assignment
