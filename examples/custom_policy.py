"""Your own uncertainty score and your own heavy-request rule, in one offload policy.

* **The score** (after the local run): a meter-reading app where some
  confusions cost more than others. It starts from the margin (top
  probability minus the runner-up) and adds a penalty when the top two
  classes are a pair this model is known to mix up. Any callable from
  probability rows [n, classes] to scores [n] (higher: less sure) works;
  the budget is calibrated on it like on the built-in scores.
* **The heavy rules** (before the local run): a batch of more than four
  images goes to the cloud whole (``HeavyCheck(max_input_bytes=...)``,
  built in), and a background job (a deadline of a second or more) always
  gets the cloud's bigger model: a ``HeavyCheck`` subclass with one more rule.

Run: ``.venv/bin/python examples/custom_policy.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from _local import CLOUD_MODEL, demo_data, local_broker, mnist_hub  # this folder's helpers

from edge_agent import (
    Decision,
    EdgeAgent,
    HeavyCheck,
    LatencyEstimator,
    NetworkEstimator,
    OffloadPolicy,
    RequestFacts,
    Route,
    UncertainCheck,
)

IMAGE_BYTES = 28 * 28 * 4  # one FP32 digit
CONFUSABLE = {(4, 9), (3, 5), (1, 7), (3, 8), (5, 8)}  # pairs this edge model mixes up


def confusable_margin(probs: np.ndarray) -> np.ndarray:
    """1 - margin, plus 0.5 when the top two classes are a known confusable pair."""
    order = np.argsort(-probs, axis=1)
    rows = np.arange(len(probs))
    top, second = order[:, 0], order[:, 1]
    score = 1.0 - (probs[rows, top] - probs[rows, second])
    pairs = zip(np.minimum(top, second).tolist(), np.maximum(top, second).tolist(), strict=True)
    return score + 0.5 * np.array([pair in CONFUSABLE for pair in pairs])


@dataclass(frozen=True, kw_only=True)
class BackgroundJobsToCloud(HeavyCheck):
    """The built-in heavy rules, plus: a request with a long deadline goes to the cloud."""

    background_deadline_ms: float = 1000.0

    def check(
        self, facts: RequestFacts, local: LatencyEstimator, network: NetworkEstimator
    ) -> Decision | None:
        if facts.deadline_ms is not None and facts.deadline_ms >= self.background_deadline_ms:
            return Decision(Route.CLOUD, "heavy:background")
        return super().check(facts, local, network)


def main(broker_url: str | None = None, n: int = 200) -> dict[str, object]:
    models, digits = demo_data()
    policy = OffloadPolicy(
        heavy=BackgroundJobsToCloud(max_input_bytes=4 * IMAGE_BYTES),
        uncertain=UncertainCheck(confusable_margin, budget=0.2, outputs="logits"),
    )
    images, labels = digits.test_images, digits.test_labels
    with (
        local_broker(broker_url) as mqtt,
        mnist_hub(models, mqtt),
        EdgeAgent(
            models.edge_int8_onnx,
            device_id="meter-1",
            broker=mqtt,
            cloud_model=CLOUD_MODEL,
            policy=policy,
        ) as agent,
    ):
        agent.calibrate(digits.calibration_images)
        interactive = [agent.infer(image[None], deadline_ms=250) for image in images[:n]]
        batch = agent.infer(images[n : n + 16], deadline_ms=250)  # 16 digits at once: heavy
        background = agent.infer(images[n + 16 : n + 17], deadline_ms=5000)
    right = np.array([int(r.output.argmax()) for r in interactive]) == labels[:n]
    reasons = Counter(r.reason for r in interactive)
    print(f"interactive: accuracy {right.mean():.1%}; why: {dict(reasons)}")
    print(f"a batch of 16: {batch.source.value} ({batch.reason})")
    print(f"a background job: {background.source.value} ({background.reason})")
    return {
        "accuracy": float(right.mean()),
        "reasons": dict(reasons),
        "batch": (batch.source.value, batch.reason, batch.output.shape[0]),
        "background": (background.source.value, background.reason),
        "score": policy.uncertain.score_name if policy.uncertain else None,
    }


if __name__ == "__main__":
    main()
