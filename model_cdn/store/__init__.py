"""Deprecated home of the blob stores: they live in ``shared.store`` now.

The hub writes collected examples through the same stores the CDN keeps
models in, and the hub may not import ``model_cdn``, so the abstraction moved
to ``shared``. These names are the very same objects, kept so that existing
imports (``from model_cdn.store import LocalBlobStore``) keep working; new
code imports ``shared.store``.
"""

from shared.store import BlobStore, LocalBlobStore, S3BlobStore, check_digest, open_store

__all__ = ["BlobStore", "LocalBlobStore", "S3BlobStore", "check_digest", "open_store"]
