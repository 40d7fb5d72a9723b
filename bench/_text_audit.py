"""What the text bench parts count, without I/O (bench part h, issue 22 item 9).

``audit`` reads one turn as the device reported it (its ``TextChunk`` list as
``(index, source, text)`` and its ``GenerationRecord``'s fields) against what
the models say the turn must be, and names every way it is not whole:

* ``lost``: the turn raised, or ended without a result, an error or no text;
* an index delivered twice (``repeated index``) or skipped (``missing index``);
* the record's text not the chunks' text joined (``text != chunks``);
* the hub's text not a prefix of the hub model's greedy text (a hub chunk
  repeated or missed in the middle: ``hub text``);
* a chunk of the hub's after one of the device's (``source order``);
* the device's continuation not the device model's greedy text after the
  prompt and the hub's text (text repeated or missed at the splice:
  ``splice``);
* a turn that ended whole at the hub shorter than its greedy text
  (``hub text short``);
* the hub's text the device showed not the text of the chunks the hub sent
  for the turn, as a spy saw them on the wire (``hub_sent``: each seq once,
  in order; ``hub chunk not shown``: a chunk that reached the broker but not
  the user, or a seq the device took twice).

``outcome`` says who finished a whole turn: ``hub`` (every chunk the hub's),
``degraded`` (the hub's text, then the device's) or ``local`` (the device's
only). ``wire_repeats`` counts the hub's chunks a spy saw twice on the wire
(the device's reorder buffer drops them); ``sent_texts`` joins each request's
chunks from those frames. ``tpot_s`` is time per output
token: from the first token to the last, over ``tokens - 1``; the targets
compares ``paired_ratio`` (each round's two paths), ``ratio_of_medians`` is
reported beside it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "TurnSeen",
    "audit",
    "outcome",
    "paired_ratio",
    "ratio_of_medians",
    "sent_texts",
    "tpot_s",
    "wire_repeats",
]

CLOUD, EDGE = "cloud", "edge"


@dataclass(frozen=True)
class TurnSeen:
    """One turn as the device reported it, and what the models say it must be.

    ``local_expected`` is the device model's greedy continuation after the
    prompt and the hub's text (``None``: not computed, the turn had no device
    text); ``hub_expected`` the hub model's greedy text for the prompt.
    """

    chunks: tuple[tuple[int, str, str], ...]  # (index, source, text) in delivery order
    text: str | None  # record.text; None: no record
    error: str | None  # record.error, or what the stream raised
    degraded: bool
    hub_expected: str
    local_expected: str | None = None
    raised: bool = False
    hub_sent: str | None = None  # the hub's chunks on the wire, joined; None: not seen


def _cloud_local(turn: TurnSeen) -> tuple[str, str]:
    cloud = "".join(t for _, s, t in turn.chunks if s == CLOUD)
    local = "".join(t for _, s, t in turn.chunks if s == EDGE)
    return cloud, local


def audit(turn: TurnSeen) -> list[str]:
    """Every way ``turn`` is not whole (empty: whole)."""
    if turn.raised or turn.text is None or turn.error is not None or not turn.text:
        return ["lost"]
    problems = []
    indexes = [i for i, _, _ in turn.chunks]
    if any(n > 1 for n in Counter(indexes).values()):
        problems.append("repeated index")
    if sorted(set(indexes)) != list(range(len(set(indexes)))):
        problems.append("missing index")
    if turn.text != "".join(t for _, _, t in turn.chunks):
        problems.append("text != chunks")
    sources = [s for _, s, _ in turn.chunks]
    if sources != sorted(sources, key=lambda s: s != CLOUD):
        problems.append("source order")
    cloud, local = _cloud_local(turn)
    if not turn.hub_expected.startswith(cloud):
        problems.append("hub text")
    if local and local != turn.local_expected:
        problems.append("splice")
    if not local and cloud != turn.hub_expected:
        problems.append("hub text short")
    if turn.hub_sent is not None and cloud != turn.hub_sent:
        problems.append("hub chunk not shown")
    return problems


def outcome(turn: TurnSeen) -> str:
    """``lost``, ``hub``, ``degraded`` or ``local``: who finished the turn."""
    if audit(turn) == ["lost"]:
        return "lost"
    cloud, local = _cloud_local(turn)
    if not local:
        return "hub"
    return "degraded" if cloud else "local"


def wire_repeats(frames: Iterable[tuple[str, str, int]]) -> int:
    """Frames ``(request id, kind, seq)`` seen more than once, beyond their first."""
    seen = Counter(frames)
    return sum(n - 1 for n in seen.values())


def sent_texts(frames: Iterable[tuple[str, str, int, str]]) -> dict[str, str]:
    """Each request's chunk texts ``(request id, "chunk", seq, text)``, each seq once, joined
    in seq order (frames of other kinds are skipped)."""
    chunks: dict[str, dict[int, str]] = {}
    for request_id, kind, seq, text in frames:
        if kind == "chunk":
            chunks.setdefault(request_id, {}).setdefault(seq, text)
    return {rid: "".join(t for _, t in sorted(by_seq.items())) for rid, by_seq in chunks.items()}


def tpot_s(first_s: float, last_s: float, tokens: int) -> float | None:
    """Time per output token: from the first token's arrival to the last's, over the
    ``tokens - 1`` tokens after the first (``None`` with fewer than two tokens)."""
    if tokens < 2:
        return None
    return (last_s - first_s) / (tokens - 1)


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median of ``num[i] / den[i]``: each round's two paths, measured one after the
    other, compared with each other (a load that drifts between rounds cancels out)."""
    if len(num) != len(den) or not num:
        raise ValueError("paired_ratio needs two equally long, non-empty sequences")
    return float(statistics.median(n / d for n, d in zip(num, den, strict=True)))


def ratio_of_medians(num: Sequence[float], den: Sequence[float]) -> float:
    """median(num) / median(den): the figure a target compares."""
    return statistics.median(num) / statistics.median(den)
