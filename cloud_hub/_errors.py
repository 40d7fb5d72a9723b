"""Exceptions of the cloud hub, each tied to the wire ``ErrorCode`` a device gets.

Exception tree::

    shared.TandemError
    └── HubError                              base of the hub's errors      -> INTERNAL
        ├── BadRequestError (ValueError)      a frame the hub cannot serve  -> BAD_REQUEST
        │                                     (header fields disagree, not a request)
        ├── InvalidRequestError (ValueError)  tensor names, dtype or shape  -> INVALID_INPUT
        │   │                                 the model cannot take
        │   └── RequestTooLargeError          more rows than max_batch_size -> TOO_LARGE
        ├── ModelNotFoundError (LookupError)  no such model or version      -> UNKNOWN_MODEL
        ├── OverloadedError                   the model's queue is full     -> OVERLOADED
        │   ├── HubStoppingError              the hub is shutting down      -> OVERLOADED
        │   └── IpcClosedError               the executor (or ingress)     -> OVERLOADED
        │                                     process at the other end went away
        ├── DeadlineExceededError             expired before compute        -> DEADLINE_EXCEEDED
        ├── ExecutorError                     the model raised or returned  -> INTERNAL
        │                                     a malformed result
        ├── ExecutorReplyError                an executor process answered  -> its code
        │                                     with an error
        ├── RepositoryError                   a model could not be loaded   -> INTERNAL
        │   └── ModelConfigError (ValueError) a config.json that cannot work
        └── BrokerError                       the MQTT broker cannot be reached
                                              or refused the hub

Each class carries its ``code``; ``error_code`` maps any exception, the wire
protocol's own ``ProtocolError`` family included, to the code a reply should
carry. Foreign exceptions (onnxruntime, torch, paho) are converted at the
boundary with ``raise … from e`` so that callers catch ``HubError`` only.

``OVERLOADED`` and ``DEADLINE_EXCEEDED`` tell a device to fall back to its
local answer at once, which is why a stopping hub answers ``OVERLOADED``.
"""

from __future__ import annotations

from typing import ClassVar

from shared import (
    ErrorCode,
    FrameError,
    LimitExceededError,
    ProtocolError,
    TandemError,
    TensorError,
    UnsupportedVersionError,
)

__all__ = [
    "BadRequestError",
    "BrokerError",
    "DeadlineExceededError",
    "ExecutorError",
    "ExecutorReplyError",
    "HubError",
    "HubStoppingError",
    "InvalidRequestError",
    "IpcClosedError",
    "ModelConfigError",
    "ModelNotFoundError",
    "OverloadedError",
    "RepositoryError",
    "RequestTooLargeError",
    "error_code",
]


class HubError(TandemError):
    """Base of the cloud hub's errors; ``code`` is what a reply carries."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL


class BadRequestError(HubError, ValueError):
    """A well-formed frame the hub still cannot serve (e.g. not a request)."""

    code = ErrorCode.BAD_REQUEST


class InvalidRequestError(HubError, ValueError):
    """Tensor names, datatypes or shapes that the model cannot take."""

    code = ErrorCode.INVALID_INPUT


class RequestTooLargeError(InvalidRequestError):
    """A request with more rows than the model's ``max_batch_size``."""

    code = ErrorCode.TOO_LARGE


class ModelNotFoundError(HubError, LookupError):
    """No model of that name, or not that version, is served here."""

    code = ErrorCode.UNKNOWN_MODEL


class OverloadedError(HubError):
    """The model's queue is full: answered at once so the device falls back."""

    code = ErrorCode.OVERLOADED


class HubStoppingError(OverloadedError):
    """The hub is shutting down and will not compute this request."""


class IpcClosedError(OverloadedError):
    """The process at the other end of an ingress-executor connection went away (stopped, crashed).

    A request in flight on it is answered ``overloaded``: the device falls back
    at once, and the hub connects again when the process is back.
    """


class DeadlineExceededError(HubError):
    """The request's deadline passed before it could be computed."""

    code = ErrorCode.DEADLINE_EXCEEDED


class ExecutorError(HubError):
    """The model raised, or returned something other than one row per input row."""

    code = ErrorCode.INTERNAL


class ExecutorReplyError(HubError):
    """An executor process answered a request with an error; ``code`` is the one it sent."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code  # type: ignore[misc]  # an instance's own code, not the class's


class RepositoryError(HubError):
    """A model in the repository could not be found or loaded."""


class ModelConfigError(RepositoryError, ValueError):
    """A model's ``config.json`` (or programmatic config) that cannot work."""


class BrokerError(HubError):
    """The MQTT broker could not be reached, or refused the hub's session."""


def error_code(exc: BaseException) -> ErrorCode:
    """The wire code for ``exc``: its own for hub errors, by kind for protocol errors."""
    if isinstance(exc, HubError):
        return exc.code
    if isinstance(exc, LimitExceededError):
        return ErrorCode.TOO_LARGE
    if isinstance(exc, FrameError | UnsupportedVersionError | TensorError | ProtocolError):
        return ErrorCode.BAD_REQUEST
    return ErrorCode.INTERNAL
