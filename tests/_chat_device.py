"""A device process for one chat turn: ``python -m tests._chat_device STATE BROKER MODEL DEVICE``.

It restores the conversation from ``STATE`` (JSON) when the file exists, runs
one prefer_cloud turn of the user message in ``TANDEM_TEST_MESSAGE``, writes the
conversation and the turn's record back to ``STATE`` and exits. ``edge_agent``
offers no call to persist a ``Conversation``: an app keeps its public fields
(``id``, ``messages``, ``history``, ``turns``) as this one does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from edge_agent import Conversation, EdgeAgent


def main(state_file: str, broker: str, model: str, device: str) -> None:
    state = Path(state_file)
    conversation = Conversation()
    if state.exists():
        kept = json.loads(state.read_text())["conversation"]
        conversation.id, conversation.turns = kept["id"], kept["turns"]
        conversation.messages, conversation.history = kept["messages"], kept["history"]
        conversation.hub = kept["hub"]  # the replica holding its KV cache: sticky again
    message = {"role": "user", "content": os.environ["TANDEM_TEST_MESSAGE"]}
    agent = EdgeAgent(
        None, device_id=device, broker=broker, language_model=Path(model),
        cloud_language_model="tiny",
    )  # fmt: skip
    with agent:
        stream = agent.chat([message], conversation=conversation, max_tokens=8,
                            preset="prefer_cloud")  # fmt: skip
        chunks = list(stream)
        record = stream.final()
    state.write_text(json.dumps({
        "conversation": {
            "id": conversation.id, "turns": conversation.turns,
            "messages": conversation.messages, "history": conversation.history,
            "hub": conversation.hub,
        },
        "chunks": [[c.index, c.source.value, c.text] for c in chunks],
        "text": record.text, "degraded": record.degraded, "fallbacks": list(record.fallbacks),
        "reused": record.prompt_tokens_reused, "cloud_tokens": record.cloud_tokens,
    }))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:5])
