"""Sample files for the publish CLI: calibration and validation inputs from disk.

``.npy`` holds inputs only; ``.npz`` holds ``inputs`` and optionally
``labels``. Always ``np.load(allow_pickle=False)``: a sample file may come
from anyone, and a pickle in it would run code on the publisher's machine.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .._errors import PublishError

__all__ = ["load_samples"]


def load_samples(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """(inputs, labels or None) from a ``.npy`` or ``.npz`` file."""
    path = Path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError as e:
        raise PublishError(f"no sample file {path}") from e
    except (OSError, ValueError, zipfile.BadZipFile) as e:  # pickled objects land here too
        raise PublishError(f"{path} is not a numeric .npy/.npz sample file: {e}") from e
    if isinstance(loaded, np.ndarray):
        inputs, labels = loaded, None
    else:
        with loaded:
            if "inputs" not in loaded.files:
                raise PublishError(f"{path} has no 'inputs' array (it has {loaded.files})")
            try:
                inputs = loaded["inputs"]
                labels = loaded["labels"] if "labels" in loaded.files else None
            except ValueError as e:
                raise PublishError(f"{path} holds object arrays, which are refused: {e}") from e
    if inputs.ndim == 0 or len(inputs) == 0:
        raise PublishError(f"{path}: inputs need a batch dimension with samples")
    if inputs.dtype.kind not in "biuf":
        raise PublishError(f"{path}: inputs must be numeric, got {inputs.dtype}")
    if labels is not None and (labels.ndim == 0 or len(labels) != len(inputs)):
        raise PublishError(f"{path}: {labels.size} labels for {len(inputs)} inputs")
    return inputs, labels
