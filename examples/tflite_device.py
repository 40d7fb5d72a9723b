"""A TFLite device with a delegate: the model runs on what the device offers, else on XNNPACK.

``TFLiteRuntime(path, delegates=[...])`` (what ``load_runtime("model.tflite",
delegates=[...])`` builds) tries each delegate library
in order (an NPU, a GPU, an Edge TPU: whatever the device ships); one that
does not load, or refuses the model, is dropped and the model runs on the CPU
with the XNNPACK delegate that ai-edge-litert builds in (``xnnpack=True``,
the default). ``runtime.accelerator`` says what runs, ``fallback_reason``
why a delegate was dropped. A device must keep a working model, so a missing
delegate is a note, not an error.

The model: a softmax regression on the demo's MNIST digits (784 -> 10),
trained here and written as a .tflite (``_tflite_writer``; a real project
converts its model with ai-edge-torch or TensorFlow). It takes ``image``
FP32 [?, 1, 28, 28], like the hub's cloud CNN, so the same request goes
either way. Run: ``.venv/bin/python examples/tflite_device.py``.
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
from _local import CLOUD_MODEL, demo_data, local_broker, mnist_hub  # this folder's helpers
from _tflite_writer import write_dense_tflite

from edge_agent import EdgeAgent, OffloadPolicy
from edge_agent.runtimes import TFLiteRuntime

# Try the device's accelerator first. Here: the Edge TPU's library, which this machine lacks.
DELEGATES = ["libedgetpu.so.1"]


def train_softmax_regression(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, ...]:
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs may stop at max_iter: fine for a device model
        fit = LogisticRegression(C=0.1, max_iter=200).fit(images.reshape(len(images), -1), labels)
    return fit.coef_.T.astype(np.float32), fit.intercept_.astype(np.float32)


def main(broker_url: str | None = None, n: int = 300) -> dict[str, object]:
    models, digits = demo_data()
    weight, bias = train_softmax_regression(digits.train_images, digits.train_labels)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_dense_tflite(Path(tmp) / "mnist-softmax.tflite", weight, bias)
        runtime = TFLiteRuntime(path, name="mnist-softmax", version="1", delegates=DELEGATES)
        print(f"runs on: {runtime.accelerator}")
        if runtime.fallback_reason:
            print(f"why not the delegate: {runtime.fallback_reason}")
        with (
            local_broker(broker_url) as mqtt,
            mnist_hub(models, mqtt),
            EdgeAgent(
                runtime,
                device_id="tflite-1",
                broker=mqtt,
                cloud_model=CLOUD_MODEL,
                policy=OffloadPolicy.budget(0.2, score="margin"),
            ) as agent,
        ):
            agent.calibrate(digits.calibration_images)
            results = [
                agent.infer(image[None], deadline_ms=250) for image in digits.test_images[:n]
            ]
    answers = np.array([int(r.output.argmax()) for r in results])
    accuracy = float((answers == digits.test_labels[:n]).mean())
    sources = Counter(r.source.value for r in results)
    print(f"accuracy {accuracy:.1%} over {n} digits; answered by {dict(sources)}")
    return {
        "accuracy": accuracy,
        "sources": dict(sources),
        "accelerator": runtime.accelerator,
        "fallback_reason": runtime.fallback_reason,
    }


if __name__ == "__main__":
    main()
