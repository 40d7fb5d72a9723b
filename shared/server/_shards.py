"""Shards of collected examples: what the hub writes and a training job reads, in a blob store.

Layout, as objects of a ``shared.server.store`` store::

    examples/<model>/<stamp>-<writer>-<seq>.npz    the columns (numpy's npz, no pickles)
    examples/<model>/<stamp>-<writer>-<seq>.json   the manifest (``ShardManifest``), written last

The manifest commits a shard: readers list manifests, so data written by a
writer that died before its manifest is never read; the manifest names the
data's size and SHA-256, so a damaged or swapped file is refused. ``stamp``
(UTC, to the millisecond) makes keys sort by time.

Columns, one row per row of a collected request (``N`` rows)::

    input.<name>    the input as received, [N, *row shape]; absent when inputs are not kept
    input_sha256    uint8 [N, 32]: ``input_digests`` of the row, always
    output.<name>   the cloud's answer, [N, *row shape]
    cloud_label     int64 [N]: top class of the first output (``top_classes``)
    edge_label      int64 [N]: the device's top class; -1 when its model did not run
    edge_score      float32 [N]: the device's uncertainty score; NaN when it sent none
    reason          uint8 [N]: index into ``REASONS`` (why the row was kept)
    device          uint32 [N]: index into the manifest's ``devices``
    edge_model      uint32 [N]: index into ``edge_models`` ("" when the device named none)
    cloud_version   uint32 [N]: index into ``cloud_versions``
    time            float64 [N]: when the hub received the request, Unix seconds

Reading checks sizes before it allocates (the manifest, the data, the
columns' declared sizes), loads arrays with ``allow_pickle=False`` and checks
every column against the manifest; a shard that breaks a rule raises
``ExampleShardError`` (``BlobNotFoundError`` when a file is gone).
"""

from __future__ import annotations

import io
import json
import re
import time
import zipfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .._blobs import digest
from .._errors import ExampleShardError
from .._example_rows import REASONS, ExampleRows
from .._limits import MAX_DOCUMENT_BYTES
from .._topics import NAME_PATTERN
from ._shard_manifest import ShardManifest
from .store import BlobStore

__all__ = [
    "EXAMPLES_AREA",
    "list_shards",
    "load_examples",
    "read_manifest",
    "read_shard",
    "shard_prefix",
    "write_shard",
]

EXAMPLES_AREA = "examples"
MAX_SHARD_BYTES = 256 * 1024 * 1024  # a shard's data file, as stored
MAX_DECODED_BYTES = 1024 * 1024 * 1024  # its columns, decoded
_FIXED: dict[str, np.dtype[Any]] = {
    "input_sha256": np.dtype(np.uint8),
    "cloud_label": np.dtype(np.int64),
    "edge_label": np.dtype(np.int64),
    "edge_score": np.dtype(np.float32),
    "reason": np.dtype(np.uint8),
    "device": np.dtype(np.uint32),
    "edge_model": np.dtype(np.uint32),
    "cloud_version": np.dtype(np.uint32),
    "time": np.dtype(np.float64),
}
_CATEGORIES = ("device", "edge_model", "cloud_version")
_WRITER = re.compile(r"[^A-Za-z0-9_-]+")


def shard_prefix(model: str) -> str:
    """Where ``model``'s shards live: ``examples/<model>/``."""
    if not isinstance(model, str) or not NAME_PATTERN.fullmatch(model):
        raise ExampleShardError(f"not a model name: {model!r:.80}")
    return f"{EXAMPLES_AREA}/{model}/"


# --------------------------------------------------------------------------- writing


def write_shard(
    store: BlobStore,
    model: str,
    rows: ExampleRows,
    *,
    writer: str,
    seq: int,
    now: float | None = None,
) -> ShardManifest:
    """Write ``rows`` as one shard of ``model``: the data, then the manifest that commits it."""
    if len(rows) == 0:
        raise ExampleShardError("a shard holds at least one row")
    created = time.time() if now is None else now
    millis = int(created * 1000) % 1000
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(created)) + f"{millis:03d}Z"
    writer_name = _WRITER.sub("-", writer)[:64].strip("-") or "writer"
    key = f"{shard_prefix(model)}{stamp}-{writer_name}-{seq:06d}"
    data, lists = _encode(rows)
    counts = np.bincount(_indices(rows.devices, lists["device"]), minlength=len(lists["device"]))
    manifest = ShardManifest(
        model=model,
        key=key,
        rows=len(rows),
        writer=writer,
        created_at=round(created, 3),
        first_at=float(rows.times.min()),
        last_at=float(rows.times.max()),
        inputs_kept=rows.inputs_kept,
        devices=tuple(lists["device"]),
        device_rows=tuple(int(n) for n in counts),
        edge_models=tuple(lists["edge_model"]),
        cloud_versions=tuple(lists["cloud_version"]),
        reasons={r: rows.reasons.count(r) for r in REASONS if r in rows.reasons},
        data_bytes=len(data),
        data_digest=digest(data),
    )
    store.put_object(manifest.data_key, data)
    store.put_object(manifest.manifest_key, json.dumps(manifest.to_dict(), indent=1).encode())
    return manifest


def _indices(values: Sequence[str], names: Sequence[str]) -> np.ndarray:
    position = {name: i for i, name in enumerate(names)}
    return np.fromiter((position[v] for v in values), dtype=np.uint32, count=len(values))


def _encode(rows: ExampleRows) -> tuple[bytes, dict[str, list[str]]]:
    lists = {
        "device": sorted(set(rows.devices)),
        "edge_model": sorted(set(rows.edge_models)),
        "cloud_version": sorted(set(rows.cloud_versions)),
    }
    columns: dict[str, np.ndarray] = {
        **{f"input.{k}": np.ascontiguousarray(v) for k, v in rows.inputs.items()},
        **{f"output.{k}": np.ascontiguousarray(v) for k, v in rows.outputs.items()},
        "input_sha256": rows.input_sha256,
        "cloud_label": rows.cloud_labels,
        "edge_label": rows.edge_labels,
        "edge_score": rows.edge_scores,
        "reason": np.array([REASONS.index(r) for r in rows.reasons], dtype=np.uint8),
        "device": _indices(rows.devices, lists["device"]),
        "edge_model": _indices(rows.edge_models, lists["edge_model"]),
        "cloud_version": _indices(rows.cloud_versions, lists["cloud_version"]),
        "time": rows.times,
    }
    for name, dtype in _FIXED.items():
        columns[name] = np.ascontiguousarray(columns[name], dtype=dtype)
    for name, array in columns.items():
        if array.dtype.hasobject:
            raise ExampleShardError(f"column {name} holds Python objects; only plain arrays go")
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **columns)  # type: ignore[arg-type]
    return buffer.getvalue(), lists


# --------------------------------------------------------------------------- reading


def list_shards(store: BlobStore, model: str | None = None) -> list[ShardManifest]:
    """The manifests of every committed shard (of ``model``, or of every model), oldest first."""
    prefix = shard_prefix(model) if model is not None else f"{EXAMPLES_AREA}/"
    manifests = [
        read_manifest(store, item.key, item.size)
        for item in store.list_objects(prefix)
        if item.key.endswith(".json")
    ]
    return sorted(manifests, key=lambda m: (m.created_at, m.key))


def read_manifest(store: BlobStore, key: str, size: int | None = None) -> ShardManifest:
    """One shard's manifest, by its key (``….json``); ``size`` as listed, checked first."""
    if size is not None and size > MAX_DOCUMENT_BYTES:
        raise ExampleShardError(f"shard manifest {key} is {size} bytes; too large")
    raw = store.get_object(key)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ExampleShardError(f"shard manifest {key} is {len(raw)} bytes; too large")
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ExampleShardError(f"shard manifest {key} is not JSON: {e}") from e
    manifest = ShardManifest.from_dict(document)
    if manifest.manifest_key != key:
        raise ExampleShardError(f"shard manifest {key} names another shard")
    return manifest


def read_shard(store: BlobStore, manifest: ShardManifest) -> ExampleRows:
    """The rows of one shard, checked against its manifest before anything is decoded."""
    if manifest.data_bytes > MAX_SHARD_BYTES:
        raise ExampleShardError(f"shard {manifest.key} declares {manifest.data_bytes} bytes")
    data = store.get_object(manifest.data_key)
    if len(data) != manifest.data_bytes or digest(data) != manifest.data_digest:
        raise ExampleShardError(f"shard {manifest.key}: the data does not match its manifest")
    columns = _decode(data, manifest)
    lists = {
        "device": manifest.devices,
        "edge_model": manifest.edge_models,
        "cloud_version": manifest.cloud_versions,
    }
    named: dict[str, list[str]] = {}
    for column in _CATEGORIES:
        index, names = columns[column], lists[column]
        if len(index) and int(index.max()) >= len(names):
            raise ExampleShardError(f"shard {manifest.key}: {column} indexes past its list")
        named[column] = [names[i] for i in index.tolist()]
    if len(columns["reason"]) and int(columns["reason"].max()) >= len(REASONS):
        raise ExampleShardError(f"shard {manifest.key}: an unknown reason")
    try:
        return ExampleRows(
            inputs={k[6:]: v for k, v in columns.items() if k.startswith("input.")},
            input_sha256=columns["input_sha256"],
            outputs={k[7:]: v for k, v in columns.items() if k.startswith("output.")},
            cloud_labels=columns["cloud_label"],
            edge_labels=columns["edge_label"],
            edge_scores=columns["edge_score"],
            reasons=[REASONS[i] for i in columns["reason"].tolist()],
            devices=named["device"],
            edge_models=named["edge_model"],
            cloud_versions=named["cloud_version"],
            times=columns["time"],
        )
    except ExampleShardError as e:
        raise ExampleShardError(f"shard {manifest.key}: {e}") from e


def _decode(data: bytes, manifest: ShardManifest) -> dict[str, np.ndarray]:
    try:
        members = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError) as e:
        raise ExampleShardError(f"shard {manifest.key} is not an npz file: {e}") from e
    if sum(m.file_size for m in members) > MAX_DECODED_BYTES:
        raise ExampleShardError(f"shard {manifest.key} decodes to more than the limit")
    names = {m.filename.removesuffix(".npy") for m in members}
    missing = set(_FIXED) - names
    unknown = {n for n in names - set(_FIXED) if not n.startswith(("input.", "output."))}
    if missing or unknown or len(names) != len(members):
        raise ExampleShardError(
            f"shard {manifest.key}: columns missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            columns = {name: npz[name] for name in names}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ExampleShardError(f"shard {manifest.key}: a column does not load: {e}") from e
    for name, dtype in _FIXED.items():
        if columns[name].dtype != dtype:
            raise ExampleShardError(f"shard {manifest.key}: {name} is {columns[name].dtype}")
    if any(v.ndim == 0 or len(v) != manifest.rows for v in columns.values()):
        raise ExampleShardError(f"shard {manifest.key}: columns of other than {manifest.rows} rows")
    return columns


def load_examples(
    store: BlobStore,
    *,
    model: str | None = None,
    edge_model: str | None = None,
    shards: Iterable[ShardManifest] | None = None,
) -> ExampleRows:
    """Every committed shard's rows, joined: of ``model`` (None: every model), and only rows
    answered by the edge model named ``edge_model`` (any version) when given.

    ``ExampleShardError`` when no row is left.
    """
    chosen = list(shards) if shards is not None else list_shards(store, model)
    parts = []
    for manifest in chosen:
        if edge_model is not None and not any(
            m.split("@", 1)[0] == edge_model for m in manifest.edge_models
        ):
            continue
        rows = read_shard(store, manifest)
        if edge_model is not None:
            rows = rows.take(np.array([m.split("@", 1)[0] == edge_model for m in rows.edge_models]))
        if len(rows):
            parts.append(rows)
    if not parts:
        where = f" of {model}" if model else ""
        whose = f" answered by {edge_model}" if edge_model else ""
        raise ExampleShardError(f"no collected examples{where}{whose} in {store!r}")
    return ExampleRows.concat(parts)
