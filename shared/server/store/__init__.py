"""Blob storage that the CDN (models) and the hub (collected examples) share.

``BlobStore`` is the small interface: content-addressed, immutable blobs
(put/get/open/exists/size/delete, named by the ``sha256:<hex>`` digest the
store computes itself) and objects named by a key (put_object/get_object/
list_objects/delete_object, written whole and atomically).
``LocalBlobStore`` keeps both as files a web server can send directly,
``S3BlobStore`` in any S3-compatible bucket (boto3 is imported only for
one); ``open_store`` picks one from a URL. Errors: ``shared.StoreError``,
``shared.BlobNotFoundError``, ``shared.InvalidStoreKeyError``.
"""

from ._base import BlobStore, StoredObject, check_digest, check_key
from ._local import LocalBlobStore
from ._s3 import S3BlobStore
from ._url import open_store

__all__ = [
    "BlobStore",
    "LocalBlobStore",
    "S3BlobStore",
    "StoredObject",
    "check_digest",
    "check_key",
    "open_store",
]
