"""Float ONNX models as one self-contained file, whatever way they were saved.

Why: ONNX keeps tensors over a size threshold in *external data* files
beside the model when asked to, and torch 2.13's exporter asks by default
(``model.onnx`` plus ``model.onnx.data``, even for a 4 KB model). A device
or a hub gets one blob, so the pipeline reads the weights from beside the
file and inlines them before it quantizes, validates or publishes anything:
every quantization method then sees the real weights, and the blob is
complete. Bytes given without their file cannot say where their weights
are; they are refused rather than resolved against the current directory
(which is what ONNX Runtime would do).

Where the external files may be is ONNX's rule, checked by its loader:
relative paths inside the model's directory, regular files, lengths
within the file. Errors name the user's file, never a temporary copy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._errors import PublishError

__all__ = ["MAX_INLINE_BYTES", "external_locations", "read_onnx_file", "require_self_contained"]

# protobuf cannot serialize a message of 2 GiB or more; past it ONNX needs external data.
MAX_INLINE_BYTES = 2**31 - 1


def read_onnx_file(path: Path | str) -> bytes:
    """The model at ``path`` as one file: its external weights (if any) inlined."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PublishError(f"cannot read the model {path}: {e.strerror or e}") from e
    model = _parse(raw, str(path))
    locations = external_locations(model)
    if not locations:
        return raw
    base = path.parent
    missing = [name for name in locations if not (base / name).is_file()]
    if missing:
        raise PublishError(
            f"{path} keeps its weights in {', '.join(missing)}, not found beside it in "
            f"{base.resolve()}: copy the model file and its data file(s) together"
        )
    return _inlined(model, base, path)


def require_self_contained(raw: bytes, what: str) -> None:
    """Refuse a model (given as bytes) whose weights are in files it names."""
    locations = external_locations(_parse(raw, what))
    if locations:
        raise PublishError(
            f"{what} keeps its weights in external files ({', '.join(locations)}); "
            "publish it from its file path so they are read from beside it"
        )


def external_locations(model: Any) -> list[str]:
    """The external data files ``model`` (an ``onnx.ModelProto``) names, in first-use order."""
    import onnx

    found: dict[str, None] = {}
    for tensor in _tensors(model.graph, list(model.functions)):
        if tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            found[entries.get("location", "?")] = None
    return list(found)


def _tensors(graph: Any, functions: list[Any]) -> Iterator[Any]:
    """Every tensor of the graph: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    nodes = [*graph.node, *(n for f in functions for n in f.node)]
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g, [])
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph, [])


def _parse(raw: bytes, what: str) -> Any:
    import onnx

    try:
        return onnx.load_model_from_string(raw)
    except Exception as e:  # protobuf's DecodeError and friends
        raise PublishError(f"{what} is not an ONNX model: {e}") from e


def _inlined(model: Any, base: Path, path: Path) -> bytes:
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(model, os.fspath(base))
    except Exception as e:  # onnx's ValidationError (path rules), ValueError (lengths), OSError
        raise PublishError(f"{path}: its external weights cannot be loaded: {e}") from e
    if model.ByteSize() > MAX_INLINE_BYTES:
        raise PublishError(
            f"{path} with its weights is over 2 GiB, more than one ONNX file holds: "
            "too large to publish to devices"
        )
    return bytes(model.SerializeToString())
