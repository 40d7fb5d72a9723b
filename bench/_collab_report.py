"""Part (a)'s result document: targets beside figures, tables, notes (see ``_report``)."""

from __future__ import annotations

import math
from typing import Any

from ._collab_drift import drift_table, drift_target
from ._collab_eval import BUILT_IN, CEILING, DEPLOYED, LEARNED, DatasetFigures

__all__ = ["result"]

TARGET_GAP = 0.85
TARGET_LEARNED_POINTS = 5.0
TARGET_RATE_POINTS = 2.0
_SWEEP_BUDGETS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30, 0.50, 1.0)


def result(
    figures: list[DatasetFigures],
    budget: float,
    *,
    plot: str,
    costs: list[dict[str, Any]],
    drift: dict[str, Any],
) -> dict[str, Any]:
    targets: list[dict[str, Any]] = []
    for f in figures:
        targets.append(_built_in_target(f))
        targets.append(_rate_target(f))
    targets.append(drift_target(drift))
    targets.append(_learned_target(figures))
    names = ", ".join(f.dataset.name for f in figures)
    return {
        "title": "(a) Collaboration quality",
        "summary": (
            f"{len(figures)} streams ({names}): three datasets that ship inside installed "
            "packages, each with its own weak edge and strong cloud model, plus the MNIST test "
            "digits rotated as a shifted stream. Routers at a 20% budget: the built-in scores "
            "(max_probability, margin, entropy) and the learned router (`LearnedScore`: "
            "logistic regression in numpy on features of the edge output and, for images, seven "
            "moments of the input, fitted on each split's calibration rows and out-of-fold "
            "training rows), against random and the oracle. "
            + " ".join(_one_line(f) for f in figures)
        ),
        "targets": targets,
        "tables": [
            _datasets_table(figures),
            _exact_table(figures),
            _learned_table(figures),
            _deployed_table(figures),
            drift_table(drift),
            _sweep_table(figures[0]),
            _cost_table(costs),
        ],
        "plots": [plot],
        "notes": _notes(figures, budget),
        "data": {
            "budget": budget,
            "datasets": [_data(f) for f in figures],
            "router_costs": costs,
            "drift": drift,
        },
    }


# -- targets ---------------------------------------------------------------------------------


def _built_in_target(f: DatasetFigures) -> dict[str, Any]:
    best = max(BUILT_IN, key=lambda s: f.deployed[s]["adapt"]["gap_recovered"])
    dep = f.deployed[best]["adapt"]
    exact_best = f.best_built_in
    met = dep["gap_recovered"] >= TARGET_GAP
    caught = f.exact[exact_best]["edge_errors_caught"]
    error_rate = f.counts["edge_errors"] / f.dataset.test_rows
    exact_gap = _pct(f.exact[exact_best]["gap_recovered"])
    limits = [
        f"the scores' ranking: the top 20% by {exact_best} holds {_pct(caught)} of the edge's "
        f"{f.counts['edge_errors']} errors (exact top 20%: {exact_gap}, oracle "
        f"{_pct(f.exact['oracle']['gap_recovered'])})",
        f"{f.counts['both_wrong']} rows are wrong on both sides and {f.counts['cloud_only_wrong']} "
        "right on the edge only, so offloading them gains nothing or loses",
    ]
    if error_rate > f.budget:
        limits.append(
            f"the edge errs on {_pct(error_rate)} of the rows, more than the budget: even the "
            "oracle cannot send them all"
        )
    if f.dataset.test_rows < 2000:
        limits.append(_noise(f))
    return {
        "name": f"{f.dataset.name}: gap recovered at a 20% budget, best built-in policy "
        f"({best}, calibrated threshold, adapt=True)",
        "target": f">= {TARGET_GAP:.0%}",
        "measured": f"{_pct(dep['gap_recovered'])} at {_pct(dep['offload_rate'])} offloaded "
        f"(exact top 20%: {exact_best} {_pct(f.exact[exact_best]['gap_recovered'])})",
        "met": met,
        "limited_by": None if met else "; ".join(limits),
    }


def _rate_target(f: DatasetFigures) -> dict[str, Any]:
    parts, misses = [], []
    for name in (*BUILT_IN, "learned"):
        rate = f.deployed[name]["adapt"]["offload_rate"]
        miss = (rate - f.budget) * 100.0
        misses.append(abs(miss))
        parts.append(f"{name} {_pct(rate)} ({miss:+.1f})")
    met = max(misses) <= TARGET_RATE_POINTS
    frozen = {n: f.deployed[n]["frozen"]["offload_rate"] for n in (*BUILT_IN, "learned")}
    per_split = f.dataset.test_rows / len(f.dataset.trials)
    return {
        "name": f"{f.dataset.name}: realized offload rate, calibrated threshold, adapt=True "
        "(the default), every built-in score and the learned router",
        "target": f"{f.budget:.0%} ± {TARGET_RATE_POINTS:.0f} points",
        "measured": ", ".join(parts),
        "met": met,
        "limited_by": None
        if met
        else (
            f"streams of {per_split:.0f} rows per split: the adapting level (its window "
            "seeded with the calibration scores, moved by 0.02 of each decision's error) has "
            "few decisions to correct a calibration split that misjudges the test rows; "
            "frozen thresholds realize " + ", ".join(f"{n} {_pct(r)}" for n, r in frozen.items())
        ),
    }


def _learned_target(figures: list[DatasetFigures]) -> dict[str, Any]:
    mean, error, per_stream = _mean_points(figures, "learned")
    ceiling, ceiling_error, _ = _mean_points(figures, CEILING)
    met = mean >= TARGET_LEARNED_POINTS
    variants = ", ".join(
        f"{name.removeprefix('learned ')} {_mean_points(figures, name)[0]:+.1f}"
        for name in LEARNED
        if name != "learned"
    )
    row_values = [_row_points(f) for f in figures]
    row_points = f"{min(row_values):.1f} to {max(row_values):.1f}"
    rows = ", ".join(
        f"{f.dataset.name} {_router_rows(f)}" for f in figures if f.dataset.trials[0].folds
    )
    return {
        "name": "learned router over the best built-in score, exact top 20%, mean over the "
        f"{len(figures)} streams (± 1 standard error)",
        "target": f">= +{TARGET_LEARNED_POINTS:.0f} points of gap",
        "measured": f"{mean:+.1f} ± {error:.1f} points ("
        + ", ".join(f"{n} {d:+.1f}" for n, d in per_stream.items())
        + ")",
        "met": met,
        "limited_by": None
        if met
        else (
            "what the edge output (and a digit's shape) can tell: the same recipe fitted on "
            f"the test rows it then ranks (optimistic: no router sees those labels) reaches "
            f"{ceiling:+.1f} ± {ceiling_error:.1f} points, under the target too: the best score "
            "already ranks close to what these features allow, and the oracle's lead is rows "
            "the edge gets confidently wrong or the cloud gets wrong, which they do not show. "
            "Within that, the measurement cannot resolve a few points: one row of the gap is "
            f"worth {row_points} points, so the mean's standard error is ±{error:.1f}. Rows "
            "decide the most: without the out-of-fold training rows "
            f"({rows} rows per split with the calibration ones) the router falls to "
            f"{_mean_points(figures, 'learned (calibration rows only)')[0]:+.1f}; the "
            f"variants measure {variants}. {_moments_effect(figures)} A router needs "
            "information the scores lack to do better: the edge model's hidden features, or "
            "many more "
            "labelled rows (the fleet's offloaded samples, `update`)"
        ),
    }


def _moments_effect(figures: list[DatasetFigures]) -> str:
    """What the image moments did: the router with them minus the one without, per stream."""
    images = [f for f in figures if f.dataset.trials[0].inputs_test is not None]
    if not images:
        return ""
    effect = {
        f.dataset.name: f.paired_points("learned", "learned (outputs only)")[0] for f in images
    }
    worst = min(images, key=lambda f: effect[f.dataset.name]).dataset
    return (
        "The image moments moved the image streams by "
        + ", ".join(f"{n} {d:+.1f}" for n, d in effect.items())
        + f" points; on {worst.name} the most"
        + (
            ", whose digits are shaped as no calibration digit is: input features expose a "
            "router to a shifted input."
            if worst.shifted
            else "."
        )
    )


def _mean_points(figures: list[DatasetFigures], name: str) -> tuple[float, float, dict[str, float]]:
    """Router ``name`` over each stream's best built-in score: mean, its error, per stream."""
    paired = {f.dataset.name: f.paired_points(name, f.best_built_in) for f in figures}
    mean = sum(p[0] for p in paired.values()) / len(paired)
    error = math.sqrt(sum(p[1] ** 2 for p in paired.values())) / len(paired)
    return mean, error, {n: p[0] for n, p in paired.items()}


def _router_rows(f: DatasetFigures) -> int:
    trial = f.dataset.trials[0]
    return len(trial.labels_cal) + (len(trial.folds.labels) if trial.folds else 0)


# -- tables ----------------------------------------------------------------------------------


def _datasets_table(figures: list[DatasetFigures]) -> dict[str, Any]:
    rows = []
    for f in figures:
        d = f.dataset
        rows.append(
            [
                d.name,
                d.ships_in,
                d.edge,
                d.cloud,
                str(len(d.trials)),
                str(d.calibration_rows),
                str(d.test_rows),
                _pct(f.edge_accuracy),
                _pct(f.cloud_accuracy),
                _pct(f.exact["oracle"]["gap_recovered"]),
            ]
        )
    return {
        "title": "Streams and model pairs (test and calibration rows summed over splits)",
        "columns": [
            "stream",
            "ships in",
            "edge model",
            "cloud model",
            "splits",
            "calibration rows",
            "test rows",
            "edge only",
            "cloud only",
            "oracle at 20%",
        ],
        "rows": rows,
    }


def _exact_table(figures: list[DatasetFigures]) -> dict[str, Any]:
    routers = [*BUILT_IN, *LEARNED, CEILING, "random", "oracle"]
    rows = []
    for name in routers:
        row = [name]
        for f in figures:
            e = f.exact[name]
            row.append(f"{_pct(e['gap_recovered'])} ({_pct(e['edge_errors_caught'])})")
        rows.append(row)
    return {
        "title": "Gap recovered at a 20% budget, exact top 20% of each split "
        "(in brackets: share of the edge's errors inside that 20%)",
        "columns": ["router", *(f.dataset.name for f in figures)],
        "rows": rows,
    }


def _deployed_table(figures: list[DatasetFigures]) -> dict[str, Any]:
    rows = []
    for name in DEPLOYED:
        for mode in ("frozen", "adapt"):
            row = [name, mode]
            for f in figures:
                d = f.deployed[name][mode]
                row.append(f"{_pct(d['offload_rate'])} · {_pct(d['gap_recovered'])}")
            rows.append(row)
    return {
        "title": "Deployed: threshold calibrated on the calibration rows, test rows decided one "
        "at a time in order (offload rate · gap recovered)",
        "columns": ["router", "threshold", *(f.dataset.name for f in figures)],
        "rows": rows,
    }


def _learned_table(figures: list[DatasetFigures]) -> dict[str, Any]:
    rows = []
    for name in (*LEARNED, CEILING):
        row = [name]
        for f in figures:
            points, error = f.paired_points(name, f.best_built_in)
            row.append(f"{points:+.1f} ± {error:.1f}")
        row.append("{:+.1f} ± {:.1f}".format(*_mean_points(figures, name)[:2]))
        rows.append(row)
    return {
        "title": "Learned routers over each stream's best built-in score, exact top 20% (points "
        "of gap ± 1 standard error, paired on the test rows)",
        "columns": ["router", *(f.dataset.name for f in figures), "mean"],
        "rows": rows,
    }


def _cost_table(costs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "title": "What a score costs on the device: one MNIST row, median of 7 runs of 2,000 "
        "calls (µs per call)",
        "columns": ["score", "score call", "UncertainCheck.scores", "weights", "JSON bytes"],
        "rows": [
            [
                c["score"],
                f"{c['call_us']:.1f}",
                f"{c['check_us']:.1f}",
                str(c["weights"]) if c["weights"] else "—",
                str(c["json_bytes"]) if c["json_bytes"] else "—",
            ]
            for c in costs
        ],
    }


def _sweep_table(f: DatasetFigures) -> dict[str, Any]:
    n = len(f.dataset.trials[0].labels_test)
    rows = [
        [f"{b:.0%}", *(_pct(float(c[round(b * n)])) for c in f.curves.values())]
        for b in _SWEEP_BUDGETS
    ]
    return {
        "title": f"{f.dataset.name}: accuracy against offload budget (offline sweep)",
        "columns": ["budget", *f.curves],
        "rows": rows,
    }


# -- words -----------------------------------------------------------------------------------


def _one_line(f: DatasetFigures) -> str:
    return (
        f"{f.dataset.name}: edge {_pct(f.edge_accuracy)}, cloud {_pct(f.cloud_accuracy)} "
        f"({f.dataset.test_rows} test rows)."
    )


def _noise(f: DatasetFigures) -> str:
    gap_rows = f.gap * f.dataset.test_rows
    return (
        f"sampling noise: the gap is {gap_rows:.0f} rows over {f.dataset.test_rows}, so one row "
        f"moves the figure by {_row_points(f):.1f} points"
    )


def _row_points(f: DatasetFigures) -> float:
    """Points of gap recovered that one test row is worth."""
    return 100.0 / max(f.gap * f.dataset.test_rows, 1.0)


def _notes(figures: list[DatasetFigures], budget: float) -> list[str]:
    return [
        "The model pairs were fixed before any router ran on them (edge: a small model of the "
        "kind a device runs; cloud: a clearly stronger one); no router was tuned on these sets. "
        "The scikit-learn sets are split several times (50% train / 20% calibration / 30% "
        "test, stratified) and every figure pools the test rows of all splits.",
        "The learned router (`bench/_collab_routers.py`), one recipe for every stream, fixed "
        "on development streams (other seeds) before it ran on these: `LearnedScore.fit` on "
        "each split's calibration rows plus out-of-fold outputs on its training rows (the edge "
        "recipe refitted on four fifths, run on the fifth; the test rows never), features "
        "`ranked` (1 - top probability, 1 - margin, normalized entropy, log(top1 / top2), the "
        "top five log-probabilities, the winning and the runner-up class) plus, for the image "
        "streams, seven moments of the input; target 'the edge is wrong and the cloud right' "
        "(`gain`); L2 by five-fold cross-validation inside those rows (chosen: "
        + "; ".join(f"{f.dataset.name} {_l2s(f)}" for f in figures)
        + "). Its threshold is calibrated to the budget on the calibration rows, as the "
        "scores' are. `learned (disagree)` is the label-free target ('the cloud's answer "
        "differs'); the other variants drop one part of the recipe.",
        "The ceiling row is not a router: the learned recipe fitted on the test rows it then "
        "ranks, an upper bound on what its features can tell apart there.",
        "`adapt=True` takes the threshold every 16 requests as the quantile, at a level u, of "
        "a 256-score window seeded with the calibration scores, and moves u by 0.02 x "
        "(budget - offloaded) after each decision (a stochastic-approximation quantile "
        "tracker: the realized share of any n decisions is the budget within "
        "(u_end - u_start) / (0.02 n)); `frozen` keeps the calibrated threshold. The rotated "
        "stream is calibrated on upright digits: it shows what adapting is for.",
        "Under drift (the table and target above): the adaptation before issue 21 (the "
        "quantile of a 1,000-score window re-taken every 32 requests, aimed off the budget by "
        "the share realized over that window) realized, on the same logits and schedule with "
        "margin, 18.6% / 26.3% / 16.7% (original / collect / drifted) at 20% and 34.6% for "
        "one device's drifted digits at 30%: it overshot while its window caught up, then paid "
        "the overshoot back. The demo's learning loop (part g) reported 16.9% for its "
        "drifted v1 phase at 20%.",
        "MNIST's plot: exact curves for every k, markers for the deployed, adapting policies.",
        "Sampling noise, 1 sd: "
        + "; ".join(
            f"{f.dataset.name} ±{math.sqrt(budget * (1 - budget) / f.dataset.test_rows) * 100:.1f}"
            " points on a 20% rate"
            for f in figures
        )
        + ".",
    ]


def _data(f: DatasetFigures) -> dict[str, Any]:
    return {
        "name": f.dataset.name,
        "ships_in": f.dataset.ships_in,
        "edge_model": f.dataset.edge,
        "cloud_model": f.dataset.cloud,
        "splits": len(f.dataset.trials),
        "test_rows": f.dataset.test_rows,
        "calibration_rows": f.dataset.calibration_rows,
        "edge_accuracy": f.edge_accuracy,
        "cloud_accuracy": f.cloud_accuracy,
        "counts": f.counts,
        "exact": f.exact,
        "deployed": f.deployed,
        "learned_over_best_built_in": {
            name: dict(
                zip(
                    ("points", "standard_error"),
                    f.paired_points(name, f.best_built_in),
                    strict=True,
                )
            )
            for name in (*LEARNED, CEILING)
        },
        "learned_l2": {name: [r.l2 for r in rs] for name, rs in f.routers.items()},
        "curves": {n: [round(float(v), 6) for v in c] for n, c in f.curves.items()},
    }


def _l2s(f: DatasetFigures) -> str:
    chosen = [r.l2 for r in f.routers["learned"]]
    return ", ".join(f"{v:g}" for v in sorted(set(c for c in chosen if c is not None)))


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:.1f}%"
