"""Bench part i's speculative figures from its turns: pure arithmetic, no I/O.

``spec_figures(spec, cloud)`` takes the speculative row's summary (its
``turns``, each with the record's ``SpecStats`` as ``speculation``, and its
``texts``) and cloud-only's on the same link and prompts, and gives:

* ``identical`` / ``prompts``: prompts whose speculative text equals
  cloud-only's, character for character (both greedy), and ``differs`` (the
  prompt indices that do not);
* ``e2e_ratio``: the median speculative end-to-end over cloud-only's (so
  ``e2e_lower`` = 1 - ratio is the saving), and ``e2e_ratio_per_prompt``
  (the median of each prompt's own ratio);
* ``forwards_per_token``: the hub's forward passes per generated token; the
  hub's verifier runs exactly one forward per round it verifies
  (``cloud_hub.language``'s ``Verifier``), so it is rounds over tokens from
  the records (a resent round is a round, a forward);
* ``acceptance`` (accepted over drafted), ``tokens_per_round`` (accepted
  drafts plus the hub's own tokens, per round), ``k`` (median, min, max of
  the draft length the adaptive controller chose, over every round),
  ``round_ms`` (median of the rounds' send-to-verdict times at the device),
  and the totals (``rounds``, ``drafted``, ``accepted``, ``hub_tokens``,
  ``resent``, ``ahead_used``, ``alone_tokens``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

__all__ = ["TOTALS", "spec_figures"]

TOTALS = ("rounds", "drafted", "accepted", "hub_tokens", "resent", "ahead_used", "alone_tokens")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def spec_figures(spec: Mapping[str, Any], cloud: Mapping[str, Any] | None) -> dict[str, Any]:
    """The speculative row's figures against cloud-only's on the same link (see the module)."""
    stats = [t["speculation"] for t in spec["turns"] if t.get("speculation")]
    totals = {name: sum(int(s[name]) for s in stats) for name in TOTALS}
    tokens = sum(int(t["tokens"]) for t in spec["turns"])
    ks = [int(k) for s in stats for k in s["k"]]
    rtts = [float(r) for s in stats for r in s["rtt_ms"]]
    out: dict[str, Any] = {
        **totals,
        "turns_with_stats": len(stats),
        "forwards_per_token": _ratio(totals["rounds"], tokens),
        "acceptance": _ratio(totals["accepted"], totals["drafted"]),
        "tokens_per_round": _ratio(totals["accepted"] + totals["hub_tokens"], totals["rounds"]),
        "k": {"median": statistics.median(ks), "min": min(ks), "max": max(ks)} if ks else None,
        "round_ms": statistics.median(rtts) if rtts else None,
    }
    if cloud and cloud.get("measured"):
        texts, theirs = spec.get("texts", []), cloud.get("texts", [])
        if len(texts) != len(theirs):
            raise ValueError(f"{len(texts)} speculative texts against {len(theirs)} cloud-only")
        differs = [i for i, (a, b) in enumerate(zip(texts, theirs, strict=True)) if a != b]
        per = [_ratio(a["e2e_s"], b["e2e_s"]) for a, b in zip(spec["turns"], cloud["turns"],
                                                               strict=True)]  # fmt: skip
        ratio = _ratio(spec.get("e2e_s"), cloud.get("e2e_s"))
        out.update(
            identical=len(texts) - len(differs), prompts=len(texts), differs=differs,
            e2e_ratio=ratio, e2e_lower=None if ratio is None else 1.0 - ratio,
            e2e_ratio_per_prompt=statistics.median([p for p in per if p is not None])
            if any(p is not None for p in per) else None,
        )  # fmt: skip
    return out
