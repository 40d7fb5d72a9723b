"""The share of the edge-to-hub quality gap a text policy recovers at a budget: pure.

Two measures, both on held-out text (documents never seen in training), both
turned into **gap recovered** = (Q - Q edge only) / (Q hub only - Q edge only),
beside the **hub token share** the policy actually spent:

(a) **teacher-forced next-token accuracy.** The prompt is a held-out prefix,
    the continuation the document's real next tokens. A position is the
    device's or the hub's by the policy (after a handoff, the rest of the
    turn is the hub's; a turn routed on its prompt is the hub's whole), and
    scores 1 when that model's argmax is the real token. It is exact (no
    sampling noise, no judge), it grades against the truth rather than
    against the hub, and it is the quantity the pair was trained on; its
    weakness is that teacher forcing is not what a live turn sees (the
    window scores come from the real tokens, not the device's own choices).
(b) **the hub model's log-likelihood of the generated continuation** (mean
    nats per token). The device writes greedily, the hub continues after the
    handoff from the prompt plus the device's tokens, exactly as a live turn
    splices; the hub model then scores the whole continuation. It grades
    what the user would read, on the live turn's own scores; its weakness is
    that it is the hub's opinion (hub-only output is its own favourite, so
    the measure favours the hub by construction).

Routers, each calibrated on calibration turns (other held-out documents)
and replayed one turn at a time on the test turns, adapting (``replay``):
``handoff/<score>`` (mid-turn only, on each window score), ``prompt`` (the
device's perplexity of the prompt only: whole turns), ``prompt+handoff``
(half of the budget each);
``random`` (whole turns at random up to the same token share, the mean of
many draws) and ``oracle`` (with hindsight: the (turn, handoff point) pairs
of best gain per hub token, greedily, one per turn, within the share; for
(b), whole turns by their gain, as only those continuations are computed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from edge_agent.language import (
    WINDOW_SCORES,
    HandoffPolicy,
    ScoreWindow,
    StepScore,
    TurnTrace,
    replay,
    uncertainty,
)

__all__ = [
    "accuracy_at",
    "gap_recovered",
    "gap_se",
    "oracle_positions",
    "random_positions",
    "routed_positions",
    "routers",
    "token_share",
    "trace_of",
]


def routers(score: str) -> dict[str, tuple[float, str]]:
    """The policies measured: name -> (prompt share, window score). A handoff on each
    window score, the prompt score alone, and half of the budget each (on ``score``)."""
    out = {f"handoff/{s}": (0.0, s) for s in WINDOW_SCORES}
    out["prompt"] = (1.0, score)
    out[f"prompt+handoff/{score}"] = (0.5, score)
    return out


def trace_of(
    steps: Sequence[StepScore], prompt: float | None, *, score: str, window: int
) -> TurnTrace:
    """A turn's ``TurnTrace`` as the live watch builds it: every token scored but the last
    (the stream ends a turn at its last token before the watch reads it)."""
    watch = ScoreWindow(window)
    values = []
    for step in steps[:-1]:
        watch.push(step)
        if watch.full:
            values.append(uncertainty(watch.stats(), score))
    return TurnTrace(len(steps), tuple(values), prompt)


def routed_positions(
    calibration: Sequence[TurnTrace],
    test: Sequence[TurnTrace],
    *,
    budget: float,
    prompt_share: float,
    unit: str = "tokens",
    score: str = "mean_logprob",
    window: int = 8,
    adapt: bool = True,
    refresh_every: int = 4,
    step: float = 0.05,
) -> tuple[list[int | None], float]:
    """Handoff points of ``test`` (0: routed on the prompt; None: kept on the device) under a
    policy calibrated on ``calibration``, and the share of ``unit`` it gave the hub."""
    policy = HandoffPolicy(
        score, window=window, budget=budget, unit=unit, prompt_share=prompt_share, adapt=adapt,
        refresh_every=refresh_every, step=step,
    )  # fmt: skip
    policy.calibrate_traces(calibration)
    positions = [replay(policy, trace) for trace in test]
    return positions, policy.realized_share or 0.0


def token_share(lengths: Sequence[int], positions: Sequence[int | None]) -> float:
    """The hub's share of the tokens: ``n - j`` of a turn of ``n`` handed off at ``j``."""
    hub = sum(n - j for n, j in zip(lengths, positions, strict=True) if j is not None)
    total = sum(lengths)
    return hub / total if total else 0.0


def accuracy_at(
    device_right: Sequence[np.ndarray],
    hub_right: Sequence[np.ndarray],
    positions: Sequence[int | None],
) -> float:
    """Teacher-forced accuracy when each turn's positions from its handoff on are the hub's."""
    right = total = 0
    for dev, hub, at in zip(device_right, hub_right, positions, strict=True):
        j = len(dev) if at is None else at
        right += int(dev[:j].sum()) + int(hub[j:].sum())
        total += len(dev)
    return right / total if total else math.nan


def gap_recovered(value: float, edge: float, hub: float) -> float:
    """(value - edge) / (hub - edge); NaN when the hub is no better than the edge."""
    return (value - edge) / (hub - edge) if hub > edge else math.nan


def gap_se(
    values: np.ndarray, edge: np.ndarray, hub: np.ndarray, *, draws: int = 200, seed: int = 0
) -> float:
    """Bootstrap standard error, over turns, of the gap recovered sum(values - edge) /
    sum(hub - edge) (per-turn quality under a policy, edge only and hub only); the turns
    are the sample, and resamples whose gap is not positive are left out."""
    v, e, h = (np.asarray(a, dtype=np.float64) for a in (values, edge, hub))
    if len(v) < 2:
        return math.nan
    index = np.random.default_rng(seed).integers(0, len(v), size=(draws, len(v)))
    num, den = (v - e)[index].sum(axis=1), (h - e)[index].sum(axis=1)
    ok = den > 0
    return float(np.std(num[ok] / den[ok], ddof=1)) if ok.sum() > 1 else math.nan


def random_positions(
    lengths: Sequence[int], share: float, rng: np.random.Generator
) -> list[int | None]:
    """Whole turns in a random order to the hub until ``share`` of the tokens would pass."""
    positions: list[int | None] = [None] * len(lengths)
    allowed = share * sum(lengths)
    used = 0
    for i in rng.permutation(len(lengths)):
        if used + lengths[i] > allowed:
            continue
        positions[i] = 0
        used += lengths[i]
    return positions


def oracle_positions(
    lengths: Sequence[int], gains: Callable[[int], np.ndarray], share: float
) -> list[int | None]:
    """With hindsight: ``gains(i)[j]`` is turn ``i``'s gain when the hub takes over at ``j``
    (``j`` in 0..n-1); the pairs of best gain per hub token, greedily, one per turn, while
    the hub's tokens stay within ``share``."""
    candidates = []
    for i, n in enumerate(lengths):
        gain = gains(i)
        for j in range(n):
            if gain[j] > 0:
                candidates.append((gain[j] / (n - j), i, j))
    candidates.sort(reverse=True)
    positions: list[int | None] = [None] * len(lengths)
    allowed, used = share * sum(lengths), 0
    for _, i, j in candidates:
        cost = lengths[i] - j
        if positions[i] is not None or used + cost > allowed:
            continue
        positions[i] = j
        used += cost
    return positions
