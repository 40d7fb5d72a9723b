"""Bench part i's speculative and handoff+budget targets and tables (pure, no I/O).

``spec_targets`` / ``spec_table``: the speculative row at each round trip
(``bench._text_collab_spec``'s figures) beside the crossover's prediction for
the same round trip. ``quality_targets`` / ``quality_tables``: the budget
work's measure (``bench._text_collab_measure.measure_text_collaboration``),
which replays the models' own steps and so is the same at every round trip:
it is run once and reported once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "NOT_RUN",
    "quality_tables",
    "quality_targets",
    "spec_notes",
    "spec_table",
    "spec_targets",
]

NOT_RUN = "not measured in this run"
SPEC_LOWER = 0.35
FORWARDS_PER_TOKEN = 0.5
GAP, SHARE, POINTS = 0.9, 0.30, 2.0
_SPLITS = {"heldout": "held-out", "longer_prompts": "longer prompts",
           "other_documents": "other documents"}  # fmt: skip
Results = Mapping[str, Mapping[str, Mapping[str, Any]]]


def _target(
    name: str, target: str, measured: str, met: bool | None, limited: str | None
) -> dict[str, Any]:
    return {"name": name, "target": target, "measured": measured, "met": met,
            "limited_by": limited}  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _change(lower: float | None) -> str:
    if lower is None:
        return "-"
    return f"{lower:.1%} lower" if lower >= 0 else f"{-lower:.1%} higher"


def _measured_spec(results: Results) -> dict[str, Mapping[str, Any]]:
    return {rtt: r for rtt, r in results["speculative"].items() if r.get("measured")}


def spec_targets(
    results: Results, crossover: Sequence[Mapping[str, Any]], p: float, quick: bool
) -> list[dict[str, Any]]:
    """The issue's three speculative targets, each beside its figure."""
    names = (
        ("speculative: greedy output identical to cloud-only", "every prompt"),
        ("speculative: end-to-end latency below cloud-only where the crossover says it wins",
         f">= {SPEC_LOWER:.0%} lower"),
        ("speculative: the hub's forward passes per generated token", f"<= {FORWARDS_PER_TOKEN}"),
    )  # fmt: skip
    spec = _measured_spec(results)
    if not spec:
        why = next(iter(results["speculative"].values()), {}).get("why", "no round trip run")
        return [_target(n, t, NOT_RUN, None, why) for n, t in names]
    same = [(rtt, r.get("identical"), r.get("prompts")) for rtt, r in spec.items()]
    all_same = all(i is not None and i == n for _, i, n in same)
    identical = _target(
        *names[0], ", ".join(f"{i}/{n} at {rtt} ms" for rtt, i, n in same), all_same,
        None if all_same else "the device's rewind after a rejected draft (see data: differs)",
    )  # fmt: skip
    wins = {f"{c['rtt_ms']:g}": c for c in crossover}
    parts, judged = [], []
    for rtt, r in spec.items():
        c = wins.get(rtt)
        said = "-" if c is None else ("predicted to win" if c["wins"] else "predicted to lose")
        parts.append(f"{rtt} ms: {_change(r.get('e2e_lower'))} ({said})")
        if c is not None and c["wins"] and r.get("e2e_lower") is not None:
            judged.append((rtt, float(r["e2e_lower"]), c))
    met: bool | None = all(lower >= SPEC_LOWER for _, lower, _ in judged) if judged else None
    if quick:
        met, why = None, "the tiny pair (quick mode)"
    elif not judged:
        why = "the crossover predicts no win at any round trip measured"
    elif met:
        why = None
    else:
        best = max(1 - c["predicted_s"] / c["hub_s"] for _, _, c in judged)
        why = (f"agreement p = {p:.3f}: a round yields at most 1/(1-p) = {1 / (1 - p):.2f} "
               f"tokens, so even the crossover's best case saves {best:.0%} a token")  # fmt: skip
    latency = _target(*names[1], "; ".join(parts), met, why)
    per = {rtt: r.get("forwards_per_token") for rtt, r in spec.items()}
    worst = max((v for v in per.values() if v is not None), default=None)
    fmet = None if worst is None or quick else worst <= FORWARDS_PER_TOKEN
    tpr = [r.get("tokens_per_round") for r in spec.values() if r.get("tokens_per_round")]
    fwhy = ("the tiny pair (quick mode)" if quick else None if fmet or worst is None else
            f"one forward a round at {min(tpr):.2f}-{max(tpr):.2f} tokens a round (agreement "
            f"p = {p:.3f}); <= 0.5 needs >= 2 tokens a round")  # fmt: skip
    forwards = _target(
        *names[2],
        ", ".join("-" if v is None else f"{v:.3f} at {rtt} ms" for rtt, v in per.items()),
        fmet, fwhy,
    )  # fmt: skip
    return [identical, latency, forwards]


def spec_notes(results: Results, p: float) -> list[str]:
    """What the measured acceptance says about the crossover's agreement-based prediction."""
    spec = _measured_spec(results)
    acc = [r["acceptance"] for r in spec.values() if r.get("acceptance") is not None]
    tpr = [r["tokens_per_round"] for r in spec.values() if r.get("tokens_per_round")]
    if not acc or not tpr:
        return []
    return [
        f"Speculative rounds accepted {min(acc):.1%}-{max(acc):.1%} of the drafts "
        f"({min(tpr):.1f}-{max(tpr):.1f} tokens a round) where the crossover was predicted "
        f"from the teacher-forced agreement p = {p:.3f} on real held-out text (at most "
        f"{1 / (1 - p):.2f} tokens a round): a greedy turn follows the hub's own "
        "continuation, which the distilled device matches far more often than it matches "
        "real text (the weak hub's greedy text repeats itself), so the agreement-based "
        "prediction is pessimistic here. The column 'formula's time/token' puts the "
        "measured tokens per round and mean k into the same formula. The hub's forward "
        "passes per token are rounds over tokens: its verifier runs one forward a round.",
        "Rejected drafts (rewound by the device) per round trip: "
        + ", ".join(
            f"{rtt} ms {r['drafted'] - r['accepted']} of {r['drafted']}" for rtt, r in spec.items()
        )
        + ": the identity with cloud_only holds across rejections, not only on rounds the "
        "hub accepted whole.",
    ]


def spec_table(
    results: Results, rtts: Sequence[float], crossover: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Per round trip: the measured speculative turns beside the crossover's prediction."""
    pred = {f"{c['rtt_ms']:g}": c for c in crossover}
    rows = []
    for rtt in rtts:
        key = f"{rtt:g}"
        r, cloud, c = results["speculative"][key], results["cloud_only"][key], pred.get(key)
        predicted = ["-", "-", "-"] if c is None else [
            "yes" if c["wins"] else "no", str(c["best_k"]),
            f"{_ms(c['predicted_s'])} ({_change(1 - c['predicted_s'] / c['hub_s'])})",
        ]  # fmt: skip
        if not r.get("measured"):
            rows.append([f"{rtt:g} ms", *predicted, f"{NOT_RUN}: {r.get('why')}"] + ["-"] * 10)
            continue
        k = r.get("k") or {}
        rows.append([
            f"{rtt:g} ms", *predicted, f"{r.get('identical', '-')}/{r.get('prompts', '-')}",
            _ms(cloud.get("e2e_s")), _ms(r.get("e2e_s")), _change(r.get("e2e_lower")),
            _ms(r.get("client_s_per_token")), _ms(_formula_s(rtt, r, c)),
            _num(r.get("forwards_per_token")),
            _num(r.get("acceptance")), _num(r.get("tokens_per_round"), 2),
            f"{k['median']:g} ({k['min']}-{k['max']})" if k else "-",
        ])  # fmt: skip
    return {"title": "Speculative decoding (the agent's adaptive DraftLength, drafting ahead) "
                     "beside the crossover's prediction, medians over the prompts",
            "columns": ["round trip", "predicted to win", "predicted best k",
                        "predicted time/token (vs the hub's h)", "identical to cloud_only",
                        "cloud_only end-to-end", "speculative end-to-end",
                        "speculative vs cloud_only", "speculative time/token (client)",
                        "formula's time/token at the measured tokens/round and mean k",
                        "hub forwards / token", "acceptance", "tokens / round",
                        "k chosen: median (min-max)"],
            "rows": rows}  # fmt: skip


def _pair(quick: bool) -> str:
    return "the tiny pair (quick mode)" if quick else "the default pair"


def _formula_s(rtt_ms: float, row: Mapping[str, Any], c: Mapping[str, Any] | None) -> float | None:
    """The crossover's (rtt + k d + h) / E with the measured E (tokens per round) and mean
    k (drafted per round) in place of the ones predicted from the agreement."""
    if c is None or not row.get("rounds") or not row.get("tokens_per_round"):
        return None
    k = row["drafted"] / row["rounds"]
    return float((rtt_ms / 1e3 + k * c["draft_s"] + c["hub_s"]) / row["tokens_per_round"])


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _gap(row: Mapping[str, Any]) -> str:
    se = row.get("gap_se")
    spread = "" if se is None or se != se else f" ±{se:.0%}"  # NaN: no spread
    gap = row.get("gap_recovered")
    return f"{'-' if gap is None or gap != gap else f'{gap:.1%}'}{spread}"


def quality_targets(quality: Mapping[str, Any] | None, quick: bool) -> list[dict[str, Any]]:
    """Gap recovered at a 30% hub token share (both measures) and the share vs the budget."""
    names = [
        ("handoff + budget: gap recovered, (a) teacher-forced next-token accuracy",
         f">= {GAP:.0%} with <= {SHARE:.0%} hub tokens"),
        ("handoff + budget: gap recovered, (b) the hub's log-likelihood of the continuation",
         f">= {GAP:.0%} with <= {SHARE:.0%} hub tokens"),
        ("handoff + budget: realized hub share against the budget (held-out and shifted)",
         f"within {POINTS:g} points"),
    ]  # fmt: skip
    if quality is None or "error" in quality:
        why = "the measure did not run" if quality is None else quality["error"]
        return [_target(n, t, NOT_RUN, None, why) for n, t in names]
    tiny = "the tiny pair (quick mode)" if quick else None
    out = []
    for (name, target), key in zip(names, ("accuracy", "hub_loglik"), strict=False):
        best, part = quality["target"][key], quality[key]
        oracle = next((v for k, v in part["routers"].items() if k.startswith("oracle")), [])
        at = [r for r in oracle if r["budget"] == quality["settings"]["budget"]]
        rand = [r for r in part["routers"].get("random", [])
                if r["budget"] == quality["settings"]["budget"]]  # fmt: skip
        measured = (f"{_gap(best)} ({best['router']}) at {best['hub_token_share']:.1%} hub "
                    f"tokens; edge only {part['edge']}, hub only {part['hub']}")  # fmt: skip
        if key == "accuracy":
            gap = 100 * (part["hub"] - part["edge"])
            why = (f"the default pair's accuracy gap is tiny ({gap:.2f}"
                   f" points over {part['positions']} positions): its bootstrap standard error "
                   "is larger than the figure")  # fmt: skip
        else:
            why = "the device's confidence signals do not find the turns where the hub helps"
        if rand:
            why += f"; random whole turns {_gap(rand[0])}"
        if at:
            why += f"; the oracle {_gap(at[0])} at {at[0]['hub_token_share']:.1%}"
        met = None if quick else bool(best["met"])
        out.append(_target(name, target, measured, met, tiny or (None if met else why)))
    out.append(_share_target(quality, *names[2], tiny))
    return out


def _share_target(
    quality: Mapping[str, Any], name: str, target: str, tiny: str | None
) -> dict[str, Any]:
    got = quality["budget_adherence"]
    parts, off = [], []
    for unit in ("tokens", "turns"):
        cells = []
        for split, label in _SPLITS.items():
            row = got.get(f"{split}/{unit}/adapt")
            if row is not None:
                cells.append(f"{label} {row['off_by_points']:+.2f}")
                off.append((f"{label}/{unit}", float(row["off_by_points"])))
        parts.append(f"{unit}: " + ", ".join(cells))
    budget = quality["settings"]["budget"]
    missed = [f"{n} {v:+.2f}" for n, v in off if abs(v) > POINTS]
    met = None if tiny or not off else not missed
    measured = f"points off a {budget:.0%} budget (adapting, the policy's defaults): " + "; ".join(
        parts
    )
    why = tiny or (None if met else f"off by more than {POINTS:g} points: {', '.join(missed)}")
    return _target(name, target, measured, met, why)


def quality_tables(quality: Mapping[str, Any] | None, quick: bool) -> list[dict[str, Any]]:
    """Gap recovered (hub token share) per router and budget, and the budget's adherence."""
    if quality is None or "error" in quality:
        return []
    budgets = sorted({r["budget"] for part in ("accuracy", "hub_loglik")
                      for rows in quality[part]["routers"].values() for r in rows})  # fmt: skip
    rows = []
    for part, label in (("accuracy", "(a) accuracy"), ("hub_loglik", "(b) hub log-likelihood")):
        for name, got in quality[part]["routers"].items():
            by = {r["budget"]: r for r in got}
            rows.append([label, name] + [
                "-" if b not in by else f"{_gap(by[b])} ({by[b]['hub_token_share']:.1%})"
                for b in budgets
            ])  # fmt: skip
    gaps = {"title": "Handoff + budget: the share of the edge-to-hub gap recovered (hub token "
                     f"share spent), by router and budget; {_pair(quick)}, measured once "
                     "(link-independent)",
            "columns": ["measure", "router", *(f"budget {b:.0%}" for b in budgets)],
            "rows": rows}  # fmt: skip
    adherence = quality["budget_adherence"]
    modes = ("adapt", "adapt-slow", "frozen")
    share_rows = []
    for split, label in _SPLITS.items():
        for unit in ("tokens", "turns"):
            cells = [adherence.get(f"{split}/{unit}/{m}") for m in modes]
            if all(c is None for c in cells):
                continue
            turns = next(c["turns"] for c in cells if c is not None)
            share_rows.append([label, unit, str(turns)] + [
                "-" if c is None else f"{c['share']:.2%} ({c['off_by_points']:+.2f})"
                for c in cells
            ])  # fmt: skip
    budget = quality["settings"]["budget"]
    shares = {"title": f"Handoff + budget: the realized hub share at a {budget:.0%} budget "
                       "(points off), calibrated on held-out turns (short prompts for 'longer "
                       "prompts') and run on the split named",
              "columns": ["run on", "unit", "turns", "adapting (every 4 turns, step 0.05)",
                          "adapting slowly (every 16, step 0.02)", "frozen"],
              "rows": share_rows}  # fmt: skip
    return [gaps, shares]
