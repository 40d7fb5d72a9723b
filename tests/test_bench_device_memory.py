"""bench/_device_memory.py's pure helpers (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

from bench._device_memory import model_files, rss_kib_to_bytes


def test_rss_units() -> None:
    assert rss_kib_to_bytes(10, "linux") == 10240
    assert rss_kib_to_bytes(10, "darwin") == 10


def test_model_files_lists_regular_files_sorted(tmp_path: Path) -> None:
    (tmp_path / "b.onnx").write_bytes(b"12345")
    (tmp_path / "a.json").write_bytes(b"{}")
    (tmp_path / "sub").mkdir()
    assert model_files(tmp_path) == [("a.json", 2), ("b.onnx", 5)]
