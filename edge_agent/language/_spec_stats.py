"""What a speculative turn did: ``SpecStats``, on ``GenerationRecord.speculation``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpecStats"]


@dataclass(frozen=True, slots=True)
class SpecStats:
    """What a speculative turn did, for benches (``GenerationRecord.speculation``)."""

    rounds: int  # verdicts applied
    drafted: int  # draft tokens sent
    accepted: int  # of those, accepted by the hub
    hub_tokens: int  # the hub's own tokens (one per round, unless the turn ended on a draft)
    rtt_ms: tuple[float, ...]  # each round: send to verdict
    k: tuple[int, ...]  # each round's draft length
    resent: int = 0  # times the whole committed context went again (session unknown, gone)
    ahead_used: int = 0  # rounds whose drafts were drafted ahead, during the previous one
    alone_tokens: int = 0  # tokens the device decoded alone after the hub failed
