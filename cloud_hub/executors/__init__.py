"""Executors: the runtimes that compute a batch (ONNX Runtime, PyTorch, a Python callable).

``TorchExecutor`` is importable here without importing torch: its module
imports torch only when a torch model is built or loaded.
"""

from ._base import CallableExecutor, Executor
from ._onnx import OnnxExecutor, onnx_providers
from ._torch import TorchExecutor

__all__ = ["CallableExecutor", "Executor", "OnnxExecutor", "TorchExecutor", "onnx_providers"]
