"""What the device's own model answered, carried in an offloaded request's header.

A device that shares its answers (opt-in: ``edge_agent``'s ``ExampleSharing``)
puts an ``EdgeAnswer`` under the header key ``"edge"`` of each request it
offloads; the hub, which already holds the input and is about to compute the
cloud's answer, reads it back to decide whether to keep the request as a
training example (the two disagree, or the request was drawn into the
sample) without a second message. Written by the device, read by the hub:
this module is the one home of the fields::

    "edge": {"model": "mnist-edge@3",    # the edge model, name@version
             "labels": [7],              # top class of each row of its first output;
                                         # absent when the local model did not run
             "score": 0.41,              # the policy's uncertainty score (higher: less sure)
             "sampled": false}           # the device drew this request into its random sample

``top_classes`` is how both ends turn an output into labels: the argmax
over the last axis, one label per row (the edge agent's agreement counts
the same way). ``from_header`` validates what a peer sent (``FrameError``)
and keeps fields a newer device adds in ``extra``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import FrameError

__all__ = ["EDGE_ANSWER_KEY", "MAX_EDGE_LABELS", "EdgeAnswer", "top_classes"]

EDGE_ANSWER_KEY = "edge"
MAX_EDGE_LABELS = 4096  # rows whose labels one header carries; more: no labels are sent
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}@[A-Za-z0-9._-]{1,64}")
_KEYS = ("model", "labels", "score", "sampled")
_MAX_LABEL = 2**31 - 1


def top_classes(output: np.ndarray) -> np.ndarray:
    """The top class of each row: argmax over the last axis, flattened (int64)."""
    array = np.asarray(output)
    if array.ndim == 0 or array.shape[-1] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.argmax(array, axis=-1).reshape(-1).astype(np.int64, copy=False)


@dataclass(frozen=True, kw_only=True)
class EdgeAnswer:
    """The device's answer to an offloaded request; see the module docstring."""

    model: str | None = None
    labels: tuple[int, ...] | None = None
    score: float | None = None
    sampled: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model is not None and (
            not isinstance(self.model, str) or not _MODEL.fullmatch(self.model)
        ):
            raise FrameError(f"edge.model must be name@version, got {self.model!r:.80}")
        labels = self.labels
        if labels is not None:
            if isinstance(labels, str | bytes) or not hasattr(labels, "__len__"):
                raise FrameError("edge.labels must be a list of class indices")
            if len(labels) > MAX_EDGE_LABELS or not all(
                type(x) is int and 0 <= x <= _MAX_LABEL for x in labels
            ):
                raise FrameError(
                    f"edge.labels must be at most {MAX_EDGE_LABELS} class indices >= 0"
                )
            object.__setattr__(self, "labels", tuple(labels))
        score = self.score
        if score is not None and (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            raise FrameError(f"edge.score must be a finite number, got {score!r:.40}")
        if not isinstance(self.sampled, bool):
            raise FrameError("edge.sampled must be true or false")
        if not isinstance(self.extra, Mapping):
            raise FrameError("edge extra fields must be an object")

    @classmethod
    def of(
        cls,
        model: str | None,
        first_output: np.ndarray | None,
        score: float | None,
        *,
        sampled: bool = False,
    ) -> EdgeAnswer:
        """The device's side: its model's label, its first output and score."""
        labels = None
        if first_output is not None:
            top = top_classes(first_output)
            if len(top) <= MAX_EDGE_LABELS:
                labels = tuple(int(x) for x in top)
        return cls(model=model, labels=labels, score=score, sampled=sampled)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.extra.items() if k not in _KEYS}
        if self.model is not None:
            out["model"] = self.model
        if self.labels is not None:
            out["labels"] = list(self.labels)
        if self.score is not None:
            out["score"] = round(float(self.score), 6)
        out["sampled"] = self.sampled
        return out

    @classmethod
    def from_dict(cls, data: object) -> EdgeAnswer:
        if not isinstance(data, Mapping):
            raise FrameError("the edge answer must be an object")
        labels = data.get("labels")
        if labels is not None and not isinstance(labels, list):
            raise FrameError("edge.labels must be a list of class indices")
        return cls(
            model=data.get("model"),
            labels=None if labels is None else tuple(labels),
            score=data.get("score"),
            sampled=data.get("sampled", False),
            extra={k: v for k, v in data.items() if k not in _KEYS},
        )

    @classmethod
    def from_header(cls, extra: Mapping[str, Any]) -> EdgeAnswer | None:
        """The answer a request's header fields carry (``Message.extra``), if any."""
        data = extra.get(EDGE_ANSWER_KEY)
        return None if data is None else cls.from_dict(data)

    def header(self) -> dict[str, Any]:
        """The header fields to merge into a request's ``Message.extra``."""
        return {EDGE_ANSWER_KEY: self.to_dict()}
