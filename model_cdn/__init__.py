"""The model CDN: publish signed, quantized models; serve them; assign them to devices.

- ``publish_model`` (``model_cdn.publish``): float ONNX -> quantized, validated,
  compressed, signed, stored and registered.
- ``open_registry`` / ``Registry``: versions, manifests and assignments
  (SQLite or PostgreSQL); ``open_store`` / ``BlobStore``: content-addressed blobs.
- ``create_app``: the HTTP API devices download from.
- ``make_assignment`` / ``publish_assignment``: tell a device which version to run.
- ``AdminClient``: the admin API from elsewhere (publish, assign, rollouts, fleet).

Light to import: the HTTP server (FastAPI) and the publish pipeline (onnx,
onnxruntime) load on first use of their names, PostgreSQL support on first
use of a ``postgresql://`` URL.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._admin_client import AdminApiError, AdminClient
from ._assign import make_assignment, publish_assignment
from ._errors import (
    AuthError,
    BlobNotFoundError,
    CdnError,
    DeviceNotFoundError,
    InvalidNameError,
    ModelNotFoundError,
    PublishError,
    QuantizationError,
    RegistryError,
    RolloutNotFoundError,
    StoreError,
    ValidationError,
    VersionConflictError,
)
from .registry import Registry, VersionRecord, open_registry
from .store import BlobStore, LocalBlobStore, open_store

if _typing.TYPE_CHECKING:
    from ._server import create_app
    from .publish import PublishResult, load_samples, publish_model

__all__ = [
    "AdminApiError",
    "AdminClient",
    "AuthError",
    "BlobNotFoundError",
    "BlobStore",
    "CdnError",
    "DeviceNotFoundError",
    "InvalidNameError",
    "LocalBlobStore",
    "ModelNotFoundError",
    "PublishError",
    "PublishResult",
    "QuantizationError",
    "Registry",
    "RegistryError",
    "RolloutNotFoundError",
    "StoreError",
    "ValidationError",
    "VersionConflictError",
    "VersionRecord",
    "create_app",
    "load_samples",
    "make_assignment",
    "open_registry",
    "open_store",
    "publish_assignment",
    "publish_model",
]

# name -> the module that defines it, imported on first access
_LAZY = {
    "create_app": "._server",
    "PublishResult": ".publish",
    "load_samples": ".publish",
    "publish_model": ".publish",
}


def __getattr__(name: str) -> _typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
