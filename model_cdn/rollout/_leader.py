"""One rollout leader among CDN replicas: a lease in the registry, renewed by a thread.

Every ``tandem cdn serve`` with rollouts on runs a ``LeaderLease`` on the
registry's ``leases`` table (``model_cdn.registry._leases``). The one that
holds lease ``rollout-leader`` is the leader: its controller ticks, publishes
assignments and writes rollout state; the others follow (they serve
manifests and blobs, hear the fleet, answer reads from the registry and queue
rollout commands for the leader).

Timing (``ttl_s``, 10 s by default; ``renew_s`` = ``ttl_s`` / 3):

- the holder renews every ``renew_s``; a follower tries to take the lease as
  often, and gets it once it has expired by the registry's clock, so a dead
  leader is replaced within ``ttl_s + renew_s``;
- the holder trusts its lease only until ``t0 + ttl_s - margin_s`` of its own
  monotonic clock, ``t0`` taken *before* it asked the registry: the registry
  can only have set the expiry later than that, so the holder stops acting
  before anyone else can start, even when it cannot reach the registry to
  learn that it lost (a network split, a stalled disk);
- a holder that was paused past that point (a GC pause, SIGSTOP, a VM
  migration) and wakes up believing in its lease is stopped by the fencing
  token: every write of the leader carries ``Fence(token)`` and the registry
  refuses it (``LeaseLostError``) once the token moved on.

``current()`` is what the controller asks before acting: the fence while
the lease is trusted, else None. ``stop()`` releases the lease, so a
follower takes over at its next try instead of waiting for the expiry.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable

from ..registry import Registry
from ..registry._leases import Fence

__all__ = ["DEFAULT_LEASE_TTL_S", "LEADER_LEASE", "LeaderLease"]

log = logging.getLogger("tandem.cdn.leader")

LEADER_LEASE = "rollout-leader"
DEFAULT_LEASE_TTL_S = 10.0


def _default_holder() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:60] or "host"
    return f"{host}:{os.getpid()}:{secrets.token_hex(4)}"


class LeaderLease:
    """See the module docstring. ``start()`` the renewing thread, ``stop()`` it (releases)."""

    def __init__(
        self,
        registry: Registry,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        renew_s: float | None = None,
        name: str = LEADER_LEASE,
        holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"the lease's ttl_s must be > 0 seconds, got {ttl_s!r}")
        self.registry, self.name, self.ttl_s = registry, name, float(ttl_s)
        self.renew_s = self.ttl_s / 3 if renew_s is None else float(renew_s)
        if not 0 < self.renew_s < self.ttl_s:
            raise ValueError("renew_s must be > 0 and below ttl_s")
        self.margin_s = self.ttl_s / 10
        self.holder = holder or _default_holder()
        self._clock = clock
        self._fence: Fence | None = None
        self._trusted_until = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> Fence | None:
        """The fence while this server may act as the leader, else None."""
        with self._lock:
            if self._fence is not None and self._clock() < self._trusted_until:
                return self._fence
            return None

    def try_acquire(self) -> Fence | None:
        """One attempt to take or renew the lease (registry errors are logged, not raised)."""
        t0 = self._clock()
        try:
            lease = self.registry.acquire_lease(self.name, self.holder, self.ttl_s)
        except Exception as e:  # a registry hiccup: keep what we had until it lapses
            log.warning("rollout lease %s: cannot reach the registry: %s", self.name, e)
            return self.current()
        with self._lock:
            before = self._fence
            if lease is None:
                self._fence, self._trusted_until = None, 0.0
            else:
                self._fence = lease.fence
                self._trusted_until = t0 + self.ttl_s - self.margin_s
            after = self._fence
        if after != before:
            if after is not None:
                log.info("rollout leader: %s (token %d)", self.holder, after.token)
            else:
                log.warning("rollout lease %s lost: %s follows now", self.name, self.holder)
        return self.current()

    def forfeit(self, fence: Fence) -> None:
        """Stop trusting ``fence`` (a write with it was refused: someone else leads)."""
        with self._lock:
            if self._fence == fence:
                self._fence, self._trusted_until = None, 0.0

    def start(self) -> LeaderLease:
        self._stop.clear()
        self.try_acquire()
        self._thread = threading.Thread(target=self._run, name="tandem-leader", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, release: bool = True) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(self.ttl_s)
        with self._lock:
            fence, self._fence, self._trusted_until = self._fence, None, 0.0
        if release and fence is not None:
            try:
                self.registry.release_lease(fence)
            except Exception as e:  # it expires by itself
                log.warning("rollout lease %s not released: %s", self.name, e)

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            self.try_acquire()
