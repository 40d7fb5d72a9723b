"""A device in its own process, for the kill -9 tests.

Run as ``python -m tests._updating_device CONFIG_JSON``. It boots the way a
device does (``ModelUpdater.bootstrap``), records what it serves, then runs
its updater on MQTT until an update ends, and records what it serves then.
With ``block_at`` set, the step hook touches ``marker`` at that step and
blocks there, so the test can SIGKILL it mid-update.

Events are JSON lines appended (and fsynced) to ``events``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent import EdgeAgent, ModelUpdater
from shared import MqttSettings, PublicKey, UpdateState


def record(path: Path, event: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(config: dict[str, Any]) -> int:
    events = Path(config["events"])
    keys = [PublicKey.from_text(config["public_key"])]
    sample = np.asarray(config["sample"], dtype=np.float32)
    runtime = ModelUpdater.bootstrap(config["store_dir"], keys, config["model"])
    if runtime is None:
        record(events, {"event": "booted", "version": None})
        return 2
    logits = runtime.run({"x": sample})["logits"]
    record(events, {"event": "booted", "version": runtime.version, "logits": logits.tolist()})

    block_at = config.get("block_at")
    marker = Path(config["marker"])

    def hook(step: str) -> None:
        if step == block_at:
            marker.write_text(step)
            time.sleep(60)  # the test kills us long before this
            os._exit(3)

    agent = EdgeAgent(runtime, device_id=config["device"])
    updater = ModelUpdater(
        agent,
        model=config["model"],
        device_id=config["device"],
        cdn_url=config["cdn_url"],
        trusted_keys=keys,
        store_dir=config["store_dir"],
        mqtt=MqttSettings(port=config["mqtt_port"], protocol="3.1.1"),
        step_hook=hook if block_at else None,
    )
    done = (UpdateState.INSTALLED, UpdateState.FAILED, UpdateState.ROLLED_BACK)
    with updater:
        deadline = time.monotonic() + 60
        while (updater.status is None or updater.status.state not in done) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)
    status = updater.status
    result = agent.infer({"x": sample})
    record(
        events,
        {
            "event": "updated",
            "state": status.state.value if status else None,
            "reason": status.reason if status else None,
            "version": result.model_versions["edge"],
            "logits": result.output.tolist(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
