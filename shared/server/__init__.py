"""What only servers use, shared by the hub and the CDN; devices never import it.

HTTP guards (read deadlines, media types), API keys and their rate limits (in
this process, or in Redis for every replica), blob stores (a local directory or
an S3-compatible bucket; boto3 imported only for ``s3://``) and the shards of
collected examples the hub writes and a training job reads.
"""

from ._apikeys import (
    API_KEY_SCOPES,
    ApiKey,
    ApiKeyFile,
    ApiKeyGuard,
    TokenBucket,
    generate_api_key,
    looks_like_api_key,
    parse_api_key,
)
from ._http_guards import (
    BINARY_MEDIA_TYPE,
    JSON_MEDIA_TYPE,
    HttpTimeouts,
    body_media_type,
    uvicorn_options,
)
from ._ratelimit import LocalRateLimiter, RateLimiter, RedisRateLimiter, rate_limiter
from ._shard_manifest import SHARD_FORMAT, ShardManifest
from ._shards import (
    EXAMPLES_AREA,
    list_shards,
    load_examples,
    read_manifest,
    read_shard,
    shard_prefix,
    write_shard,
)
from .store import (
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    StoredObject,
    check_digest,
    check_key,
    open_store,
)

__all__ = [
    "API_KEY_SCOPES",
    "BINARY_MEDIA_TYPE",
    "EXAMPLES_AREA",
    "JSON_MEDIA_TYPE",
    "SHARD_FORMAT",
    "ApiKey",
    "ApiKeyFile",
    "ApiKeyGuard",
    "BlobStore",
    "HttpTimeouts",
    "LocalBlobStore",
    "LocalRateLimiter",
    "RateLimiter",
    "RedisRateLimiter",
    "S3BlobStore",
    "ShardManifest",
    "StoredObject",
    "TokenBucket",
    "body_media_type",
    "check_digest",
    "check_key",
    "generate_api_key",
    "list_shards",
    "load_examples",
    "looks_like_api_key",
    "open_store",
    "parse_api_key",
    "rate_limiter",
    "read_manifest",
    "read_shard",
    "shard_prefix",
    "uvicorn_options",
    "write_shard",
]
