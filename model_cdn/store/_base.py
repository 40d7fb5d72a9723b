"""Deprecated module path: ``BlobStore`` and ``check_digest`` live in ``shared.store``."""

from shared.store import BlobStore, check_digest

__all__ = ["BlobStore", "check_digest"]
