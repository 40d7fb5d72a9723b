"""What a refine job measured and decided, and the rule that decides (pure).

Both models, the version in service and the refined candidate, are judged
as devices would run them (quantized) on two held-out sets:

- **held-out examples**: a share of the collected examples the trainer never
  saw, with the cloud's answer as the reference (``held_out_agreement``:
  how often the model's top class is the cloud's), which measures what the
  refinement is for;
- **validation**: the original held-out data with its labels
  (``validation_accuracy``), which measures what it must not break.

``refusals`` says why a candidate must not be published, if it must not:
it does not beat the version in service on the held-out examples by at least
``min_gain``, or it loses more than ``max_forgetting`` of validation
accuracy. An empty list means publish.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ModelFigures", "RefineReport", "refusals"]


@dataclass(frozen=True)
class ModelFigures:
    label: str  # name@version, or "candidate"
    held_out_agreement: float
    validation_accuracy: float


def refusals(
    current: ModelFigures,
    candidate: ModelFigures,
    *,
    min_gain: float,
    max_forgetting: float,
    held_out: int,
    validation: int,
) -> list[str]:
    """Why ``candidate`` must not replace ``current`` (empty: it may)."""
    reasons = []
    gain = candidate.held_out_agreement - current.held_out_agreement
    if gain < min_gain:
        reasons.append(
            f"on {held_out} held-out collected examples it agrees with the cloud "
            f"{candidate.held_out_agreement:.2%} of the time, {current.label} "
            f"{current.held_out_agreement:.2%} ({gain * 100:+.2f} points; at least "
            f"{min_gain * 100:+.2f} needed)"
        )
    loss = current.validation_accuracy - candidate.validation_accuracy
    if loss > max_forgetting:
        reasons.append(
            f"on {validation} validation samples it is right {candidate.validation_accuracy:.2%} "
            f"of the time, {current.label} {current.validation_accuracy:.2%} ({loss * 100:.2f} "
            f"points lost; at most {max_forgetting * 100:.2f} allowed)"
        )
    return reasons


@dataclass
class RefineReport:
    """One run of ``tandem models refine``: the data, both models' figures, the outcome."""

    model: str
    current_version: int
    current: ModelFigures
    candidate: ModelFigures
    held_out: int
    validation: int
    min_gain: float
    max_forgetting: float
    refusals: list[str]
    trainer: str
    examples: dict[str, Any] = field(default_factory=dict)  # counts: used, by reason, devices
    version: int | None = None  # the version published; None when refused
    published: dict[str, Any] | None = None  # its manifest's blob and validation figures
    files: dict[str, str] = field(default_factory=dict)  # what the job wrote (--out)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["refused"] = self.refused
        return out
