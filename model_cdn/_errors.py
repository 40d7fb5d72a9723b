"""Exceptions of the model CDN.

Exception tree::

    shared.TandemError
    └── CdnError                         base of the CDN's errors
        ├── PublishError                 the publish pipeline refused or failed
        │   ├── QuantizationError        quantizing the model failed
        │   └── ValidationError          the quantized model disagrees too much with the float one
        ├── StoreError                   blob storage failed (disk, S3)
        │   └── BlobNotFoundError        no blob with that digest
        ├── RegistryError                the registry database failed or refused
        │   ├── ModelNotFoundError       no such model or version
        │   ├── DeviceNotFoundError      no device with that id in the fleet registry
        │   ├── RolloutNotFoundError     no rollout with that id
        │   └── VersionConflictError     the version is not above the latest one
        ├── InvalidNameError (ValueError) a model name or digest that is not allowed
        │                                (path traversal, wildcards)
        └── AuthError                    missing or wrong token

Foreign errors (boto3, sqlite3, psycopg, onnxruntime) are converted at the
boundary with ``raise … from e``.
"""

from __future__ import annotations

from shared import TandemError

__all__ = [
    "AuthError",
    "BlobNotFoundError",
    "CdnError",
    "DeviceNotFoundError",
    "InvalidNameError",
    "ModelNotFoundError",
    "PublishError",
    "QuantizationError",
    "RegistryError",
    "RolloutNotFoundError",
    "StoreError",
    "ValidationError",
    "VersionConflictError",
]


class CdnError(TandemError):
    """Base of the model CDN's errors."""


class PublishError(CdnError):
    """The publish pipeline refused or failed."""


class QuantizationError(PublishError):
    """Quantizing the model failed."""


class ValidationError(PublishError):
    """The quantized model disagrees with the float one beyond the publisher's threshold."""


class StoreError(CdnError):
    """Blob storage failed."""


class BlobNotFoundError(StoreError):
    """No blob with that digest."""


class RegistryError(CdnError):
    """The registry database failed or refused."""


class ModelNotFoundError(RegistryError):
    """No such model or version."""


class DeviceNotFoundError(RegistryError):
    """No device with that id has been seen."""


class RolloutNotFoundError(RegistryError):
    """No rollout with that id."""


class VersionConflictError(RegistryError):
    """A version that is not above the latest published one."""


class InvalidNameError(CdnError, ValueError):
    """A model name or digest that is not allowed."""


class AuthError(CdnError):
    """Missing or wrong token."""
