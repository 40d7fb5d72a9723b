"""Deprecated module path of the CDN's HTTP app: it lives in ``model_cdn.http`` now.

``model_cdn.create_app`` (and ``model_cdn.http.create_app``) is the name to
use; this module keeps the old imports working.
"""

from __future__ import annotations

from shared import MAX_BLOB_BYTES, MAX_DOCUMENT_BYTES

from ._errors import HttpError
from .http._app import create_app
from .http._blobs import BLOB_FILE_CHUNK_BYTES, CHUNK_BYTES, IMMUTABLE, _BlobFileResponse

__all__ = [
    "BLOB_FILE_CHUNK_BYTES",
    "CHUNK_BYTES",
    "IMMUTABLE",
    "MAX_BLOB_BYTES",
    "MAX_DOCUMENT_BYTES",
    "HttpError",
    "_BlobFileResponse",
    "create_app",
]
