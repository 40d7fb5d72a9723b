"""One description of a model's input or output, used by every package.

``TensorSpec(name, datatype, shape)``: an Open Inference Protocol datatype and
a shape whose free dimensions are ``None``. That is the one convention inside
Tandem. Two outside conventions are translated at the boundary, and nowhere else:

- Triton's ``config.json`` writes a free dimension as ``-1``
  (``TensorSpec.from_dims``, ``.dims``); the hub's configs keep that format on disk;
- JSON documents (manifests) write it as ``null`` (``to_dict`` / ``from_dict``).

Where a spec describes a model served with a batch dimension (the hub's
``ModelConfig``), its shape is the per-row shape, without the batch dimension;
a runtime's and a manifest's specs carry the whole shape.

The constructor validates: a name of 1-256 characters, a known datatype, at
most ``MAX_RANK`` dimensions, each a non-negative int or ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import TensorError
from ._tensors import DATATYPES

__all__ = ["MAX_RANK", "TensorSpec"]

MAX_RANK = 8
_MAX_NAME = 256


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: an Open Inference Protocol datatype, ``None`` for a free dim."""

    name: str
    datatype: str
    shape: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= _MAX_NAME:
            raise TensorError(
                f"tensor name must be 1-{_MAX_NAME} characters, got {self.name!r:.60}"
            )
        if self.datatype not in DATATYPES:
            raise TensorError(
                f"tensor {self.name!r}: unknown datatype {self.datatype!r:.40}; "
                f"expected one of {', '.join(DATATYPES)}"
            )
        if isinstance(self.shape, str | bytes) or not isinstance(self.shape, Sequence):
            raise TensorError(f"tensor {self.name!r}: shape must be a sequence of dims")
        shape = tuple(self.shape)
        if len(shape) > MAX_RANK or not all(
            d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in shape
        ):
            raise TensorError(
                f"tensor {self.name!r}: shape must be up to {MAX_RANK} non-negative ints "
                f"or None (free), got {list(shape)!r:.80}"
            )
        object.__setattr__(self, "shape", shape)

    # -- the outside conventions ----------------------------------------------------------

    @classmethod
    def from_dims(cls, name: str, datatype: str, dims: Sequence[int | None]) -> TensorSpec:
        """From Triton's convention, where -1 (or None) is a free dimension."""
        if isinstance(dims, str | bytes) or not isinstance(dims, Sequence):
            raise TensorError(f"tensor {name!r}: dims must be a list of ints (-1 for any size)")
        if any(isinstance(d, int) and not isinstance(d, bool) and d < -1 for d in dims):
            raise TensorError(f"tensor {name!r}: dims must be ints >= 0, or -1 (any size)")
        return cls(name, datatype, tuple(None if d == -1 else d for d in dims))

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape in Triton's convention: -1 for a free dimension."""
        return tuple(-1 if d is None else d for d in self.shape)

    @classmethod
    def from_dict(cls, data: object) -> TensorSpec:
        """From ``{"name", "datatype", "shape"}`` with ``null`` for a free dimension."""
        if not isinstance(data, Mapping):
            raise TensorError("a tensor spec must be an object with name, datatype and shape")
        shape = data.get("shape")
        if not isinstance(shape, list):
            raise TensorError(
                f"tensor {data.get('name')!r:.60}: shape must be a list of ints or null"
            )
        return cls(data.get("name"), data.get("datatype"), tuple(shape))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    # -- checks ---------------------------------------------------------------------------

    def accepts(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of ``shape`` fits: same rank, equal where a dim is fixed."""
        return len(shape) == len(self.shape) and all(
            d is None or d == s for s, d in zip(shape, self.shape, strict=True)
        )

    def describe(self, *, batched: bool = False) -> str:
        """``name: FP32[?, 28, 28]``; ``batched`` puts a free batch dimension first."""
        dims = ["?"] if batched else []
        dims += ["?" if d is None else str(d) for d in self.shape]
        return f"{self.name}: {self.datatype}[{', '.join(dims)}]"
