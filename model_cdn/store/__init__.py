"""Content-addressed, immutable blob storage for model files and deltas.

``BlobStore`` is the small interface (put/get/open/exists/size/delete, names
are ``sha256:<hex>`` digests the store computes itself); ``LocalBlobStore``
keeps blobs as files a web server can send directly, ``S3BlobStore`` keeps
them in any S3-compatible bucket; ``open_store`` picks one from a URL.
"""

from ._base import BlobStore, check_digest
from ._local import LocalBlobStore
from ._s3 import S3BlobStore
from ._url import open_store

__all__ = ["BlobStore", "LocalBlobStore", "S3BlobStore", "check_digest", "open_store"]
