"""Every exception ``shared`` defines, and the error codes that travel on the wire.

Exception tree::

    TandemError                      base of every error Tandem raises on purpose
    ├── ProtocolError (ValueError)   bytes or fields that do not form a valid message
    │   ├── FrameError               truncated, garbage or inconsistent frame
    │   ├── UnsupportedVersionError  a major version this build does not speak
    │   ├── LimitExceededError       a declared or actual size above a configured limit
    │   ├── TensorError              a tensor that cannot be encoded or decoded
    │   │                            (unknown datatype, shape/size mismatch)
    │   ├── ManifestError            a model manifest or signed document that is invalid
    │   │   ├── SignatureError       unsigned, signed by an untrusted key, or tampered
    │   │   ├── ExpiredError         past its expiry (a freeze attack, or just stale)
    │   │   └── PackageError         a model package's archive that is not exactly the
    │   │                            files its manifest lists: a link, a path that
    │   │                            escapes, an unlisted, missing or resized member
    │   └── UnsupportedMediaTypeError  an HTTP body's Content-Type or Content-Encoding
    │                                a route does not take (415)
    ├── ConfigError (ValueError)     a setting that cannot work (bad URL, bad option)
    ├── StoreError                   a blob or object store failed (disk, S3) [CDN: 503]
    │   ├── BlobNotFoundError        no blob with that digest, no object under that key
    │   └── InvalidStoreKeyError (ValueError)
    │                                a digest or key the store refuses: path traversal,
    │                                a malformed digest, a reserved name [CDN: 400]
    ├── ExampleShardError (ValueError)
    │                                a shard of collected examples that is malformed,
    │                                damaged, too large or of an unknown format
    ├── TensorInputError (ValueError)
    │   │                            tensors a model cannot take: names, datatype,
    │   │                            shape, rows, emptiness (``InputChecker``)
    │   ├── InputTooLargeError       more rows than a batch holds, more bytes than allowed
    │   └── NonFiniteInputError      NaN or infinity in a floating-point tensor
    └── ApiKeyError                  an HTTP request's API key refused
        ├── InvalidApiKeyError       malformed, unknown, wrong secret or revoked  -> 401
        ├── ScopeError               the key lacks every scope the route accepts  -> 403
        └── RateLimitedError         the key's token bucket is empty              -> 429
                                     (``retry_after_s``)

Every package's own tree hangs under ``TandemError``; this module holds every
exception class ``shared`` defines (``_apikeys`` raises its errors from here).

``ErrorCode`` is what a hub puts in a reply header so that a device can react
without parsing prose: ``OVERLOADED`` and ``DEADLINE_EXCEEDED`` mean "fall back
now", the others say what was wrong with the request.
"""

from __future__ import annotations

import enum
import math

__all__ = [
    "ApiKeyError",
    "BlobNotFoundError",
    "ConfigError",
    "ErrorCode",
    "ExampleShardError",
    "ExpiredError",
    "FrameError",
    "InputTooLargeError",
    "InvalidApiKeyError",
    "InvalidStoreKeyError",
    "LimitExceededError",
    "ManifestError",
    "NonFiniteInputError",
    "PackageError",
    "ProtocolError",
    "RateLimitedError",
    "ScopeError",
    "SignatureError",
    "StoreError",
    "TandemError",
    "TensorError",
    "TensorInputError",
    "UnsupportedMediaTypeError",
    "UnsupportedVersionError",
]


class TandemError(Exception):
    """Base of every error Tandem raises on purpose."""


class ProtocolError(TandemError, ValueError):
    """Bytes or header fields that do not form a valid Tandem message."""


class FrameError(ProtocolError):
    """A truncated, garbage or internally inconsistent frame."""


class UnsupportedVersionError(ProtocolError):
    """The frame's major format version is not one this build speaks."""


class LimitExceededError(ProtocolError):
    """A size (declared or actual) is above a configured limit."""


class TensorError(ProtocolError):
    """A tensor that cannot be encoded or decoded as described."""


class ManifestError(ProtocolError):
    """A model manifest or another signed document that is not valid."""


class SignatureError(ManifestError):
    """Unsigned, signed by a key that is not trusted, or altered after signing."""


class ExpiredError(ManifestError):
    """A signed document past its expiry time."""


class PackageError(ManifestError):
    """A model package whose archive or folder is not exactly the files its manifest lists
    (``shared._package``): nothing of it is written."""


class UnsupportedMediaTypeError(ProtocolError):
    """An HTTP request body whose ``Content-Type`` or ``Content-Encoding`` the route
    does not take (answered 415)."""


class ConfigError(TandemError, ValueError):
    """A setting that cannot work, such as a malformed broker URL."""


class StoreError(TandemError):
    """A blob or object store failed: disk, S3, network (the CDN answers 503)."""


class BlobNotFoundError(StoreError):
    """No blob with that digest, or no object under that key (the CDN answers 404)."""


class InvalidStoreKeyError(StoreError, ValueError):
    """A digest or object key the store refuses before touching storage (the CDN answers 400)."""


class ExampleShardError(TandemError, ValueError):
    """A shard of collected examples that is malformed, damaged, too large or of a newer format."""


class TensorInputError(TandemError, ValueError):
    """Tensors a model cannot take; each package raises its own type ``from`` this one."""


class InputTooLargeError(TensorInputError):
    """More rows than the model's batch holds, or more bytes than the runtime takes."""


class NonFiniteInputError(TensorInputError):
    """NaN or infinity in input ``name``: ``count`` values, ``nan`` of them NaN, of ``size``."""

    def __init__(self, name: str, count: int, nan: int, size: int) -> None:
        self.name, self.count, self.nan, self.size = name, count, nan, size
        super().__init__(
            f"input {name!r} holds {count} non-finite value{'s' if count != 1 else ''} "
            f"({nan} NaN, {count - nan} infinite) of {size}"
        )


class ApiKeyError(TandemError):
    """Base of the API key errors."""


class InvalidApiKeyError(ApiKeyError):
    """A malformed, unknown or revoked key, or a wrong secret (HTTP 401)."""


class ScopeError(ApiKeyError):
    """The key has none of the scopes the route accepts (HTTP 403)."""


class RateLimitedError(ApiKeyError):
    """The key's token bucket is empty (HTTP 429); ``retry_after_s`` until one is back."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds, at least 1 (clients must not retry at once)."""
        return str(max(1, math.ceil(self.retry_after_s)))


class ErrorCode(enum.StrEnum):
    """Error codes carried in a reply header (``""``-free: ``OK`` means success)."""

    OK = "ok"
    BAD_REQUEST = "bad_request"  # malformed frame or header
    INVALID_INPUT = "invalid_input"  # wrong tensor names, dtype or shape for the model
    UNKNOWN_MODEL = "unknown_model"
    TOO_LARGE = "too_large"  # above a hub limit
    OVERLOADED = "overloaded"  # queue full: the device should fall back at once
    DEADLINE_EXCEEDED = "deadline_exceeded"  # expired before compute
    INTERNAL = "internal"  # the model raised; the hub keeps serving

    @classmethod
    def parse(cls, value: object) -> ErrorCode:
        """Map a wire value to a code; an unknown code from a newer peer is ``INTERNAL``."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.INTERNAL
