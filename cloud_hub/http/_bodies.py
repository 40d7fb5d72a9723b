"""Request bodies on the hub's HTTP ingress: read into one buffer, under a size limit and an
in-flight byte budget, and big ones decoded or encoded off the event loop.

``declared_length`` refuses (413) a Content-Length above the limit before a
byte is read; ``read_body`` fills one ``bytearray`` (no copies) and refuses
once the streamed length passes it. ``ByteBudget`` counts the bytes of the
bodies held at once (read, decoded, waiting for the model): past it, 503
``overloaded``. A body is charged before it is read when it declares its
length, and as it grows while it is read when it does not (chunked
transfer encoding), so a flood of chunked bodies meets the budget as they
arrive, not once they are in memory; a ``Lease`` gives back all it took.
``maybe_offload`` runs work on more than ``OFFLOAD_BYTES`` in a worker thread so
that one large body does not stall the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from shared import LimitExceededError

from .._errors import OverloadedError

__all__ = ["OFFLOAD_BYTES", "ByteBudget", "Lease", "declared_length", "maybe_offload", "read_body"]

OFFLOAD_BYTES = 256 * 1024
_T = TypeVar("_T")


def declared_length(request: Request, limit: int) -> int | None:
    """The body's Content-Length, refused (413) above ``limit``; None when not declared."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.strip().isdigit():
        return None
    if int(declared) > limit:
        raise LimitExceededError(f"a body of {declared} bytes is above the limit of {limit}")
    return int(declared)


async def read_body(request: Request, limit: int, declared: int | None, lease: Lease) -> bytearray:
    """The body, into one buffer (no copies), refused (413) once it passes ``limit``.

    ``lease`` holds at least the buffer's bytes: taken before it grows (503 past the budget).
    """
    lease.hold(declared or 0)
    body = bytearray(declared or 0)
    filled = 0
    async for chunk in request.stream():
        end = filled + len(chunk)
        if end > limit:
            raise LimitExceededError(f"the body is above the limit of {limit} bytes")
        if end > len(body):  # longer than declared, or not declared: grow
            lease.hold(end)
            body.extend(bytes(end - len(body)))
        body[filled:end] = chunk
        filled = end
    del body[filled:]
    return body


class ByteBudget:
    """Bytes of request bodies held at once; ``take`` beyond the limit raises ``OverloadedError``.

    Single-threaded (the event loop's): no lock.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> int:
        if n and self.held + n > self.limit:
            raise OverloadedError(
                f"the hub holds {self.held} bytes of requests; {n} more would pass its budget "
                f"of {self.limit}: try again shortly"
            )
        self.held += n
        return n

    def give(self, n: int) -> None:
        self.held -= n

    def lease(self) -> Lease:
        return Lease(self)


class Lease:
    """One request's share of a ``ByteBudget``: ``hold(n)`` grows it to n, ``release`` ends it."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0

    def hold(self, n: int) -> None:
        if n > self.held:
            self.held += self.budget.take(n - self.held)

    def release(self) -> None:
        self.budget.give(self.held)
        self.held = 0


async def maybe_offload(size: int, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    if size > OFFLOAD_BYTES:
        return await run_in_threadpool(fn, *args, **kwargs)
    return fn(*args, **kwargs)
