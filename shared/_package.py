"""Model packages: a model folder (ONNX Runtime GenAI's) as one archive, and back, safely.

A language model is a folder, not a file: ``genai_config.json``, the ONNX
graph, its external weights (``model.onnx.data``), the tokenizer files. The
CDN moves it as one blob like any model; publisher and device must agree on
its bytes exactly, so both use this module:

- ``pack_files(files)``: the **canonical archive** of ``{name: bytes}``: a
  POSIX ustar tar, members in byte order of their names, each a regular file
  with mode 0644, uid/gid 0, no user or group names, mtime 0, nothing else
  (no directories, no links, no pax headers), ended by the two zero blocks
  ``tarfile`` writes and padded to its 10240-byte record. The same files give the
  same bytes on every machine and Python version, so an archive is content
  addressed by its files, and a device can rebuild it from what it unpacked
  (to check a stored copy, or as the base of a delta) without keeping it.
- ``read_directory(path)``: the files of a model folder: regular files only,
  at its top level (ONNX Runtime GenAI folders are flat), names that match
  :data:`MEMBER_NAME`; a link, a sub-folder or another name is refused.
- ``unpack_package(raw, listing)``: the files of an archive that the signed
  manifest lists (``PackageListing``). It is hostile-input safe: ``raw`` is
  already bounded by the manifest's ``raw_size``; every member must be a
  regular file, named as listed (a name with ``/``, ``..``, an absolute path
  or any name the listing does not hold is refused before its data is
  read), appear once, have exactly the listed size (checked from the header,
  before reading) and SHA-256; every listed file must be present; and the
  archive must be the canonical one of those files byte for byte (so no
  trailing data, pax header or reordering gets through). Anything else is a
  ``PackageError``. Nothing is written to disk here: the caller writes the
  verified files where it wants them (``tarfile.extractall`` is never used).
- ``greedy_ids(generator, prompt_ids, max_tokens)``: the smoke generation
  both ends run (publisher to record it, device to check it): append the
  prompt, then up to ``max_tokens`` greedy steps, stopping when the
  generator is done.

In the manifest (``format: "onnx-genai"``)::

    "requires": {"runtime": "onnxruntime-genai", "min_version": "0.18",
                 "execution_provider": "CPUExecutionProvider"},
    "package": {"archive": "tar", "files": [{"name": "genai_config.json",
                                             "size": 1449, "digest": "sha256:…"}, …]},
    "smoke_test": {"prompt": "The ", "prompt_ids": [54, 265, 223],
                   "output_ids": [223, …], "min_matching": 8}

``min_matching`` is how many leading output ids must match (all by default).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._cdn_paths import DIGEST_PATTERN
from ._errors import ManifestError, PackageError

__all__ = [
    "MAX_PACKAGE_FILES",
    "MAX_SMOKE_TOKENS",
    "MEMBER_NAME",
    "PACKAGE_FORMATS",
    "GenerationSmokeTest",
    "PackageFile",
    "PackageListing",
    "genai_execution_provider",
    "greedy_ids",
    "pack_files",
    "read_directory",
    "unpack_package",
]

PACKAGE_FORMATS = frozenset({"onnx-genai"})  # manifest formats that are packages, not one file
MAX_PACKAGE_FILES = 64
MAX_SMOKE_TOKENS = 256  # ids in a package's smoke test, prompt and output each
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A member's name: one path component, no leading dot, at most 100 bytes (ustar's name
field): no ``/``, so no absolute path, and ``..`` cannot be one."""

# genai_config.json's provider_options keys -> ONNX Runtime's execution provider names.
_PROVIDERS = {
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
    "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider",
    "vitisai": "VitisAIExecutionProvider",
    "rocm": "ROCMExecutionProvider",
}


def _member_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not MEMBER_NAME.fullmatch(value) or ".." in value:
        raise PackageError(f"{what} {value!r:.80} is not a plain file name (A-Z a-z 0-9 . _ -)")
    return value


@dataclass(frozen=True)
class PackageFile:
    name: str  # one path component (MEMBER_NAME)
    size: int  # bytes
    digest: str  # "sha256:<hex>" of the file

    @classmethod
    def from_dict(cls, d: object) -> PackageFile:
        if not isinstance(d, dict):
            raise ManifestError("package.files[] must be objects")
        name = _member_name(d.get("name"), "package.files[].name")
        size, file_digest = d.get("size"), d.get("digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"package.files[].size of {name} must be an integer >= 0")
        if not isinstance(file_digest, str) or not DIGEST_PATTERN.fullmatch(file_digest):
            raise ManifestError(f"package.files[].digest of {name} must be 'sha256:<64 hex>'")
        return cls(name, size, file_digest)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "digest": self.digest}


@dataclass(frozen=True)
class PackageListing:
    """The files of a package as the signed manifest lists them, in archive order."""

    files: tuple[PackageFile, ...]
    archive: str = "tar"

    def __post_init__(self) -> None:
        if self.archive != "tar":
            raise ManifestError(f"package.archive must be 'tar', got {self.archive!r:.40}")
        if not self.files or len(self.files) > MAX_PACKAGE_FILES:
            raise ManifestError(f"a package lists 1 to {MAX_PACKAGE_FILES} files")
        names = [f.name for f in self.files]
        if names != sorted(set(names)):
            raise ManifestError("package.files must be sorted by name, each name once")

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def by_name(self) -> dict[str, PackageFile]:
        return {f.name: f for f in self.files}

    @classmethod
    def from_dict(cls, d: object) -> PackageListing:
        if not isinstance(d, dict) or not isinstance(d.get("files"), list):
            raise ManifestError("package must be an object with a files list")
        if len(d["files"]) > MAX_PACKAGE_FILES:
            raise ManifestError(f"a package lists at most {MAX_PACKAGE_FILES} files")
        return cls(tuple(PackageFile.from_dict(x) for x in d["files"]), d.get("archive", "tar"))

    @classmethod
    def of(cls, files: Mapping[str, bytes]) -> PackageListing:
        return cls(tuple(PackageFile(n, len(files[n]), _sha256(files[n])) for n in sorted(files)))

    def to_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "files": [f.to_dict() for f in self.files]}


def _token_ids(value: object, what: str) -> list[int]:
    if (
        not isinstance(value, list)
        or len(value) > MAX_SMOKE_TOKENS
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise ManifestError(f"{what} must be a list of at most {MAX_SMOKE_TOKENS} token ids")
    return value


@dataclass(frozen=True)
class GenerationSmokeTest:
    """A package's smoke test: greedy ``output_ids`` after ``prompt`` (``prompt_ids``)."""

    prompt: str
    prompt_ids: list[int]
    output_ids: list[int]
    min_matching: int  # leading output ids that must match

    @classmethod
    def from_dict(cls, d: object) -> GenerationSmokeTest:
        if not isinstance(d, dict) or not isinstance(d.get("prompt"), str):
            raise ManifestError("a package's smoke_test needs prompt, prompt_ids and output_ids")
        prompt_ids = _token_ids(d.get("prompt_ids"), "smoke_test.prompt_ids")
        output_ids = _token_ids(d.get("output_ids"), "smoke_test.output_ids")
        if not prompt_ids or not output_ids:
            raise ManifestError("smoke_test.prompt_ids and output_ids must not be empty")
        matching = d.get("min_matching", len(output_ids))
        if (
            not isinstance(matching, int)
            or isinstance(matching, bool)
            or not 1 <= matching <= len(output_ids)
        ):
            raise ManifestError("smoke_test.min_matching must be 1 to the number of output ids")
        return cls(d["prompt"], prompt_ids, output_ids, matching)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pack_files(files: Mapping[str, bytes]) -> bytes:
    """The canonical archive of ``files`` (see the module docstring)."""
    if not files or len(files) > MAX_PACKAGE_FILES:
        raise PackageError(f"a package holds 1 to {MAX_PACKAGE_FILES} files, not {len(files)}")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(_member_name(name, "file"))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def read_directory(path: str | os.PathLike[str], *, max_bytes: int) -> dict[str, bytes]:
    """The files of a flat model folder, refusing links, sub-folders and odd names."""
    folder = Path(path)
    if not folder.is_dir():
        raise PackageError(f"{folder} is not a folder")
    files: dict[str, bytes] = {}
    total = 0
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() or not entry.is_file():
            raise PackageError(f"{entry}: a package holds regular files only (no links, folders)")
        _member_name(entry.name, f"{folder}: file")
        total += entry.stat().st_size
        if total > max_bytes or len(files) >= MAX_PACKAGE_FILES:
            raise PackageError(f"{folder} holds more than {max_bytes} bytes or too many files")
        files[entry.name] = entry.read_bytes()
    if not files:
        raise PackageError(f"{folder} is empty")
    return files


def unpack_package(raw: bytes, listing: PackageListing) -> dict[str, bytes]:
    """The verified files of the archive ``raw`` (see the module docstring); ``PackageError``
    for anything but the canonical archive of exactly the listed files."""
    wanted = listing.by_name()
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            while (member := tar.next()) is not None:
                _check_member(member, wanted, files)
                reader = tar.extractfile(member)
                data = reader.read(member.size + 1) if reader is not None else b""
                expected = wanted[member.name]
                if len(data) != expected.size or _sha256(data) != expected.digest:
                    raise PackageError(f"member {member.name}: not the file the manifest lists")
                files[member.name] = data
    except (tarfile.TarError, EOFError, UnicodeError, ValueError, OverflowError) as e:
        if isinstance(e, PackageError):
            raise
        raise PackageError(f"not a readable package archive: {e}") from e
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise PackageError(f"the archive lacks {', '.join(missing)}, which the manifest lists")
    if pack_files(files) != raw:
        raise PackageError("not the canonical archive of its files (extra data or headers)")
    return files


def _check_member(member: tarfile.TarInfo, wanted: dict[str, PackageFile], seen: object) -> None:
    """Before any data is read: a regular file the listing names, once, of its size."""
    name = member.name
    if not member.isreg() or member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise PackageError(f"member {name!r:.80} is not a regular file (a link or a device?)")
    _member_name(name, "member")
    if name not in wanted:
        raise PackageError(f"member {name!r:.80} is not listed in the manifest")
    if name in seen:  # type: ignore[operator]  # a dict of the files read so far
        raise PackageError(f"member {name!r:.80} appears twice")
    if member.size != wanted[name].size:
        raise PackageError(
            f"member {name} declares {member.size} bytes; the manifest lists {wanted[name].size}"
        )


def genai_execution_provider(config: object) -> str:
    """The execution provider a ``genai_config.json`` asks for, as ONNX Runtime names it."""
    model = config.get("model", {}) if isinstance(config, dict) else {}
    decoder = model.get("decoder", {}) if isinstance(model, dict) else {}
    options = decoder.get("session_options", {}) if isinstance(decoder, dict) else {}
    entries = options.get("provider_options", []) if isinstance(options, dict) else []
    for entry in entries if isinstance(entries, list) else []:
        for key in entry if isinstance(entry, dict) else ():
            return _PROVIDERS.get(str(key).lower(), f"{key}ExecutionProvider")
    return "CPUExecutionProvider"


def greedy_ids(generator: Any, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The smoke generation: ``prompt_ids`` appended to an ONNX Runtime GenAI generator made
    with greedy search, then up to ``max_tokens`` steps (fewer once it is done)."""
    import numpy as np

    generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
    out: list[int] = []
    while len(out) < max_tokens and not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out
