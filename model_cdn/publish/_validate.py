"""The publish gate: does the quantized model still decide like the float one?

Pure functions over output arrays; running the models is the pipeline's job.

- **agreement**: the fraction of held-out samples on which the quantized
  model's top class (argmax over the last axis) equals the float model's.
  This is the gate, because it needs no labels and measures exactly what
  quantization changed.
- **accuracy** / **float_accuracy**: against the labels, when given, so a
  reader of the manifest sees whether disagreements cost accuracy.
- **max_abs_diff**: the largest absolute difference between the two models'
  outputs, a scale for the smoke test's tolerance.

``check_agreement`` raises ``ValidationError`` below ``min_agreement``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import PublishError, ValidationError

__all__ = ["agreement_report", "check_agreement"]

_DIGITS = 6  # rounding in the report: JSON-friendly, far below any meaningful difference


def _top_class(outputs: np.ndarray) -> np.ndarray:
    flat = np.asarray(outputs).reshape(len(outputs), -1)
    return flat.argmax(axis=1)


def _labels(labels: np.ndarray, count: int) -> np.ndarray:
    """Class indices from integer labels ``[N]`` or one-hot/score rows ``[N, C]``."""
    labels = np.asarray(labels)
    if len(labels) < count:
        raise PublishError(f"{len(labels)} labels for {count} validation samples")
    labels = labels[:count]
    if labels.ndim > 1 and labels.reshape(count, -1).shape[1] > 1:
        return _top_class(labels)
    return labels.reshape(count).astype(np.int64)


def agreement_report(
    reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray | None = None
) -> dict[str, Any]:
    """Agreement, accuracies and output difference of ``candidate`` against ``reference``."""
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    if reference.shape != candidate.shape:
        raise PublishError(
            f"the models' outputs differ in shape: {list(reference.shape)} "
            f"vs {list(candidate.shape)}"
        )
    count = len(reference)
    if count == 0:
        raise PublishError("no validation samples")
    ref_top, cand_top = _top_class(reference), _top_class(candidate)
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    report: dict[str, Any] = {
        "agreement": round(float(np.mean(ref_top == cand_top)), _DIGITS),
        "accuracy": None,
        "float_accuracy": None,
        "max_abs_diff": round(float(np.nan_to_num(diff.max(), nan=np.inf)), _DIGITS),
        "samples": count,
    }
    if not np.isfinite(report["max_abs_diff"]):
        raise ValidationError("the quantized model produces NaN or infinite outputs")
    if labels is not None:
        truth = _labels(labels, count)
        report["accuracy"] = round(float(np.mean(cand_top == truth)), _DIGITS)
        report["float_accuracy"] = round(float(np.mean(ref_top == truth)), _DIGITS)
    return report


def check_agreement(report: dict[str, Any], min_agreement: float) -> None:
    if report["agreement"] < min_agreement:
        raise ValidationError(
            f"the quantized model agrees with the float one on {report['agreement']:.2%} of "
            f"{report['samples']} samples; at least {min_agreement:.2%} is required"
        )
