"""Sample files for calibration and validation: numeric arrays only, never unpickled."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from model_cdn import PublishError
from model_cdn.publish import load_samples


def test_load_samples_reads_npy_and_npz(tmp_path: Path) -> None:
    inputs = np.arange(24, dtype=np.float32).reshape(6, 4)
    labels = np.arange(6)
    np.save(tmp_path / "x.npy", inputs)
    np.savez(tmp_path / "xy.npz", inputs=inputs, labels=labels)
    got, none = load_samples(tmp_path / "x.npy")
    np.testing.assert_array_equal(got, inputs)
    assert none is None
    got, got_labels = load_samples(tmp_path / "xy.npz")
    np.testing.assert_array_equal(got, inputs)
    np.testing.assert_array_equal(got_labels, labels)


def test_load_samples_never_unpickles(tmp_path: Path) -> None:
    """A pickled object array in a sample file could run code: it is refused, not loaded."""
    path = tmp_path / "evil.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(PublishError, match="not a numeric"):
        load_samples(path)
    buffer = io.BytesIO()
    np.savez(buffer, inputs=np.array([object()], dtype=object))
    (tmp_path / "evil.npz").write_bytes(buffer.getvalue())
    with pytest.raises(PublishError, match="object arrays"):
        load_samples(tmp_path / "evil.npz")


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"images": np.zeros((2, 2))}, "no 'inputs'"),
        ({"inputs": np.zeros((3, 2)), "labels": np.zeros(2)}, "2 labels for 3"),
        ({"inputs": np.zeros((0, 2))}, "with samples"),
    ],
)
def test_load_samples_refuses_malformed_files(
    arrays: dict[str, np.ndarray], message: str, tmp_path: Path
) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)  # type: ignore[arg-type]
    with pytest.raises(PublishError, match=message):
        load_samples(tmp_path / "bad.npz")
    with pytest.raises(PublishError, match="no sample file"):
        load_samples(tmp_path / "absent.npy")
