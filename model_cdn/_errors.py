"""Exceptions of the model CDN.

Exception tree (the HTTP status the CDN's API answers in brackets)::

    shared.TandemError
    ├── CdnError                           base of the CDN's errors
    │   ├── PublishError                   the publish pipeline refused or failed
    │   │   ├── QuantizationError          quantizing the model failed
    │   │   ├── ValidationError            the quantized model disagrees too much with the
    │   │   │                              float one
    │   │   └── IdenticalModelError        the model is byte for byte a version already
    │   │                                  published (``version``: that one)
    │   ├── PullError                      a pulled model did not check out: another name or
    │   │                                  version than asked, a blob unlike its manifest
    │   ├── RegistryError                  the registry database failed or refused [503]
    │   │   ├── ModelNotFoundError         no such model or version [404]
    │   │   ├── DeviceNotFoundError        no device with that id in the fleet registry [404]
    │   │   ├── RolloutNotFoundError       no rollout with that id [404]
    │   │   ├── VersionConflictError       the version is not above the latest one [409]
    │   │   └── LeaseLostError             a write fenced off: this server no longer holds
    │   │                                  the rollout leader's lease [503]
    │   ├── InvalidNameError (ValueError)  a model name, device id or version that is not
    │   │                                  allowed: path traversal, wildcards [400]
    │   ├── DocumentRejectedError (ValueError)
    │   │                                  a signed manifest or assignment the CDN will not
    │   │                                  take: for another model or device than asked,
    │   │                                  expired, naming a blob the store lacks [400]
    │   ├── BrokerError                    the MQTT broker cannot be reached, refused the
    │   │   │                              connection or a message, or did not acknowledge
    │   │   └── AssignmentNotPublishedError
    │   │                                  an assignment was stored but not published [502]
    │   ├── RolloutStateError              the rollout's state does not allow the command [409]
    │   ├── RolloutConflictError           the model already has an active rollout [409]
    │   ├── RolloutRequestError (ValueError)
    │   │                                  a request that cannot start a rollout [400]
    │   ├── NoRolloutLeaderError           no rollout leader answered a command in time [503]
    │   ├── AuthError                      missing or wrong token [403]
    │   ├── HttpError                      an answer of the HTTP API that carries its own
    │   │   │                              status and headers (bad body, too large, off)
    │   │   ├── AuthDenied (AuthError)     no, malformed or wrong credentials, a key without
    │   │   │                              the scope or over its rate [401, 403, 429]
    │   │   └── RangeNotSatisfiableError   a Range that starts past the end of a blob [416]
    │   └── AdminApiError                  the admin API refused a request (``status``:
    │                                      the HTTP status) or could not be reached (None);
    │                                      raised by ``AdminClient``, the CDN's client
    └── shared.StoreError                  blob storage failed, disk or S3 (the store lives
        │                                  in ``shared.server.store``; re-exported here) [503]
        ├── shared.BlobNotFoundError       no blob with that digest [404]
        └── shared.InvalidStoreKeyError    a malformed digest or key [400]

A signed document that does not verify raises ``shared.ManifestError``
(``SignatureError``, ``ExpiredError``) as it comes from ``shared``; the API
answers it 400. Foreign errors (boto3, sqlite3, psycopg, paho, onnxruntime)
are converted at the boundary with ``raise … from e``.

``HttpError`` and its subclasses are raised by ``model_cdn.http`` (and its
pure helpers: ``CdnAuth``, ``plan_range``) and answered there with their own
status and headers; the library's operations never raise them.
"""

from __future__ import annotations

from shared import BlobNotFoundError, StoreError, TandemError

__all__ = [
    "AdminApiError",
    "AssignmentNotPublishedError",
    "AuthDenied",
    "AuthError",
    "BlobNotFoundError",
    "BrokerError",
    "CdnError",
    "DeviceNotFoundError",
    "DocumentRejectedError",
    "HttpError",
    "IdenticalModelError",
    "InvalidNameError",
    "LeaseLostError",
    "ModelNotFoundError",
    "NoRolloutLeaderError",
    "PublishError",
    "PullError",
    "QuantizationError",
    "RangeNotSatisfiableError",
    "RegistryError",
    "RolloutConflictError",
    "RolloutNotFoundError",
    "RolloutRequestError",
    "RolloutStateError",
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


class IdenticalModelError(PublishError):
    """The model is byte for byte a version already published (``version``)."""

    def __init__(self, message: str, *, version: int) -> None:
        super().__init__(message)
        self.version = version


class PullError(CdnError):
    """A pulled model did not check out against its signed manifest or the request."""


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


class LeaseLostError(RegistryError):
    """A write fenced off: another server holds the rollout leader's lease now."""


class InvalidNameError(CdnError, ValueError):
    """A model name, device id or version that is not allowed (a bad digest: shared's
    ``InvalidStoreKeyError``)."""


class DocumentRejectedError(CdnError, ValueError):
    """A signed manifest or assignment that is well formed but not acceptable here."""


class BrokerError(CdnError):
    """The MQTT broker cannot be reached, refused, or did not acknowledge in time."""


class AssignmentNotPublishedError(BrokerError):
    """The assignment is stored in the registry (devices poll it) but was not published."""


class RolloutStateError(CdnError):
    """The command is not allowed in the rollout's current state."""


class RolloutConflictError(CdnError):
    """The model already has a rollout in progress."""


class RolloutRequestError(CdnError, ValueError):
    """The request cannot start a rollout (bad fields, waves, target)."""


class NoRolloutLeaderError(CdnError):
    """No rollout leader applied a command in time (none elected, or it is failing over)."""


class AuthError(CdnError):
    """Missing or wrong token."""


class HttpError(CdnError):
    """An answer of the HTTP API: its status, one-line message and extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


class AuthDenied(HttpError, AuthError):
    """A refusal of the credentials: 401 (with ``WWW-Authenticate``), 403 or 429."""


class RangeNotSatisfiableError(HttpError):
    """The range starts at or past the end of the blob (HTTP 416)."""

    def __init__(self, size: int) -> None:
        super().__init__(
            416,
            f"range not satisfiable: the blob has {size} bytes",
            {"Content-Range": f"bytes */{size}"},
        )
        self.size = size


class AdminApiError(CdnError):
    """The admin API refused the request (``status`` set) or could not be reached (None)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(" ".join(str(message).split()) or "unknown error")
        self.status = status
