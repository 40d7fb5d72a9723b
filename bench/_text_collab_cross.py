"""When speculative decoding across the link beats cloud-only streaming: the crossover, pure.

Cloud-only streaming gives one token per hub decode step, ``h`` seconds (the
round trip enters its time to first token only). A speculative round: the
device drafts ``k`` tokens (``k * d`` seconds), sends them, the hub verifies
them in one forward pass (``v`` passes of ``h``; 1 here) and returns the
accepted prefix plus its own next token; the round costs ``rtt + k d + v h``
and yields ``E(p, k) = (1 - p^(k+1)) / (1 - p)`` tokens on average when each
drafted position agrees with the hub's greedy choice independently with
probability ``p`` (the agreement the distilled pair's build measures,
teacher-forced). Speculation wins when ``rtt + k d + v h < E h``, i.e. when

    h > h*(k) = (rtt + k d) / (E(p, k) - v)

(roughly the issue's "time per token exceeds the round trip divided by the
tokens accepted per round"), and for a given hub the round trips where it
wins are those below ``rtt*(k) = h (E - v) - k d``; the best ``k`` gives the
largest. ``edge_agent.language.crossover`` (the draft-length module of the
speculative work) computes ``h*`` the same way; this module uses it when that
function is there and the same formula inline until then (``source`` says
which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Crossover", "crossover_at", "expected_tokens", "hub_threshold_s"]

MAX_DRAFT = 16


def expected_tokens(p: float, k: int) -> float:
    """Tokens a round of ``k`` drafts yields on average: accepted drafts plus the hub's one."""
    if not 0.0 <= p <= 1.0 or k < 0:
        raise ValueError(f"agreement must be in [0, 1] and k >= 0, got {p}, {k}")
    return float(k + 1) if p == 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)


def _inline_threshold(p: float, k: int, rtt_s: float, draft_s: float, verify: float) -> float:
    tokens = expected_tokens(p, k)
    return math.inf if tokens <= verify else (rtt_s + k * draft_s) / (tokens - verify)


def hub_threshold_s(
    p: float, k: int, rtt_s: float, draft_s: float, verify: float = 1.0
) -> tuple[float, str]:
    """``(h*, source)``: the hub's seconds per token above which ``k`` drafts win."""
    try:
        from edge_agent import language

        shared = getattr(language, "crossover", None)
        if shared is not None:
            return float(shared(p, k, rtt_s, draft_s, verify_passes=verify)), "edge_agent"
    except Exception:  # a changed signature or refused figures: the inline formula stands
        pass
    return _inline_threshold(p, k, rtt_s, draft_s, verify), "inline"


@dataclass(frozen=True)
class Crossover:
    """At one round trip: the best draft length and what it predicts against cloud-only."""

    rtt_s: float
    best_k: int
    threshold_s: float  # h* at best_k
    predicted_s_per_token: float  # the speculative round time / E at best_k
    cloud_s_per_token: float  # h
    wins: bool
    max_rtt_s: float  # rtt*: the longest round trip at which the best k still wins
    source: str


def crossover_at(p: float, rtt_s: float, hub_s: float, draft_s: float) -> Crossover:
    """The draft length (1..``MAX_DRAFT``) with the lowest predicted time per token."""
    best = min(
        range(1, MAX_DRAFT + 1),
        key=lambda k: (rtt_s + k * draft_s + hub_s) / expected_tokens(p, k),
    )
    threshold, source = hub_threshold_s(p, best, rtt_s, draft_s)
    per_token = (rtt_s + best * draft_s + hub_s) / expected_tokens(p, best)
    max_rtt = max(
        hub_s * (expected_tokens(p, k) - 1.0) - k * draft_s for k in range(1, MAX_DRAFT + 1)
    )
    return Crossover(
        rtt_s=rtt_s, best_k=best, threshold_s=threshold, predicted_s_per_token=per_token,
        cloud_s_per_token=hub_s, wins=hub_s > threshold, max_rtt_s=max(max_rtt, 0.0),
        source=source,
    )  # fmt: skip
