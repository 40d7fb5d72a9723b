"""Exceptions of the edge agent.

Exception tree::

    shared.TandemError
    └── EdgeError                        base of the SDK's errors
        ├── InvalidInputError (ValueError)   wrong tensor names, dtype, shape or size, an
        │                                    empty batch, NaN/inf values; or (no local
        │                                    model) an input the hub refused
        ├── ModelLoadError                   model file missing, corrupt, or no runtime for it
        │   ├── RuntimeUnavailableError      the runtime package is not installed
        │   └── RouterLoadError (ValueError) a learned router's document that is not one:
        │                                    unreadable, unknown format, sizes that do not
        │                                    match, weights that are not finite numbers
        ├── InferenceError                   the local runtime failed on valid input
        ├── UplinkError                      the MQTT path to the hub failed (caught
        │                                    inside the agent, which falls back)
        ├── NoAnswerError                    neither the device nor the cloud could answer
        │                                    (the model is not on the device and the
        │                                    cloud failed): the only error ``infer`` raises
        │                                    for a valid request
        ├── TextOffloadUnavailableError      a text preset that needs the hub
        │                                    (``prefer_cloud``, ``cloud_only``) on an
        │                                    agent without broker= and cloud_language_model=
        └── UpdateError                      a model update was not installed (the old
            │                                model keeps serving)
            ├── UntrustedUpdateError         an assignment or manifest refused: unsigned,
            │   │                            unknown key, tampered, expired, for another
            │   │                            device, name or version not as assigned
            │   └── DowngradeError           a lower version without a signed rollback, or
            │                                an older assignment replayed
            ├── DownloadError                HTTP failure, timeout, more or fewer bytes than
            │                                declared, byte budget spent
            ├── IntegrityError               bytes whose digest or decompressed size is not
            │                                what the signed manifest says
            ├── SmokeTestError               the new model does not load, or its smoke-test
            │                                outputs are off
            └── StoreError                   the on-device model store cannot be used, or a
                                             name or digest would escape it

Every exception class ``edge_agent`` defines is in this module and exported
from ``edge_agent`` (a test walks the package and checks the drawing above).
Foreign errors (onnxruntime, tflite, paho) are converted at the boundary with
``raise … from e``.
"""

from __future__ import annotations

from shared import ErrorCode, TandemError

__all__ = [
    "DowngradeError",
    "DownloadError",
    "EdgeError",
    "InferenceError",
    "IntegrityError",
    "InvalidInputError",
    "ModelLoadError",
    "NoAnswerError",
    "RouterLoadError",
    "RuntimeUnavailableError",
    "SmokeTestError",
    "StoreError",
    "TextOffloadUnavailableError",
    "UntrustedUpdateError",
    "UpdateError",
    "UplinkError",
]


class EdgeError(TandemError):
    """Base of the edge SDK's errors."""


class InvalidInputError(EdgeError, ValueError):
    """Tensor names, dtype, shape, size or values (empty, NaN, inf) the model cannot take."""


class ModelLoadError(EdgeError):
    """The model could not be loaded."""


class RuntimeUnavailableError(ModelLoadError):
    """The runtime package needed for this model is not installed."""


class RouterLoadError(ModelLoadError, ValueError):
    """A learned router document (JSON) that cannot be loaded; a ``ValueError`` too."""


class InferenceError(EdgeError):
    """The local runtime failed on input that passed validation."""


class UplinkError(EdgeError):
    """The MQTT path to the hub failed; ``code`` says how when the hub answered."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self.code = code


class NoAnswerError(EdgeError):
    """Neither the device nor the cloud could answer this request."""


class TextOffloadUnavailableError(EdgeError):
    """A text generation preset that needs the hub, on an agent with no way to it for text."""


class UpdateError(EdgeError):
    """A model update that was not installed; the device keeps serving its old model."""


class UntrustedUpdateError(UpdateError):
    """An assignment or manifest that the pinned publisher keys and checks refuse."""


class DowngradeError(UntrustedUpdateError):
    """A lower version than the highest accepted without a signed rollback, or a replay."""


class DownloadError(UpdateError):
    """The CDN could not deliver the bytes: HTTP error, timeout, wrong length, budget spent."""


class IntegrityError(UpdateError):
    """Downloaded bytes whose digest or decompressed size differs from the signed manifest."""


class SmokeTestError(UpdateError):
    """The new model does not load, or its answers to the manifest's samples are off."""


class StoreError(UpdateError):
    """The on-device model store cannot be read or written, or a name would escape it."""
