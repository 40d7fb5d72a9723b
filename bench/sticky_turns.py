"""What sticky routing saves, and what its fallback costs: a conversation's second turn.

``python -m bench.sticky_turns [--conversations N]`` (not a part of
BENCHMARKS.md: a check of issue 22 item 5, run before and after a change to
compare). A Mosquitto of its own, two embedded hub replicas (``hub-a``,
``hub-b``) sharing the generate subscription, serving the hub-shaped model of
``bench.hub_generate`` (FP32 on CPU), and one ``EdgeAgent`` sending
``cloud_only`` chat turns. Each conversation's first turn carries a long
message (``HISTORY_LINES`` lines of code, some 400 tokens); its second turn is
short. The second turn goes, alternated over the conversations:

- **sticky**: to the replica that answered the first (the default);
- **shared**: on the shared topic, as before sticky routing (the device
  forgets the hub id): the broker alternates its two replicas, so it lands on
  the other one and re-prefills the history;
- **replica gone**: to a hub id nobody subscribes (a replica that stopped):
  the PUBACK's reason 0x10 sends it on the shared topic at once, re-prefilled.

Reported per way: the median time to first token of the second turn (from
the call, as ``GenerationRecord.time_to_first_token_ms``), the share of
second turns that reused cached tokens, and how many were re-routed. The
fallback for a stuck replica costs ``CloudTextSettings.sticky_s`` by
construction and is not measured. The broker is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["run"]

HISTORY_LINES = 40
MAX_TOKENS = 16
WAYS = ("sticky", "shared", "replica gone")


def _repository(root: Path, model: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(model, repo / "lm" / "1")
    (repo / "lm" / "config.json").write_text(json.dumps({"platform": "onnxruntime_genai"}))
    return repo


def _turn(agent: Any, conversation: Any, content: str) -> Any:
    record = agent.chat([{"role": "user", "content": content}], conversation=conversation,
                        max_tokens=MAX_TOKENS, preset="cloud_only").final()  # fmt: skip
    if record.error is not None or not record.cloud_tokens:
        raise RuntimeError(f"a turn failed: {record.error or record.fallbacks}")
    return record


def run(conversations: int = 24) -> dict[str, Any]:
    from bench._procs import BrokerProcess
    from bench.hub_generate import _recipe
    from cloud_hub import Hub
    from edge_agent import Conversation, EdgeAgent
    from shared import MqttSettings
    from tandem.demo.language import build_language_models

    models = build_language_models(recipe=_recipe())
    history = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(HISTORY_LINES))
    seconds: dict[str, list[Any]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="bench-sticky-") as tmp:
        repo = _repository(Path(tmp), models.hub_model)
        with BrokerProcess(Path(tmp)).start() as broker:
            settings = MqttSettings.from_url(broker.url)
            hubs = [
                Hub(repo, mqtt=settings, mqtt_client="paho", hub_id=h) for h in ("hub-a", "hub-b")
            ]
            try:
                for hub in hubs:
                    hub.start()
                agent = EdgeAgent(None, device_id="bench-sticky", broker=broker.url,
                                  language_model=models.device_model,
                                  cloud_language_model="lm")  # fmt: skip
                with agent:
                    _turn(agent, Conversation(), "warm up")
                    for i in range(conversations * len(WAYS)):
                        way = WAYS[i % len(WAYS)]
                        conversation = Conversation()
                        _turn(agent, conversation, f"# {i}\n{history}")
                        conversation.hub = {"sticky": conversation.hub, "shared": None}.get(
                            way, "gone-replica"
                        )
                        seconds[way].append(_turn(agent, conversation, "And?"))
            finally:
                for hub in hubs:
                    hub.stop()
    ways = {way: _summary(records) for way, records in seconds.items()}
    return {"conversations_per_way": conversations, "ways": ways}


def _summary(records: list[Any]) -> dict[str, Any]:
    return {
        "ttft_ms_median": round(statistics.median(r.time_to_first_token_ms for r in records), 2),
        "reused_cache": sum(r.prompt_tokens_reused > 0 for r in records) / len(records),
        "prompt_tokens_median": statistics.median(r.prompt_tokens for r in records),
        "reused_tokens_median": statistics.median(r.prompt_tokens_reused for r in records),
        "rerouted": sum(r.rerouted is not None for r in records),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=24, help="per way")
    result = run(parser.parse_args().conversations)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
