"""The hub behind Triton's own client: ``tritonclient.http``, unchanged, against ``tandem hub``.

The hub speaks the Open Inference Protocol v2 (KServe's and Triton's REST
API) on its HTTP port, so a backend team keeps the client code it has. This
serves the demo's cloud CNN as ``mnist`` over HTTP only (``tandem hub --repo
… --http-port 8000`` does the same with MQTT beside it), then, as a backend
would: checks the server and model are ready, reads the model's metadata,
and classifies digits in batches with binary tensors (Triton's binary data
extension) and once with JSON tensors.

Run: ``.venv/bin/python examples/triton_client.py``.
"""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient
from _local import CLOUD_MODEL, demo_data, mnist_hub  # this folder's helpers

from cloud_hub.http import HttpServer, create_app


def classify(url: str, images: np.ndarray, *, batch: int = 32) -> tuple[np.ndarray, dict]:
    """Triton client code, as a backend team has it: ``url`` is ``host:port``."""
    client = httpclient.InferenceServerClient(url)
    try:
        if not (client.is_server_ready() and client.is_model_ready(CLOUD_MODEL)):
            raise RuntimeError(f"{CLOUD_MODEL} is not ready on {url}")
        metadata = client.get_model_metadata(CLOUD_MODEL)
        name = metadata["inputs"][0]["name"]
        answers = []
        for start in range(0, len(images), batch):
            x = np.ascontiguousarray(images[start : start + batch])
            tensor = httpclient.InferInput(name, list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            result = client.infer(CLOUD_MODEL, [tensor])
            answers.append(result.as_numpy(metadata["outputs"][0]["name"]).argmax(axis=1))
        one = httpclient.InferInput(name, [1, *images.shape[1:]], "FP32")
        one.set_data_from_numpy(np.ascontiguousarray(images[:1]), binary_data=False)  # JSON
        json_logits = client.infer(CLOUD_MODEL, [one]).as_numpy("logits")
        assert json_logits is not None and int(json_logits.argmax()) == int(answers[0][0])
    finally:
        client.close()
    return np.concatenate(answers), metadata


def main(n: int = 256) -> dict[str, object]:
    models, digits = demo_data()
    with mnist_hub(models, mqtt=None) as hub, HttpServer(create_app(hub), port=0) as server:
        answers, metadata = classify(server.url.removeprefix("http://"), digits.test_images[:n])
    accuracy = float((answers == digits.test_labels[:n]).mean())
    inputs = [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]]
    print(f"model {metadata['name']} takes {inputs}")
    print(f"tritonclient: accuracy {accuracy:.1%} over {n} digits, in batches of 32")
    return {"accuracy": accuracy, "inputs": inputs, "versions": metadata.get("versions")}


if __name__ == "__main__":
    main()
