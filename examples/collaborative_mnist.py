"""One edge agent, one hub, one broker: the SDK in thirty lines, on real MNIST digits.

Run it with ``.venv/bin/python examples/collaborative_mnist.py`` after ``make demo``
(or let it build the demo models itself, about half a minute on two cores).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from cloud_hub import Hub
from edge_agent import EdgeAgent, OffloadPolicy
from shared import MqttSettings
from tandem.broker import EmbeddedBroker
from tandem.demo.data import load_digit_splits
from tandem.demo.models import build_demo_models


def main(n: int = 300) -> dict[str, object]:
    models = build_demo_models()  # cached after the first run
    digits = load_digit_splits()
    with EmbeddedBroker() as broker:
        mqtt = MqttSettings.from_url(broker.url, protocol="3.1.1")
        # The hub answers with the big model; amqtt has no shared subscriptions.
        with Hub(models.hub_repository, mqtt=mqtt, share_group=None):
            policy = OffloadPolicy.budget(0.2, score="margin")  # offload the 20% least sure
            with EdgeAgent(
                models.edge_int8_onnx,
                device_id="example-device",
                broker=mqtt,
                cloud_model="mnist",
                policy=policy,
            ) as agent:
                agent.calibrate(digits.calibration_images)
                results = [
                    agent.infer(image[None], deadline_ms=250) for image in digits.test_images[:n]
                ]
    predictions = np.array([int(r.output.argmax()) for r in results])
    accuracy = float((predictions == digits.test_labels[:n]).mean())
    sources = Counter(r.source.value for r in results)
    print(f"accuracy {accuracy:.1%} over {n} digits; answered by {dict(sources)}")
    last = results[-1]
    print(f"last request: {last.source.value} ({last.reason}), {last.latency}")
    return {"accuracy": accuracy, "sources": dict(sources)}


if __name__ == "__main__":
    main()
