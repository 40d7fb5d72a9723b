"""A text device in its own process, for the package kill -9 tests.

Run as ``python -m tests._updating_llm_device CONFIG_JSON``. It boots the way a
device does (``ModelUpdater.bootstrap_language``), records the version it
serves and its greedy text, then asks the CDN for its assignment and acts on
it (``check_now``), and records what it serves then. With ``block_at`` set,
the step hook touches ``marker`` at that step and blocks there, so the test
can SIGKILL it mid-install. Events are JSON lines appended (and fsynced) to
``events``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from edge_agent import EdgeAgent, ModelUpdater
from shared import PublicKey


def record(path: Path, event: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()
        os.fsync(f.fileno())


def text_of(agent: EdgeAgent, prompt: str) -> str:
    return "".join(chunk.text for chunk in agent.generate(prompt, max_tokens=12))


def main(config: dict[str, Any]) -> int:
    events = Path(config["events"])
    keys = [PublicKey.from_text(config["public_key"])]
    runtime = ModelUpdater.bootstrap_language(config["store_dir"], keys, config["model"])
    if runtime is None:
        record(events, {"event": "booted", "version": None})
        return 2
    agent = EdgeAgent(None, device_id=config["device"], language_model=runtime)
    record(
        events,
        {"event": "booted", "version": runtime.version, "text": text_of(agent, config["prompt"])},
    )
    block_at, marker = config.get("block_at"), Path(config["marker"])

    def hook(step: str) -> None:
        if step == block_at:
            marker.write_text(step)
            time.sleep(60)  # the test kills us long before this
            os._exit(3)

    updater = ModelUpdater(
        agent,
        model=config["model"],
        device_id=config["device"],
        cdn_url=config["cdn_url"],
        trusted_keys=keys,
        store_dir=config["store_dir"],
        step_hook=hook if block_at else None,
    )
    status = updater.check_now()
    assert agent.language is not None
    record(
        events,
        {
            "event": "updated",
            "state": status.state.value if status else None,
            "reason": status.reason if status else None,
            "version": agent.language.version,
            "text": text_of(agent, config["prompt"]),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
