"""API keys for the HTTP servers: scopes, per-key rate limits, and a JSON file of keys.

A key reads ``tdm_<id>_<secret>``: ``id`` is 8 lower-case hex digits (public:
it names the key in logs, the key file and ``tandem keys revoke``), ``secret``
is 32 random bytes, URL-safe base64 without padding. The file keeps only the
SHA-256 of the secret, never the secret itself, which is printed once by
``tandem keys create``; secrets are compared with ``hmac.compare_digest``.

Invariants:

- ``ApiKeyGuard.check`` decides in this order, so that the answer never tells
  a stranger more than "no": 401 (``InvalidApiKeyError``: malformed, unknown,
  wrong secret or revoked), then 403 (``ScopeError``: none of the scopes
  asked for), then 429 (``RateLimitedError``: the key's bucket is empty). A
  refused request (401/403) takes no token from any bucket.
- A token bucket holds at most ``burst`` tokens, refills at ``rate`` tokens
  per second of its clock, and a request takes one; ``retry_after_s`` is the
  time until one token is back. Buckets are per key id and thread-safe; a key
  whose rate or burst changes in the file gets a fresh, full bucket. They live
  in this process, or in Redis for every replica (``_ratelimit``).
- ``ApiKeyFile`` re-reads the file whenever its (mtime, size, inode) change,
  so ``tandem keys revoke`` takes effect on a running server at the next
  request. A file that disappears or no longer parses fails closed: no key
  is accepted until it is fixed (logged once per change).
- Writes are atomic (a temporary file renamed over the old one) and mode 0600.

Errors (``ApiKeyError`` and its subclasses, drawn in ``shared._errors``)::

    InvalidApiKeyError      malformed, unknown, wrong secret or revoked key  -> 401
    ScopeError              the key lacks every scope the route accepts      -> 403
    RateLimitedError        the key's token bucket is empty (retry_after_s)  -> 429
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_bytes
from .._errors import (
    ConfigError,
    InvalidApiKeyError,
    RateLimitedError,
    ScopeError,
)
from ._ratelimit import LocalRateLimiter, RateLimiter, TokenBucket

__all__ = [
    "API_KEY_SCOPES",
    "ApiKey",
    "ApiKeyFile",
    "ApiKeyGuard",
    "TokenBucket",
    "generate_api_key",
    "looks_like_api_key",
    "parse_api_key",
]

log = logging.getLogger(__name__)

API_KEY_SCOPES = frozenset({"infer", "generate", "models:read", "models:publish", "rollout:admin"})
KEY_PREFIX = "tdm_"
_KEY = re.compile(r"tdm_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")
_ID = re.compile(r"[0-9a-f]{8}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE_VERSION = 1


def _secret_sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def _now_text() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class ApiKey:
    """One key as the file stores it: no secret, only its SHA-256 (hex)."""

    id: str
    secret_sha256: str
    scopes: frozenset[str]
    name: str = ""
    rate: float = 20.0  # requests per second, refill of the bucket
    burst: int = 40  # requests at once, size of the bucket
    created: str = field(default_factory=_now_text)
    revoked: str | None = None  # when it was revoked; a revoked key is refused (401)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scopes", frozenset(self.scopes))
        if not isinstance(self.id, str) or not _ID.fullmatch(self.id):
            raise ConfigError(f"an API key id is 8 lower-case hex digits, got {self.id!r:.40}")
        if not isinstance(self.secret_sha256, str) or not _HEX64.fullmatch(self.secret_sha256):
            raise ConfigError(f"API key {self.id}: secret_sha256 must be 64 lower-case hex digits")
        unknown = sorted(self.scopes - API_KEY_SCOPES)
        if not self.scopes or unknown:
            raise ConfigError(
                f"API key {self.id}: scopes must be some of {sorted(API_KEY_SCOPES)}, got "
                f"{sorted(self.scopes)}"
            )
        if not isinstance(self.name, str) or not self.name.isprintable():
            raise ConfigError(f"API key {self.id}: the name must be printable text")
        rate_ok = isinstance(self.rate, int | float) and not isinstance(self.rate, bool)
        if not rate_ok or not math.isfinite(self.rate) or self.rate <= 0:
            raise ConfigError(f"API key {self.id}: rate must be a positive number of requests/s")
        if not isinstance(self.burst, int) or isinstance(self.burst, bool) or self.burst < 1:
            raise ConfigError(f"API key {self.id}: burst must be a whole number ≥ 1")

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is this key's (constant time in the secret)."""
        return hmac.compare_digest(_secret_sha256(secret), self.secret_sha256)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "secret_sha256": self.secret_sha256,
            "scopes": sorted(self.scopes),
            "rate": self.rate,
            "burst": self.burst,
            "created": self.created,
            "revoked": self.revoked,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApiKey:
        try:
            scopes = data["scopes"]
            if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
                raise ConfigError(f"API key {data.get('id')!r:.40}: scopes must be a list")
            return cls(
                id=data["id"],
                secret_sha256=data["secret_sha256"],
                scopes=frozenset(scopes),
                name=data.get("name", ""),
                rate=data.get("rate", 20.0),
                burst=data.get("burst", 40),
                created=str(data.get("created", "")),
                revoked=None if data.get("revoked") is None else str(data["revoked"]),
            )
        except KeyError as e:
            raise ConfigError(f"an API key entry lacks {e.args[0]!r}") from e


def generate_api_key(
    scopes: Iterable[str], *, name: str = "", rate: float = 20.0, burst: int = 40
) -> tuple[str, ApiKey]:
    """A new key: its full text (show it once, store it nowhere) and its record."""
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")
    key = ApiKey(
        id=secrets.token_hex(4),
        secret_sha256=_secret_sha256(secret),
        scopes=frozenset(scopes),
        name=name,
        rate=rate,
        burst=burst,
    )
    return f"{KEY_PREFIX}{key.id}_{secret}", key


def parse_api_key(text: str) -> tuple[str, str]:
    """``(id, secret)`` of a key's text; ``InvalidApiKeyError`` when it is not one."""
    match = _KEY.fullmatch(text)
    if match is None:
        raise InvalidApiKeyError("malformed API key: expected tdm_<id>_<secret>")
    return match.group(1), match.group(2)


def looks_like_api_key(text: str) -> bool:
    """Whether ``text`` claims to be an API key (so it is judged as one, not as a token)."""
    return text.startswith(KEY_PREFIX)


# -- the file of keys ---------------------------------------------------------------------


class ApiKeyFile:
    """Keys in a JSON file: ``{"version": 1, "keys": [ApiKey.to_dict(), …]}``.

    ``keys()`` answers from memory and re-reads the file when it changed.
    ``add``/``revoke`` rewrite it atomically; they are for one writer at a time
    (the CLI), while any number of servers read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, ApiKey] = {}

    def keys(self) -> dict[str, ApiKey]:
        """The keys by id, as the file says now; empty (fail closed) when it is unreadable."""
        with self._lock:
            try:
                info = self.path.stat()
                stamp: tuple[int, int, int] | None = (info.st_mtime_ns, info.st_size, info.st_ino)
            except OSError:
                stamp = None
            if stamp != self._stamp or stamp is None:
                try:
                    self._keys = self._read()
                except ConfigError as e:
                    if stamp is not None or self._stamp is not None:
                        log.error("API keys refused until the file is fixed: %s", e)
                    self._keys = {}
                self._stamp = stamp
            return dict(self._keys)

    def load(self) -> dict[str, ApiKey]:
        """The keys by id; ``ConfigError`` when the file is missing or invalid."""
        with self._lock:
            return self._read()

    def add(self, key: ApiKey) -> None:
        keys = self._read() if self.path.exists() else {}
        if key.id in keys:
            raise ConfigError(f"an API key with id {key.id} is already in {self.path}")
        keys[key.id] = key
        self._write(keys)

    def revoke(self, key_id: str) -> ApiKey:
        """Mark ``key_id`` revoked (kept, so ``list`` shows it); the revoked record."""
        keys = self._read()
        if key_id not in keys:
            raise ConfigError(f"no API key {key_id!r:.20} in {self.path}")
        if keys[key_id].revoked is None:
            keys[key_id] = replace(keys[key_id], revoked=_now_text())
            self._write(keys)
        return keys[key_id]

    def _read(self) -> dict[str, ApiKey]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"no API key file {self.path}") from e
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the API key file {self.path}: {e}") from e
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ConfigError(f"{self.path} is not an API key file (no 'keys' list)")
        if data.get("version") != _FILE_VERSION:
            found = data.get("version")
            raise ConfigError(f"{self.path}: unsupported API key file version {found!r:.20}")
        keys: dict[str, ApiKey] = {}
        for entry in data["keys"]:
            if not isinstance(entry, dict):
                raise ConfigError(f"{self.path}: every key must be a JSON object")
            key = ApiKey.from_dict(entry)
            if key.id in keys:
                raise ConfigError(f"{self.path}: API key id {key.id} appears twice")
            keys[key.id] = key
        return keys

    def _write(self, keys: Mapping[str, ApiKey]) -> None:
        text = json.dumps(
            {"version": _FILE_VERSION, "keys": [k.to_dict() for k in keys.values()]}, indent=2
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Owner only (as mkstemp made it before): it decides who may call the servers.
        atomic_write_bytes(self.path, (text + "\n").encode(), mode=0o600)


# -- the decision ---------------------------------------------------------------------------


class ApiKeyGuard:
    """Authenticates a key, checks its scopes, and rate-limits it.

    ``source`` gives the current keys by id (``ApiKeyFile.keys``, or a plain
    dict's ``.copy`` in tests). ``limiter`` holds the token buckets: per
    process by default (``clock`` drives them), or shared by every replica
    (``shared.RedisRateLimiter``, see ``shared.server._ratelimit``).
    """

    def __init__(
        self,
        source: Callable[[], Mapping[str, ApiKey]],
        *,
        clock: Callable[[], float] = time.monotonic,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._source = source
        self.limiter = limiter if limiter is not None else LocalRateLimiter(clock=clock)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, limiter: RateLimiter | None = None
    ) -> ApiKeyGuard:
        """A guard over the key file at ``path``; ``ConfigError`` if it is missing or invalid.

        ``limiter``: where the buckets live (``shared.rate_limiter(redis_url)``).
        """
        store = ApiKeyFile(path)
        store.load()  # refuse to start on a file that would lock everyone out
        return cls(store.keys, limiter=limiter)

    def authenticate(self, text: str) -> ApiKey:
        key_id, secret = parse_api_key(text)
        key = self._source().get(key_id)
        # An unknown id still costs a hash and a compare: the timing says nothing either way.
        if key is None:
            hmac.compare_digest(_secret_sha256(secret), "0" * 64)
            raise InvalidApiKeyError("unknown API key")
        if not key.matches(secret):
            raise InvalidApiKeyError("unknown API key")
        if key.revoked is not None:
            raise InvalidApiKeyError(f"API key {key.id} was revoked")
        return key

    def check(self, text: str, any_of: Iterable[str]) -> ApiKey:
        """The key of ``text`` if it is valid, has one of ``any_of`` and is within its rate."""
        key = self.authenticate(text)
        wanted = frozenset(any_of)
        if not key.scopes & wanted:
            needs = " or ".join(repr(s) for s in sorted(wanted))
            raise ScopeError(f"API key {key.id} lacks the scope {needs}")
        wait = self.limiter.take(key.id, key.rate, key.burst)
        if wait > 0:
            raise RateLimitedError(
                f"API key {key.id} is over its rate of {key.rate:g} requests/s", wait
            )
        return key
