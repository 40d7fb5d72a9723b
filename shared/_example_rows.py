"""Collected examples in memory, column by column, and how a row's input is fingerprinted.

``ExampleRows`` is what a shard holds (``_shards`` writes and reads it and
lists the columns); ``input_digests`` is the fingerprint kept for every row,
also when the inputs themselves are not (privacy mode), so that a training
job can match or deduplicate examples without seeing them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import ExampleShardError

__all__ = ["REASONS", "ExampleRows", "input_digests"]

REASONS = ("disagree", "sample")  # disagree: edge and cloud differ; sample: drawn at random


def input_digests(inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """SHA-256 of each row's inputs, uint8 [N, 32].

    Over each input in name order: its name, numpy dtype (``<f4``), row shape
    and the row's C-order bytes, so equal rows hash equal wherever they came from.
    """
    names = sorted(inputs)
    if not names:
        return np.zeros((0, 32), dtype=np.uint8)
    rows = len(inputs[names[0]])
    out = np.empty((rows, 32), dtype=np.uint8)
    parts = []
    for name in names:
        array = np.ascontiguousarray(inputs[name])
        shape = "x".join(str(d) for d in array.shape[1:])
        parts.append((f"{name}\0{array.dtype.str}\0{shape}\0".encode(), array))
    for i in range(rows):
        h = hashlib.sha256()
        for head, array in parts:
            h.update(head)
            h.update(array[i].tobytes())
        out[i] = np.frombuffer(h.digest(), dtype=np.uint8)
    return out


@dataclass(eq=False)
class ExampleRows:
    """Collected examples, column by column (the columns are listed in ``_shards``).

    The categorical columns (``reasons``, ``devices``, ``edge_models``,
    ``cloud_versions``) are lists of strings here; shards store them as
    indices into the manifest's lists.
    """

    inputs: dict[str, np.ndarray]  # {} when inputs were not kept
    input_sha256: np.ndarray  # uint8 [N, 32]
    outputs: dict[str, np.ndarray]  # the cloud's answer
    cloud_labels: np.ndarray  # int64 [N]
    edge_labels: np.ndarray  # int64 [N], -1: the device's model did not run
    edge_scores: np.ndarray  # float32 [N], NaN: no score
    reasons: list[str]
    devices: list[str]
    edge_models: list[str]  # "" when the device named none
    cloud_versions: list[str]
    times: np.ndarray  # float64 [N], Unix seconds

    def __post_init__(self) -> None:
        n = len(self.cloud_labels)
        columns: dict[str, Sized] = {
            "input_sha256": self.input_sha256,
            "edge_labels": self.edge_labels,
            "edge_scores": self.edge_scores,
            "reasons": self.reasons,
            "devices": self.devices,
            "edge_models": self.edge_models,
            "cloud_versions": self.cloud_versions,
            "times": self.times,
            **{f"input.{k}": v for k, v in self.inputs.items()},
            **{f"output.{k}": v for k, v in self.outputs.items()},
        }
        uneven = {k: len(v) for k, v in columns.items() if len(v) != n}
        if uneven:
            raise ExampleShardError(f"columns of {n} rows and of {uneven}")
        if not self.outputs:
            raise ExampleShardError("examples need the cloud's answer: no output column")
        unknown = set(self.reasons) - set(REASONS)
        if unknown:
            raise ExampleShardError(f"unknown reasons {sorted(unknown)}; known: {REASONS}")

    def __len__(self) -> int:
        return len(self.cloud_labels)

    @property
    def inputs_kept(self) -> bool:
        return bool(self.inputs)

    def take(self, index: np.ndarray | Sequence[int]) -> ExampleRows:
        """The rows at ``index`` (integers, or a boolean mask), in that order."""
        chosen = np.asarray(index)
        if chosen.dtype == np.bool_:
            picked = np.flatnonzero(chosen)
        else:
            picked = chosen.astype(np.int64, copy=False).reshape(-1)
        return ExampleRows(
            inputs={k: v[picked] for k, v in self.inputs.items()},
            input_sha256=self.input_sha256[picked],
            outputs={k: v[picked] for k, v in self.outputs.items()},
            cloud_labels=self.cloud_labels[picked],
            edge_labels=self.edge_labels[picked],
            edge_scores=self.edge_scores[picked],
            reasons=[self.reasons[i] for i in picked],
            devices=[self.devices[i] for i in picked],
            edge_models=[self.edge_models[i] for i in picked],
            cloud_versions=[self.cloud_versions[i] for i in picked],
            times=self.times[picked],
        )

    @classmethod
    def concat(cls, parts: Sequence[ExampleRows]) -> ExampleRows:
        """One set of rows from several with the same columns (``ExampleShardError`` if not)."""
        if not parts:
            raise ExampleShardError("no examples to join")
        first = parts[0]
        for part in parts[1:]:
            if _signature(part) != _signature(first):
                raise ExampleShardError(
                    f"examples with different columns cannot be joined: {_signature(first)} "
                    f"vs {_signature(part)}"
                )

        def joined(column: Any) -> np.ndarray:
            return np.concatenate([column(p) for p in parts])

        return cls(
            inputs={k: joined(lambda p, k=k: p.inputs[k]) for k in first.inputs},
            input_sha256=joined(lambda p: p.input_sha256),
            outputs={k: joined(lambda p, k=k: p.outputs[k]) for k in first.outputs},
            cloud_labels=joined(lambda p: p.cloud_labels),
            edge_labels=joined(lambda p: p.edge_labels),
            edge_scores=joined(lambda p: p.edge_scores),
            reasons=[r for p in parts for r in p.reasons],
            devices=[d for p in parts for d in p.devices],
            edge_models=[m for p in parts for m in p.edge_models],
            cloud_versions=[v for p in parts for v in p.cloud_versions],
            times=joined(lambda p: p.times),
        )


def _signature(rows: ExampleRows) -> tuple[Any, ...]:
    def spec(columns: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
        return tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(columns.items()))

    return spec(rows.inputs), spec(rows.outputs)
