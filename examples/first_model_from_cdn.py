"""A fresh device: no model yet, cloud-only until its updater installs the first one from the CDN.

The operator's side (what ``tandem models publish`` / ``models assign`` and
``tandem cdn serve`` do, here in process): publish the demo's float edge
model (INT8 quantization, validation, zstd, a signed manifest) into a
registry and blob store, assign it to ``cam-7``, serve the CDN's HTTP API.

The device's side, as the README shows it:

1. ``ModelUpdater.bootstrap(store, keys, model)`` returns ``None``: nothing
   is installed yet;
2. so the agent starts without a local model (``EdgeAgent(None, ...)``, with
   ``cloud_model`` and ``input_name``): every request goes to the hub;
3. ``ModelUpdater.start()`` fetches the signed assignment and manifest,
   checks them against the pinned key, downloads the blob, checks its
   digest, runs the smoke test, stores it atomically and swaps it into the
   agent;
4. from the next request on, the device answers locally and offloads only
   its least sure 20% (calibrated once the model is there).

Run: ``.venv/bin/python examples/first_model_from_cdn.py``.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from _local import CLOUD_MODEL, demo_data, local_broker, mnist_hub  # this folder's helpers

from cloud_hub.http import HttpServer
from edge_agent import EdgeAgent, ModelUpdater, OffloadPolicy
from model_cdn import LocalBlobStore, create_app, make_assignment, open_registry, publish_model
from model_cdn.registry import Registry
from shared import SigningKey

EDGE_MODEL = "mnist-edge"
DEVICE = "cam-7"


def publish_and_assign(workdir: Path, key: SigningKey) -> tuple[Registry, LocalBlobStore, int]:
    """The operator: publish the float edge model (quantized, validated, signed), assign it."""
    models, digits = demo_data()
    registry = open_registry(f"sqlite:///{workdir / 'registry.db'}")
    store = LocalBlobStore(workdir / "blobs")
    published = publish_model(
        models.edge_float_onnx,
        name=EDGE_MODEL,
        registry=registry,
        store=store,
        signing_key=key,
        quantize="int8-static",
        calibration=digits.calibration_images,
        validation=(digits.test_images, digits.test_labels),
    )
    version = published.manifest.version
    assignment = make_assignment(key, device=DEVICE, model=EDGE_MODEL, version=version)
    registry.put_assignment(DEVICE, EDGE_MODEL, assignment)
    return registry, store, version


def main(broker_url: str | None = None, n: int = 100) -> dict[str, object]:
    models, digits = demo_data()
    key = SigningKey.generate()  # the publisher's key; devices pin its public half
    trusted = [key.public_key]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        registry, store, version = publish_and_assign(workdir, key)
        cdn_app = create_app(registry=registry, store=store, admin_token=None)
        with (
            local_broker(broker_url) as mqtt,
            mnist_hub(models, mqtt),
            HttpServer(cdn_app, port=0) as cdn,
        ):
            # ---- the device ----
            device_store = workdir / "device-models"
            runtime = ModelUpdater.bootstrap(device_store, trusted, EDGE_MODEL)
            assert runtime is None  # a fresh device: nothing installed
            agent = EdgeAgent(
                runtime,  # None: cloud-only until the first install
                device_id=DEVICE,
                broker=mqtt,
                cloud_model=CLOUD_MODEL,
                input_name="image",  # with no local model, the agent cannot read it off one
                policy=OffloadPolicy.budget(0.2, score="margin"),
            )
            updater = ModelUpdater(
                agent,
                model=EDGE_MODEL,
                device_id=DEVICE,
                cdn_url=cdn.url,
                trusted_keys=trusted,
                store_dir=device_store,
            )
            with agent:
                waiting = [agent.infer(im[None], deadline_ms=2000) for im in digits.test_images[:n]]
                with updater:  # fetches, verifies, installs and swaps in the assigned version
                    deadline = time.monotonic() + 60
                    while updater.running_version != version and time.monotonic() < deadline:
                        time.sleep(0.05)
                installed = agent.runtime
                assert installed is not None, updater.status
                agent.calibrate(digits.calibration_images)  # the budget, on the model it got
                serving = [agent.infer(im[None], deadline_ms=2000) for im in digits.test_images[:n]]
        registry.close()
    before = Counter(r.reason for r in waiting)
    after = Counter(r.source.value for r in serving)
    print(f"before the install: {dict(before)}")
    print(f"installed {EDGE_MODEL}@{version} ({installed.kind} on {installed.accelerator})")
    print(f"after: {dict(after)}; edge model {serving[-1].model_versions.get('edge')}")
    return {
        "before": dict(before),
        "after": dict(after),
        "installed": f"{installed.name}@{installed.version}",
        "report": updater.status.state.value if updater.status else None,
    }


if __name__ == "__main__":
    main()
