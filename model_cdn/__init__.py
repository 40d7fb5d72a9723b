"""The model CDN: publish signed, quantized models; serve them; assign them to devices.

- ``publish_model`` (``model_cdn.publish``; ``publish_package`` for an ONNX Runtime
  GenAI model folder): float ONNX -> quantized, validated,
  compressed, signed, stored and registered.
- ``open_registry`` / ``Registry``: versions, manifests and assignments
  (SQLite or PostgreSQL); ``open_store`` / ``BlobStore``: content-addressed blobs.
- ``add_version`` / ``delete_version`` / ``assign_version``: the write operations,
  one code path each for the HTTP API and the CLI (``_versions``).
- ``AssignmentSender``: the one way an assignment leaves the CDN (stored,
  then published retained over MQTT); ``make_assignment`` signs one.
- ``create_app``: the HTTP API devices download from (``model_cdn.http``).
- ``AdminClient``: the admin API from elsewhere (publish, assign, rollouts, fleet).
- ``pull_model``: a published version, verified, as the model file's bytes, from the
  CDN (``CdnSource``) or a registry and store (``RegistrySource``); ``write_model_file``.
- ``CdnError`` and its subclasses: the exception tree is drawn in ``_errors``.

Light to import: the HTTP server (FastAPI) and the publish pipeline (onnx,
onnxruntime) load on first use of their names, PostgreSQL support on first
use of a ``postgresql://`` URL.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from shared.server.store import BlobStore, LocalBlobStore, open_store

from ._assign import make_assignment
from ._assignment_sender import AssignmentLink, AssignmentSender
from ._errors import (
    AdminApiError,
    AssignmentNotPublishedError,
    AuthDenied,
    AuthError,
    BlobNotFoundError,
    BrokerError,
    CdnError,
    DeviceNotFoundError,
    DocumentRejectedError,
    HttpError,
    IdenticalModelError,
    InvalidNameError,
    LeaseLostError,
    ModelNotFoundError,
    NoRolloutLeaderError,
    PublishError,
    PullError,
    QuantizationError,
    RangeNotSatisfiableError,
    RegistryError,
    RolloutConflictError,
    RolloutNotFoundError,
    RolloutRequestError,
    RolloutStateError,
    StoreError,
    ValidationError,
    VersionConflictError,
)
from ._pull import (
    MODEL_SUFFIXES,
    CdnSource,
    ModelSource,
    PulledVersion,
    RegistrySource,
    pull_model,
    write_model_file,
    write_package_dir,
)
from ._versions import AssignResult, add_version, assign_version, delete_version
from .admin_client import AdminClient
from .registry import Registry, VersionRecord, open_registry

if _typing.TYPE_CHECKING:
    from .http import create_app
    from .publish import PublishResult, load_samples, publish_model, publish_package
    from .rollout._service import FleetService

__all__ = [
    "MODEL_SUFFIXES",
    "AdminApiError",
    "AdminClient",
    "AssignResult",
    "AssignmentLink",
    "AssignmentNotPublishedError",
    "AssignmentSender",
    "AuthDenied",
    "AuthError",
    "BlobNotFoundError",
    "BlobStore",
    "BrokerError",
    "CdnError",
    "CdnSource",
    "DeviceNotFoundError",
    "DocumentRejectedError",
    "FleetService",
    "HttpError",
    "IdenticalModelError",
    "InvalidNameError",
    "LeaseLostError",
    "LocalBlobStore",
    "ModelNotFoundError",
    "ModelSource",
    "NoRolloutLeaderError",
    "PublishError",
    "PublishResult",
    "PullError",
    "PulledVersion",
    "QuantizationError",
    "RangeNotSatisfiableError",
    "Registry",
    "RegistryError",
    "RegistrySource",
    "RolloutConflictError",
    "RolloutNotFoundError",
    "RolloutRequestError",
    "RolloutStateError",
    "StoreError",
    "ValidationError",
    "VersionConflictError",
    "VersionRecord",
    "add_version",
    "assign_version",
    "create_app",
    "delete_version",
    "load_samples",
    "make_assignment",
    "open_registry",
    "open_store",
    "publish_model",
    "publish_package",
    "pull_model",
    "write_model_file",
    "write_package_dir",
]

# name -> the module that defines it, imported on first access
_LAZY = {
    "create_app": ".http",
    "PublishResult": ".publish",
    "load_samples": ".publish",
    "publish_model": ".publish",
    "publish_package": ".publish",
    "FleetService": ".rollout._service",
}


def __getattr__(name: str) -> _typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
