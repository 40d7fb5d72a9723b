"""The ``tandem demo --llm`` figures, without I/O: one turn's facts in, a preset's summary out.

Quality is **token agreement**: the share of the held-out continuation's
tokens that the generated continuation reproduces at the same position
(greedy decoding, the shared tokenizer; a turn that stops early scores its
missing positions as misses). It compares text from either model with the
same reference, so the device and the hub are judged alike. The
collaborative and speculative modes add the same measure against the hub's
own text (``cloud_only``'s turn on the prompt): ``hub_agreement``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "PresetSummary",
    "TurnFacts",
    "percentile",
    "summarize_preset",
    "token_agreement",
    "turn_side",
]

SIDES = ("edge", "cloud", "both")


@dataclass(frozen=True, slots=True)
class TurnFacts:
    """What one turn produced and cost, as its stream and record said."""

    prompt_tokens: int
    output_tokens: int  # len(record.output_ids)
    edge_tokens: int  # output tokens the device produced
    cloud_tokens: int  # output tokens the hub produced
    side: str  # "edge", "cloud" or "both" (the hub started, the device finished)
    agreement: float  # token_agreement with the held-out continuation
    ttft_ms: float | None
    tokens_per_s: float | None
    total_ms: float
    finish_reason: str
    route_reason: str  # "edge_only", "prefer_edge", "heavy", "cloud_only", "handoff", ...
    degraded: bool = False
    hub_agreement: float | None = None  # token_agreement with cloud_only's text (when it ran)
    handoff_at: int | None = None  # device tokens out when the hub took the turn over

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"side {self.side!r} not in {SIDES}")


@dataclass(frozen=True)
class PresetSummary:
    """One preset over every prompt: quality, who served what, and how fast."""

    preset: str
    turns: int
    agreement: float  # mean token agreement over the turns
    tokens: int  # output tokens, both sides
    edge_tokens: int
    cloud_tokens: int
    edge_turns: int
    cloud_turns: int
    both_turns: int  # begun at the hub, finished on the device
    heavy_turns: int  # routed to the hub by the heavy rule
    deadline_turns: int  # ended by the deadline
    degraded_turns: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_s_p50: float
    tokens_per_s_p99: float  # the slow tail: the rate 99% of the turns reached (1st percentile)
    total_p50_ms: float
    total_p99_ms: float
    hub_agreement: float = math.nan  # mean agreement with cloud_only's text (NaN: not measured)
    handed_off_turns: int = 0  # moved to the hub mid-turn (preset handoff)

    def to_dict(self) -> dict[str, Any]:
        """JSON types only: NaN (no turn had the value) becomes ``None``."""
        return {k: _json(v) for k, v in asdict(self).items()}


def token_agreement(generated: Sequence[int], reference: Sequence[int]) -> float:
    """Share of ``reference``'s positions where ``generated`` has the same token (0 if empty)."""
    if not reference:
        return 0.0
    same = sum(1 for g, r in zip(generated, reference, strict=False) if g == r)
    return same / len(reference)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100, linear between ranks, as numpy's default); NaN if empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} not in [0, 100]")
    data = sorted(values)
    if not data:
        return math.nan
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def summarize_preset(preset: str, turns: Sequence[TurnFacts]) -> PresetSummary:
    """Fold a preset's turns into its summary; NaN percentiles where no turn had a value."""
    ttft = [t.ttft_ms for t in turns if t.ttft_ms is not None]
    rates = [t.tokens_per_s for t in turns if t.tokens_per_s is not None]
    total = [t.total_ms for t in turns]
    hub = [t.hub_agreement for t in turns if t.hub_agreement is not None]
    return PresetSummary(
        preset=preset,
        turns=len(turns),
        agreement=sum(t.agreement for t in turns) / len(turns) if turns else math.nan,
        tokens=sum(t.output_tokens for t in turns),
        edge_tokens=sum(t.edge_tokens for t in turns),
        cloud_tokens=sum(t.cloud_tokens for t in turns),
        edge_turns=sum(t.side == "edge" for t in turns),
        cloud_turns=sum(t.side == "cloud" for t in turns),
        both_turns=sum(t.side == "both" for t in turns),
        heavy_turns=sum(t.route_reason == "heavy" for t in turns),
        deadline_turns=sum(t.finish_reason == "deadline" for t in turns),
        degraded_turns=sum(t.degraded for t in turns),
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
        tokens_per_s_p50=percentile(rates, 50),
        tokens_per_s_p99=percentile(rates, 1),
        total_p50_ms=percentile(total, 50),
        total_p99_ms=percentile(total, 99),
        hub_agreement=sum(hub) / len(hub) if hub else math.nan,
        handed_off_turns=sum(t.handoff_at is not None for t in turns),
    )


def _json(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else value


def turn_side(edge_tokens: int, cloud_tokens: int, routed_to_cloud: bool) -> str:
    """Who served a turn: by its tokens, or by its route when it produced none."""
    if edge_tokens and cloud_tokens:
        return "both"
    if cloud_tokens:
        return "cloud"
    if edge_tokens:
        return "edge"
    return "cloud" if routed_to_cloud else "edge"
