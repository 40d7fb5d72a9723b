"""Where API keys' token buckets live: in this process, or in Redis for every replica.

``ApiKeyGuard`` asks a ``RateLimiter`` for one token of a key's bucket
(``take(key_id, rate, burst)``: 0.0 when granted, else the seconds until a
token is back). Two limiters:

- ``LocalRateLimiter``: a ``TokenBucket`` per key in this process. N replicas
  each give a key its full rate, so a fleet of N hubs lets it through N times.
- ``RedisRateLimiter``: one bucket per key in Redis, shared by every process
  and replica that points at the same Redis (and ``prefix``). The bucket is a
  hash (tokens, time of the last take, rate, burst) updated by one Lua script,
  which Redis runs atomically, with the Redis server's clock (``TIME``), so
  replicas' clocks do not matter. A key idle for a whole refill expires.

Why a script and not the ``limits`` library: ``limits`` offers fixed, moving
and sliding windows, not a token bucket; a key's limit here is a rate plus a
burst with an exact ``Retry-After``, which the windows would change (a fixed
window lets 2x the burst through across a boundary, a moving window stores
one entry per request). The script is the same bucket ``TokenBucket`` is.

Fallback: when Redis does not answer (refused, timed out, reset, or the
script fails), the limiter logs one warning line and uses its own
``LocalRateLimiter`` (per-process limits: each replica then lets a key
through at its full rate), and tries Redis again every ``retry_s``; when
Redis answers again it logs that once and the shared buckets are back.
A rate check never waits longer than ``timeout_s`` for Redis.

``redis`` (the client package) is imported only by ``RedisRateLimiter``,
so ``shared`` and the edge SDK never need it.

Errors: a malformed URL or a missing ``redis`` package is ``ConfigError``
at construction; nothing else escapes ``take``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from .._errors import ConfigError

__all__ = ["LocalRateLimiter", "RateLimiter", "RedisRateLimiter", "TokenBucket", "rate_limiter"]

log = logging.getLogger("tandem.ratelimit")

# KEYS[1]: the bucket; ARGV: rate (tokens/s), burst (tokens), as decimal text.
# Returns the seconds to wait as text (0 when a token was taken): Redis would truncate a
# Lua number to an integer.
_TAKE_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'tokens', 'at', 'rate', 'burst')
local tokens = tonumber(s[1])
local at = tonumber(s[2])
if tokens == nil or at == nil or s[3] ~= ARGV[1] or s[4] ~= ARGV[2] then
  tokens = burst
  at = now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'at', string.format('%.17g', now), 'rate', ARGV[1], 'burst', ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return string.format('%.17g', wait)
"""


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second of ``clock``; thread-safe."""

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take a token: 0.0 when granted, else the seconds until one is back (none taken)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.rate


class RateLimiter(Protocol):
    """Takes one token of a key's bucket: 0.0 when granted, else seconds until one is back."""

    def take(self, key_id: str, rate: float, burst: int) -> float: ...


class LocalRateLimiter:
    """A ``TokenBucket`` per key id in this process; a changed rate or burst starts afresh."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def take(self, key_id: str, rate: float, burst: int) -> float:
        with self._lock:
            bucket = self._buckets.get(key_id)
            if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
                bucket = TokenBucket(rate, burst, clock=self._clock)
                self._buckets[key_id] = bucket
        return bucket.take()


class RedisRateLimiter:
    """Token buckets in Redis at ``url`` (``redis://host:6379/0``, ``rediss://`` for TLS).

    See the module docstring. ``fallback`` is where keys are counted while
    Redis is away (a ``LocalRateLimiter`` of its own by default).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "tandem:ratelimit:",
        timeout_s: float = 0.25,
        retry_s: float = 5.0,
        fallback: RateLimiter | None = None,
    ) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if (
            parts is None
            or parts.scheme not in ("redis", "rediss", "unix")
            or not (parts.hostname or parts.path)
        ):
            raise ConfigError(f"not a Redis URL: {url!r:.80} (use redis://host:6379/0)")
        try:
            import redis
        except ImportError as e:
            raise ConfigError("shared rate limits need redis: pip install 'redis>=5'") from e
        self.where = f"{parts.hostname or parts.path}:{parts.port or 6379}"
        self.prefix, self.retry_s = prefix, retry_s
        self.fallback = fallback if fallback is not None else LocalRateLimiter()
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._script = self._client.register_script(_TAKE_SCRIPT)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._down_until = 0.0  # monotonic time before which Redis is not asked again
        self._lock = threading.Lock()
        try:  # one line at start-up rather than at the first request
            self._client.ping()
        except self._errors as e:
            self._went_down(e)

    @property
    def shared(self) -> bool:
        """Whether the last decision came from Redis (False: per-process fallback)."""
        return self._down_until == 0.0

    def take(self, key_id: str, rate: float, burst: int) -> float:
        if self._down_until and time.monotonic() < self._down_until:
            return self.fallback.take(key_id, rate, burst)
        try:
            wait = float(self._script(keys=[self.prefix + key_id], args=[repr(rate), str(burst)]))
        except self._errors as e:
            self._went_down(e)
            return self.fallback.take(key_id, rate, burst)
        if self._down_until:
            with self._lock:
                if self._down_until:
                    self._down_until = 0.0
                    log.warning("Redis at %s answers again: rate limits are shared", self.where)
        return wait

    def _went_down(self, error: BaseException) -> None:
        with self._lock:
            first = self._down_until == 0.0
            self._down_until = time.monotonic() + self.retry_s
        if first:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            log.warning(
                "Redis at %s is unreachable (%s): rate limits are per process until it is back",
                self.where,
                reason,
            )

    def close(self) -> None:
        self._client.close()


def rate_limiter(redis_url: str | None, **options: Any) -> RateLimiter:
    """``RedisRateLimiter(redis_url, **options)``, or a ``LocalRateLimiter`` when None."""
    if redis_url is None or not redis_url.strip():
        return LocalRateLimiter()
    return RedisRateLimiter(redis_url.strip(), **options)
