"""Model runtimes behind one interface (see ``_base``).

Importing this package imports neither onnxruntime nor a TFLite runtime:
each is imported when its first model loads, so the SDK starts fast and a
device that has only one of them installed still imports cleanly.
``TensorSpec`` is ``shared.TensorSpec``, the one tensor description of every
package (``None`` for a free dimension).
"""

from shared import TensorSpec

from ._base import ModelRuntime
from ._loader import load_runtime
from ._onnx import OnnxRuntime
from ._tflite import TFLiteRuntime

__all__ = ["ModelRuntime", "OnnxRuntime", "TFLiteRuntime", "TensorSpec", "load_runtime"]
