"""How the hub packs a turn's tokens into chunks: by time and by size, without I/O.

A token is not a packet on a slow link: one MQTT message per token costs a
header, a topic and a PUBACK each. ``ChunkCoalescer`` holds the text and
ids that came since the last chunk and says when to send them:

* at once when nothing was sent for ``max_delay_s`` (the first token of a
  turn, or a slow engine: nothing waits that need not);
* else when ``max_delay_s`` has passed since the last chunk (``due_at``: the
  caller's timer), so at most one chunk per ``max_delay_s`` while text flows;
* or earlier, when ``max_bytes`` of text or ``max_tokens`` tokens are pending.

The final text always goes out with ``take`` before the turn's final.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkCoalescer", "Coalescing"]


@dataclass(frozen=True, kw_only=True)
class Coalescing:
    """Chunk sizes and pace; ``max_delay_s=0`` sends every update as it comes."""

    max_delay_s: float = 0.02  # at most one chunk per this many seconds while text flows
    max_bytes: int = 1024  # UTF-8 bytes of text pending that send a chunk at once
    max_tokens: int = 64  # tokens pending that send a chunk at once

    def __post_init__(self) -> None:
        if not self.max_delay_s >= 0 or self.max_bytes < 1 or self.max_tokens < 1:
            raise ValueError("max_delay_s must be >= 0, max_bytes and max_tokens >= 1")


class ChunkCoalescer:
    """The pending text and ids of one turn (not thread-safe: its stream holds a lock)."""

    def __init__(self, coalescing: Coalescing) -> None:
        self.coalescing = coalescing
        self._text: list[str] = []
        self._ids: list[int] = []
        self._bytes = 0
        self._last_sent: float | None = None

    @property
    def pending(self) -> bool:
        return bool(self._ids or self._text)

    def add(self, text: str, ids: tuple[int, ...] | list[int], now: float) -> bool:
        """Take new text and ids; True when a chunk should be sent now."""
        if text:
            self._text.append(text)
            self._bytes += len(text.encode("utf-8"))
        self._ids.extend(ids)
        if not self.pending:
            return False
        c = self.coalescing
        if self._bytes >= c.max_bytes or len(self._ids) >= c.max_tokens:
            return True
        return self._last_sent is None or now - self._last_sent >= c.max_delay_s

    def due_at(self) -> float | None:
        """When the pending text must go out at the latest (None: nothing pending)."""
        if not self.pending:
            return None
        return (self._last_sent or 0.0) + self.coalescing.max_delay_s

    def take(self, now: float) -> tuple[str, tuple[int, ...]]:
        """The pending text and ids, as one chunk; the pace restarts from ``now``."""
        text, ids = "".join(self._text), tuple(self._ids)
        self._text, self._ids, self._bytes = [], [], 0
        self._last_sent = now
        return text, ids
