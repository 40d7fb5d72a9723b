"""(a) Collaboration quality: how much of the edge-to-cloud accuracy gap a budget buys.

On the demo's real MNIST split with its INT8 edge / FP32 cloud pair, both
models run once over the calibration and test sets; everything else is
offline arithmetic on their logits (``tandem._sweep``), so the curves are
exact, not sampled. Two kinds of figure:

* the offline sweep offloads exactly the top-k test rows by score: what a
  score is worth when the threshold is perfect;
* the deployable figure calibrates the threshold on the calibration split
  (``UncertainCheck.calibrate``) and decides test rows one by one, frozen
  (``adapt=False``) or adapting while streaming the test set in order
  (``adapt=True``): what a device actually offloads and scores.

Gap recovered = (accuracy - edge-only) / (cloud-only - edge-only).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._report import RESULTS_DIR

__all__ = ["run"]

BUDGET = 0.2
TARGET_GAP = 0.90
TARGET_RATE_POINTS = 2.0
_TABLE_BUDGETS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.30, 0.50, 1.0)
_PLOT = "collaboration_accuracy_vs_offload.png"


def run() -> dict[str, Any]:
    import onnxruntime as ort

    from edge_agent import SCORES, UncertainCheck, to_probabilities
    from tandem._data import load_digit_splits
    from tandem._plot import plot_accuracy_vs_offload
    from tandem._sweep import sweep
    from tandem._training import build_demo_models

    models = build_demo_models()
    recipe = models.report.get("recipe", {})
    splits = load_digit_splits(
        train=recipe.get("train_size", 3000),
        calibration=recipe.get("calibration_size", 500),
        test=recipe.get("test_size", 1500),
        seed=recipe.get("split_seed", 0),
    )

    def logits(path: Any, images: np.ndarray) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return np.asarray(session.run(None, {name: np.ascontiguousarray(images)})[0])

    edge_cal = logits(models.edge_int8_onnx, splits.calibration_images)
    cal_acc = float((edge_cal.argmax(1) == splits.calibration_labels).mean())
    edge_test = logits(models.edge_int8_onnx, splits.test_images)
    cloud_test = logits(models.cloud_onnx, splits.test_images)
    labels = splits.test_labels
    n = len(labels)
    edge_right = edge_test.argmax(1) == labels
    cloud_right = cloud_test.argmax(1) == labels
    edge_acc, cloud_acc = float(edge_right.mean()), float(cloud_right.mean())
    gap = cloud_acc - edge_acc

    curves = sweep(edge_test, cloud_test, labels)
    k = round(BUDGET * n)

    def share(accuracy: float) -> float:
        return (accuracy - edge_acc) / gap if gap > 0 else math.nan

    probs = to_probabilities(edge_test, "logits")
    offline: dict[str, dict[str, float]] = {}
    for name, curve in curves.items():
        row = {"accuracy": float(curve[k]), "gap_recovered": share(float(curve[k]))}
        if name in SCORES:
            # Of the edge's mistakes, how many the score puts in the offloaded top 20%.
            top = np.argsort(-SCORES[name](probs), kind="stable")[:k]
            row["edge_errors_caught"] = float(
                (~edge_right[top]).sum() / max((~edge_right).sum(), 1)
            )
        offline[name] = row

    deployed: dict[str, dict[str, dict[str, float]]] = {}
    for name in SCORES:
        deployed[name] = {}
        for adapt in (False, True):
            check = UncertainCheck(name, budget=BUDGET, adapt=adapt, outputs="logits")
            threshold = check.calibrate(edge_cal)
            offloaded = np.array(
                [
                    check.decide(check.scores(edge_test[i : i + 1])).route.value == "cloud"
                    for i in range(n)
                ]
            )
            accuracy = float(np.where(offloaded, cloud_right, edge_right).mean())
            deployed[name]["adapt" if adapt else "frozen"] = {
                "calibrated_threshold": float(threshold),
                "final_threshold": float(check.threshold),
                "offload_rate": float(offloaded.mean()),
                "accuracy": accuracy,
                "gap_recovered": share(accuracy),
            }

    plot_accuracy_vs_offload(
        curves,
        [
            ("edge only", 0.0, edge_acc),
            ("cloud only", 1.0, cloud_acc),
            (
                "margin, frozen threshold",
                deployed["margin"]["frozen"]["offload_rate"],
                deployed["margin"]["frozen"]["accuracy"],
            ),
            (
                "margin, adapting threshold",
                deployed["margin"]["adapt"]["offload_rate"],
                deployed["margin"]["adapt"]["accuracy"],
            ),
        ],
        RESULTS_DIR / _PLOT,
        budget=BUDGET,
        title="Accuracy against offload rate (demo MNIST test split, INT8 edge + cloud CNN)",
    )
    return _result(
        edge_acc,
        cloud_acc,
        cal_acc,
        n,
        len(edge_cal),
        curves,
        offline,
        deployed,
        edge_right,
        cloud_right,
    )


def _result(
    edge_acc: float,
    cloud_acc: float,
    cal_acc: float,
    n: int,
    n_cal: int,
    curves: dict[str, np.ndarray],
    offline: dict[str, dict[str, float]],
    deployed: dict[str, dict[str, dict[str, float]]],
    edge_right: np.ndarray,
    cloud_right: np.ndarray,
) -> dict[str, Any]:
    pct = _pct
    scores = [s for s in offline if s not in ("random", "oracle")]
    best = max(scores, key=lambda s: offline[s]["gap_recovered"])
    oracle_share = offline["oracle"]["gap_recovered"]
    edge_errors = int((~edge_right).sum())
    both_wrong = int((~edge_right & ~cloud_right).sum())
    cloud_only_wrong = int((edge_right & ~cloud_right).sum())
    fixable = int((~edge_right & cloud_right).sum())
    # Sampling noise of a 20% quantile: the threshold is estimated on n_cal rows, the rate
    # is then counted on n rows; independent, so their variances add.
    rate_sd = math.sqrt(BUDGET * (1 - BUDGET) * (1 / n_cal + 1 / n)) * 100

    targets = []
    picks = [("default score (margin)", "margin")]
    if offline[best]["gap_recovered"] > offline["margin"]["gap_recovered"]:
        picks.append((f"best score ({best})", best))
    for label, name in picks:
        got = offline[name]
        met = got["gap_recovered"] >= TARGET_GAP
        targets.append(
            {
                "name": f"gap recovered at a 20% budget, {label}, exact top-20%",
                "target": f">= {TARGET_GAP:.0%}",
                "measured": f"{pct(got['gap_recovered'])} (oracle {pct(oracle_share)})",
                "met": met,
                "limited_by": None
                if met
                else (
                    f"the score's ranking: its top 20% holds {pct(got['edge_errors_caught'])} of "
                    f"the edge's {edge_errors} errors; {cloud_only_wrong} offloads the cloud gets "
                    "wrong while the edge was right cost back what they take"
                ),
            }
        )
        dep = deployed[name]["frozen"]
        met = dep["gap_recovered"] >= TARGET_GAP
        targets.append(
            {
                "name": f"gap recovered at a 20% budget, {label}, calibrated threshold",
                "target": f">= {TARGET_GAP:.0%}",
                "measured": f"{pct(dep['gap_recovered'])} at {pct(dep['offload_rate'])} offloaded",
                "met": met,
                "limited_by": None
                if met
                else ("the ranking (as above) and the realized offload rate differing from 20%"),
            }
        )
    for mode, label in (("frozen", "adapt=False"), ("adapt", "adapt=True, streamed in order")):
        for name in scores:
            rate = deployed[name][mode]["offload_rate"]
            miss = (rate - BUDGET) * 100
            met = abs(miss) <= TARGET_RATE_POINTS
            targets.append(
                {
                    "name": f"realized offload rate, {name}, {label}",
                    "target": f"{BUDGET:.0%} ± {TARGET_RATE_POINTS:.0f} points",
                    "measured": f"{pct(rate)} ({miss:+.1f} points)",
                    "met": met,
                    "limited_by": None
                    if met
                    else (
                        f"calibration on {n_cal} rows: the 20% quantile's sampling noise alone is "
                        f"±{rate_sd:.1f} points (1 sd) at these sizes, and the edge is surer on "
                        f"that split ({pct(cal_acc)} right vs {pct(edge_acc)} on test); "
                        "fix: calibrate on more rows, or adapt=True (below)"
                        + (
                            ""
                            if mode == "frozen"
                            else "; the adaptive window starts from the "
                            "calibration scores and corrects only every 32 requests"
                        )
                    ),
                }
            )

    sweep_rows = []
    for b in _TABLE_BUDGETS:
        idx = round(b * n)
        sweep_rows.append([f"{b:.0%}", *(pct(float(curves[c][idx])) for c in curves)])
    at_budget = [
        [
            name,
            pct(o["accuracy"]),
            pct(o["gap_recovered"]),
            pct(o["edge_errors_caught"]) if "edge_errors_caught" in o else "—",
        ]
        for name, o in offline.items()
    ]
    deployed_rows = [
        [
            name,
            mode,
            f"{d['calibrated_threshold']:.4f}",
            pct(d["offload_rate"]),
            pct(d["accuracy"]),
            pct(d["gap_recovered"]),
        ]
        for name, modes in deployed.items()
        for mode, d in modes.items()
    ]
    return {
        "title": "(a) Collaboration quality",
        "summary": (
            f"Demo MNIST split ({n} test, {n_cal} calibration digits), INT8 edge CNN vs cloud "
            f"CNN, both run with onnxruntime. Edge only {pct(edge_acc)}, cloud only "
            f"{pct(cloud_acc)}: a gap of {(cloud_acc - edge_acc) * 100:.2f} points. Of the "
            f"edge's {edge_errors} errors the cloud fixes {fixable}; {both_wrong} are wrong on "
            f"both; the cloud errs on {cloud_only_wrong} digits the edge gets right, so the "
            f"oracle (offload exactly what the edge gets wrong) ends above cloud only."
        ),
        "targets": targets,
        "tables": [
            {
                "title": "Accuracy at a 20% budget (offline sweep, exact top-20% of the test set)",
                "columns": ["router", "accuracy", "gap recovered", "edge errors in the top 20%"],
                "rows": at_budget,
            },
            {
                "title": "Deployable: threshold calibrated on the calibration split, "
                "test rows decided one at a time, in order",
                "columns": [
                    "score",
                    "threshold mode",
                    "threshold from calibration",
                    "offload rate",
                    "accuracy",
                    "gap recovered",
                ],
                "rows": deployed_rows,
            },
            {
                "title": "Accuracy against offload budget (offline sweep)",
                "columns": ["budget", *curves],
                "rows": sweep_rows,
            },
        ],
        "plots": [_PLOT],
        "notes": [
            "Edge-only and cloud-only are the sweep's 0% and 100% ends; the curves in the plot "
            "are exact (every k), the markers are the calibrated-threshold runs with margin.",
            "`adapt=True` re-aims its threshold every 32 requests from a 1,000-score window "
            "seeded with the calibration scores, feeding back the realized share.",
            "One split and one model pair: the figures carry sampling noise of about "
            f"±{math.sqrt(BUDGET * (1 - BUDGET) / n) * 100:.1f} points on any 20% rate and "
            f"±{math.sqrt(edge_acc * (1 - edge_acc) / n) * 100:.2f} points on accuracy (1 sd).",
        ],
        "data": {
            "budget": BUDGET,
            "test_size": n,
            "calibration_size": n_cal,
            "edge_accuracy": edge_acc,
            "cloud_accuracy": cloud_acc,
            "edge_accuracy_calibration_split": cal_acc,
            "offline_at_budget": offline,
            "deployed": deployed,
            "curves": {name: [round(float(v), 6) for v in c] for name, c in curves.items()},
        },
    }


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:.1f}%"
