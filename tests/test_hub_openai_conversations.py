"""Kept conversations over the hub's OpenAI routes: the ``X-Tandem-Conversation`` header.

Real uvicorn on loopback, the ``openai`` client unchanged (the header through
``extra_headers``); answers compared with ``greedy_generate`` on the rendered
prompt, and ``usage.prompt_tokens_details.cached_tokens`` with the history.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from cloud_hub import Hub
from cloud_hub.http import HttpServer, create_app
from cloud_hub.http._openai_bodies import chat_prompt
from shared.server import ApiKeyGuard, generate_api_key
from tandem.demo.language import build_language_models, greedy_generate, load_model

from ._hub_http_kit import metric
from .test_hub_conversations import sensitive_recipe

WAIT_S = 60.0


@dataclass
class Served:
    url: str
    keys: dict[str, str]
    pair: Any

    def client(self, key: str = "main") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[key], timeout=WAIT_S)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    built = build_language_models(tmp_path_factory.mktemp("lm"), recipe=sensitive_recipe())
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(built.hub_model, repo / "tiny" / "1")
    (repo / "tiny" / "config.json").write_text(
        json.dumps({"platform": "onnxruntime_genai", "generation": {"max_conversations": 8}})
    )
    texts, keys = {}, {}
    for name in ("main", "other"):
        texts[name], keys[name] = generate_api_key(["generate"], name=name, rate=1000.0, burst=1000)
    guard = ApiKeyGuard({k.id: k for k in keys.values()}.copy)
    with Hub(repo) as hub, HttpServer(create_app(hub, api_keys=guard), port=0) as server:
        yield Served(server.url, texts, load_model(built.hub_model))


def header(name: str) -> dict[str, str]:
    return {"X-Tandem-Conversation": name}


def cached(usage: Any) -> int:
    assert usage is not None and usage.prompt_tokens_details is not None
    return int(usage.prompt_tokens_details.cached_tokens)


def test_a_chats_next_turn_reuses_the_kept_history_through_the_openai_client(
    served: Served,
) -> None:
    client = served.client()
    messages: list[dict[str, str]] = [{"role": "user", "content": "import os"}]
    one = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
        extra_headers=header("chat-1"),
    )  # fmt: skip
    assert cached(one.usage) == 0
    answer = one.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and"}]
    two = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
        extra_headers=header("chat-1"),
    )  # fmt: skip
    expected = greedy_generate(served.pair, chat_prompt(messages), 8)
    assert two.choices[0].message.content == expected.text
    assert two.usage is not None and two.usage.prompt_tokens == expected.prompt_tokens
    assert 0 < cached(two.usage) < expected.prompt_tokens
    # The same conversation name under another API key is another conversation.
    three = served.client("other").chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
        extra_headers=header("chat-1"),
    )  # fmt: skip
    assert three.choices[0].message.content == expected.text and cached(three.usage) == 0


def test_a_streamed_completion_reports_its_cached_tokens_in_the_usage_chunk(
    served: Served,
) -> None:
    client = served.client()
    first = client.completions.create(
        model="tiny", prompt="def f(x):", max_tokens=6, temperature=0,
        extra_headers=header("doc-1"),
    )  # fmt: skip
    prompt = "def f(x):" + first.choices[0].text + " in the"
    chunks = list(
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_headers=header("doc-1"),
        )
    )  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == greedy_generate(served.pair, prompt, 6).text
    assert cached(chunks[-1].usage) > 0


def test_a_bad_conversation_header_is_a_400(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="X-Tandem-Conversation"):
        served.client().completions.create(
            model="tiny", prompt="x", max_tokens=2, extra_headers=header("has space")
        )


def test_metrics_count_conversation_hits_and_the_kept_conversations(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=WAIT_S) as http:
        before = http.get("/metrics").text
        client = served.client()
        out = client.completions.create(
            model="tiny", prompt="while True", max_tokens=4, extra_headers=header("m-1")
        )
        client.completions.create(
            model="tiny", prompt="while True" + out.choices[0].text + " for", max_tokens=4,
            extra_headers=header("m-1"),
        )  # fmt: skip
        after = http.get("/metrics").text
    hit, miss = ({"model": "tiny", "cache": c} for c in ("hit", "miss"))
    name = "tandem_llm_conversation_turns_total"
    assert metric(after, name, **hit) == metric(before, name, **hit) + 1
    assert metric(after, name, **miss) == metric(before, name, **miss) + 1
    assert metric(after, "tandem_llm_conversations", model="tiny") >= 1
    assert metric(after, "tandem_llm_cached_prompt_tokens_total", model="tiny") > metric(
        before, "tandem_llm_cached_prompt_tokens_total", model="tiny"
    )
