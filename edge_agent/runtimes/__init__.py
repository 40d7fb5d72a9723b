"""Model runtimes behind one interface (see ``_base``)."""

from ._base import ModelRuntime, TensorSpec

__all__ = ["ModelRuntime", "TensorSpec"]
