"""Exceptions of the edge agent.

Exception tree::

    shared.TandemError
    └── EdgeError                        base of the SDK's errors
        ├── InvalidInputError (ValueError)   wrong tensor names, dtype, shape or size
        ├── ModelLoadError                   model file missing, corrupt, or no runtime for it
        │   └── RuntimeUnavailableError      the runtime package is not installed
        ├── InferenceError                   the local runtime failed on valid input
        ├── UplinkError                      the MQTT path to the hub failed (caught
        │                                    inside the agent, which falls back)
        └── NoAnswerError                    neither the device nor the cloud could answer
                                             (the model is not on the device and the
                                             cloud failed): the only error ``infer`` raises
                                             for a valid request

Foreign errors (onnxruntime, tflite, paho) are converted at the boundary with
``raise … from e``.
"""

from __future__ import annotations

from shared import ErrorCode, TandemError

__all__ = [
    "EdgeError",
    "InferenceError",
    "InvalidInputError",
    "ModelLoadError",
    "NoAnswerError",
    "RuntimeUnavailableError",
    "UplinkError",
]


class EdgeError(TandemError):
    """Base of the edge SDK's errors."""


class InvalidInputError(EdgeError, ValueError):
    """Tensor names, dtype, shape or size that the model cannot take."""


class ModelLoadError(EdgeError):
    """The model could not be loaded."""


class RuntimeUnavailableError(ModelLoadError):
    """The runtime package needed for this model is not installed."""


class InferenceError(EdgeError):
    """The local runtime failed on input that passed validation."""


class UplinkError(EdgeError):
    """The MQTT path to the hub failed; ``code`` says how when the hub answered."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self.code = code


class NoAnswerError(EdgeError):
    """Neither the device nor the cloud could answer this request."""
