"""The hub's OpenAI-compatible API: real uvicorn on loopback, the real ``openai`` client unchanged.

A tiny language-model pair is built once per module with ``tandem.demo.language``
(seconds); its hub model is served from a repository directory marked
``"platform": "onnxruntime_genai"``. Greedy answers are compared with
``greedy_generate`` (ONNX Runtime GenAI's ``Generator``) on the same prompt.
Token budgets run on a clock the test owns, so refusals never depend on timing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cloud_hub import Hub
from cloud_hub.http import HttpServer, TokenBudget, create_app
from cloud_hub.http._openai_bodies import chat_prompt
from cloud_hub.language import GenerationLimits, LanguageEngine, TurnUpdate
from shared.server import ApiKeyGuard, generate_api_key
from tandem.demo.language import (
    build_language_models,
    greedy_generate,
    load_model,
)

from ._cli import ROOT
from ._hub_http_kit import metric
from ._language import tiny_recipe

WAIT_S = 60.0
TINY = tiny_recipe()
PROMPTS = [
    "The assert statement",
    "def f(x):",
    "Python is a",
    "class Foo",
    "import os",
    "while True",
    "A list is",
    "return None",
]
BURST = 60  # the token budget of the "thrifty" key


class FakeClock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class GatedEngine(LanguageEngine):
    """The real engine, whose thread waits on ``gate`` after a gated turn's first update.

    So the test can close a stream while its turn is certainly still in the engine.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gated_max_tokens = -1

    def _deliver(self, turn: Any, update: TurnUpdate) -> None:
        super()._deliver(turn, update)
        if turn.max_tokens == self.gated_max_tokens and update.finish is None:
            assert self.gate.wait(WAIT_S)


@dataclass
class Served:
    url: str
    key: str
    thrifty: str  # a key whose token budget the tests spend
    infer_only: str  # a key without the generate scope
    hub: Hub
    gated: GatedEngine
    model_dir: Path
    narrow: GatedEngine | None = None  # one slot, one waiting turn, 2 s of wall time

    def client(self, key: str | None = None, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=key or self.key, timeout=WAIT_S, **kw
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    built = build_language_models(tmp_path_factory.mktemp("lm-cache"), recipe=TINY)
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(built.hub_model, repo / "tiny" / "1")
    (repo / "tiny" / "config.json").write_text(
        json.dumps({"platform": "onnxruntime_genai", "generation": {"max_output_tokens": 40}})
    )
    keys, texts = {}, {}
    for name, scopes in (("main", ["generate"]), ("thrifty", ["generate"]), ("infer", ["infer"])):
        texts[name], key = generate_api_key(scopes, name=name, rate=1000.0, burst=1000)
        keys[name] = key
    # The clock never moves: a spent budget stays spent.
    budget = TokenBudget(per_s=1.0, burst=10_000, clock=FakeClock())
    budget.charge(keys["thrifty"].id, 10_000 - BURST)  # leaves this key BURST tokens
    guard = ApiKeyGuard({k.id: k for k in keys.values()}.copy)
    with Hub(repo) as hub:
        gated = GatedEngine(built.hub_model)
        hub.language.add_engine("gated", gated)
        narrow = GatedEngine(
            built.hub_model, limits=GenerationLimits(max_active=1, max_queue=1, max_wall_s=2.0)
        )
        hub.language.add_engine("narrow", narrow)
        app = create_app(hub, api_keys=guard, token_budget=budget)
        with HttpServer(app, port=0) as server:
            yield Served(
                server.url, texts["main"], texts["thrifty"], texts["infer"], hub, gated,
                built.hub_model, narrow,
            )  # fmt: skip
            gated.gate.set()
            narrow.gate.set()


@pytest.fixture(scope="module")
def reference(served: Served) -> Any:
    return load_model(served.model_dir)


def test_models_lists_the_language_models(served: Served) -> None:
    ids = [m.id for m in served.client().models.list()]
    assert ids == ["gated", "narrow", "tiny"]


def test_completion_is_the_greedy_text(served: Served, reference: Any) -> None:
    prompt = PROMPTS[0]
    out = served.client().completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0
    )
    expected = greedy_generate(reference, prompt, 12)
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert out.usage.prompt_tokens == expected.prompt_tokens
    assert out.usage.completion_tokens == len(expected.tokens) == 12


def test_chat_completion_is_the_greedy_text_of_the_rendered_prompt(
    served: Served, reference: Any
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = served.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0
    )
    expected = greedy_generate(reference, chat_prompt(messages), 10)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected.text
    assert out.object == "chat.completion"


def test_streams_concatenate_to_the_greedy_text_and_end(served: Served, reference: Any) -> None:
    client = served.client()
    expected = greedy_generate(reference, PROMPTS[1], 16).text
    chunks = list(
        client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=16, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])

    messages = [{"role": "user", "content": "Tell me"}]
    expected = greedy_generate(reference, chat_prompt(messages), 16).text
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chat_chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    assert text == expected
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    assert chat_chunks[-2].choices[0].finish_reason == "length"
    assert chat_chunks[-1].usage is not None and chat_chunks[-1].usage.completion_tokens == 16

    # On the wire: server-sent events ending with data: [DONE].
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 4, "stream": True}
    headers = {"Authorization": f"Bearer {served.key}"}
    with httpx.Client(base_url=served.url, timeout=WAIT_S) as http:
        r = http.post("/v1/completions", json=body, headers=headers)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_eight_concurrent_streams_all_complete_with_their_text(
    served: Served, reference: Any
) -> None:
    expected = {p: greedy_generate(reference, p, 24).text for p in PROMPTS}
    client = served.client()

    def run(prompt: str) -> str:
        stream = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        return "".join(c.choices[0].text for c in stream)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = dict(zip(PROMPTS, pool.map(run, PROMPTS), strict=True))
    assert got == expected
    assert served.hub.language.get("tiny").engine.stats()["active"] == 0


def test_a_bad_api_key_is_401_and_a_key_without_the_scope_403(served: Served) -> None:
    with pytest.raises(openai.AuthenticationError):
        served.client("tdm_nope_nope", max_retries=0).models.list()
    with pytest.raises(openai.PermissionDeniedError):
        served.client(served.infer_only, max_retries=0).completions.create(
            model="tiny", prompt="x", max_tokens=2
        )


def test_the_token_budget_refuses_with_429_once_spent(served: Served) -> None:
    client = served.client(served.thrifty, max_retries=0)
    spent = 0
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(BURST):  # each request takes > 1 token: the budget runs out first
            out = client.completions.create(model="tiny", prompt="a b", max_tokens=8)
            assert out.usage is not None
            spent += out.usage.total_tokens
    assert spent >= BURST  # refused only once prompt + completion tokens reached the budget
    assert refused.value.response.headers["retry-after"].isdecimal()
    # Another key's budget is its own.
    assert served.client().completions.create(model="tiny", prompt="a", max_tokens=2).choices


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": "tiny", "prompt": "word " * 60, "max_tokens": 2}, 400, "prompt has"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 41}, 400, "max_tokens must be 1..40"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens must be"),
        ({"model": "tiny", "prompt": "x", "max_tokens": "5"}, 400, "'max_tokens' must be"),
        ({"model": "nope", "prompt": "x"}, 404, "no language model 'nope'"),
        ({"model": 3, "prompt": "x"}, 400, "'model' is required"),
        ({"model": "tiny", "prompt": {"a": 1}}, 400, "'prompt' must be"),
        ({"model": "tiny", "prompt": "x", "temperature": "hot"}, 400, "'temperature'"),
        ({"model": "tiny", "prompt": "x", "n": 2}, 400, "'n' must be 1"),
        ({"model": "tiny", "prompt": "x", "stream": "yes"}, 400, "'stream'"),
        ([1, 2], 400, "JSON object"),
        ({"model": "tiny", "prompt": [1, 99999]}, 400, "out of the model's vocabulary"),
        ({"model": "tiny", "prompt": [2**40]}, 400, "out of the model's vocabulary"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 10**30}, 400, "max_tokens must be"),
        ({"model": "tiny", "prompt": "x", "stop": [""]}, 400, "'stop'"),
        ({"model": "tiny", "prompt": "x", "top_p": 1.5}, 400, "'top_p'"),
        ({"model": "tiny", "prompt": "x", "seed": 2**70}, 400, "'seed'"),
        ({"model": "tiny", "prompt": "word " * 2000}, 400, "prompt has"),
    ],
)
def test_bad_bodies_get_a_one_line_4xx_in_openai_shape(
    served: Served, body: Any, status: int, says: str
) -> None:
    headers = {"Authorization": f"Bearer {served.key}"}
    with httpx.Client(base_url=served.url, timeout=WAIT_S) as http:
        r = http.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert says in error["message"] and "\n" not in error["message"]
        assert error["type"] == "invalid_request_error"
        bad_chat = http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": "hi"}, headers=headers
        )
        assert bad_chat.status_code == 400
        raw = http.post("/v1/completions", content=b"{not json", headers=headers)
        assert raw.status_code == 400
        surrogate = b'{"model": "tiny", "prompt": "x\\ud800"}'  # valid JSON, not valid text
        raw = http.post("/v1/completions", content=surrogate, headers=headers)
        assert raw.status_code == 400 and "not valid Unicode" in raw.json()["error"]["message"]


def test_an_overlong_prompt_is_a_400_through_the_client(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="prompt has"):
        served.client(max_retries=0).completions.create(
            model="tiny", prompt="word " * 60, max_tokens=2
        )


def test_a_client_that_closes_its_stream_frees_its_slot(served: Served) -> None:
    engine = served.gated
    engine.gated_max_tokens = 37  # this turn's engine thread waits after its first update
    before = engine.stats()
    client = served.client()
    stream = client.completions.create(
        model="gated", prompt="The", max_tokens=37, temperature=0, stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    stream.close()  # the client goes away mid-turn
    _wait(lambda: engine.stats().get("cancel_requests", 0) > before.get("cancel_requests", 0))
    engine.gate.set()
    _wait(lambda: engine.stats().get("cancelled", 0) == before.get("cancelled", 0) + 1)
    after = engine.stats()
    assert after["active"] == 0 and after["waiting"] == 0
    assert after.get("completed", 0) == before.get("completed", 0)  # it did not run to the end
    assert after["tokens"] - before.get("tokens", 0) < 37


def _wait(condition: Any, timeout_s: float = WAIT_S, what: Any = None) -> None:
    done = threading.Event()
    deadline = threading.Timer(timeout_s, done.set)
    deadline.start()
    try:
        while not condition():
            assert not done.wait(0.01), f"condition not met in time: {what and what()}"
    finally:
        deadline.cancel()


def test_a_full_queue_is_503_and_a_turn_past_its_wall_time_ends_length(served: Served) -> None:
    engine = served.narrow
    assert engine is not None
    engine.gated_max_tokens = 33
    client = served.client(max_retries=0)
    stream = client.completions.create(
        model="narrow", prompt="The", max_tokens=33, temperature=0, stream=True
    )
    chunks = iter(stream)
    assert next(chunks).choices[0].finish_reason is None  # its slot is taken, the thread held
    began = time.monotonic()  # it began in the engine before its first token came

    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(
            client.completions.create, model="narrow", prompt="A", max_tokens=3, temperature=0
        )
        _wait(lambda: engine.stats()["waiting"] == 1)
        with pytest.raises(openai.InternalServerError) as refused:  # 503: the queue is full
            client.completions.create(model="narrow", prompt="B", max_tokens=3)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["retry-after"] == "1"
        assert "wait for a slot" in refused.value.message

        # The held turn outlives its 2 s of wall time (a condition on the clock, no sleep).
        _wait(lambda: time.monotonic() > began + 2.0)
        engine.gate.set()
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"
        assert engine.stats()["timed_out"] == 1
        served_after = queued.result(WAIT_S)  # served after it, within its own wall time
        assert served_after.usage is not None and served_after.usage.completion_tokens == 3
    stats = engine.stats()
    assert stats["active"] == 0 and stats["waiting"] == 0 and stats["refused"] == 1


def test_the_readme_curl_answers_as_the_client_does(served: Served, reference: Any) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    [block] = [b for b in blocks if "/v1/completions" in b]
    address = served.url.removeprefix("http://")
    command = block.replace("127.0.0.1:8000", address).replace("tiny-llm", "tiny")
    run = subprocess.run(
        ["bash", "-c", command], env={**os.environ, "KEY": served.key},
        capture_output=True, text=True, timeout=WAIT_S, check=True,
    )  # fmt: skip
    answer = json.loads(run.stdout)
    assert (
        answer["choices"][0]["text"] == greedy_generate(reference, "The assert statement", 32).text
    )


def test_stop_strings_end_the_text_before_them(served: Served, reference: Any) -> None:
    full = greedy_generate(reference, PROMPTS[2], 20).text
    stop = full[5:8]
    expected = full[: full.find(stop)]
    client = served.client()
    out = client.completions.create(
        model="tiny", prompt=PROMPTS[2], max_tokens=20, temperature=0, stop=[stop, "\u00e9\u00e9"]
    )
    assert out.choices[0].text == expected
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens < 20  # cut, not run to the end
    chunks = list(
        client.completions.create(
            model="tiny", prompt=PROMPTS[2], max_tokens=20, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert served.hub.language.get("tiny").engine.stats()["active"] == 0


def test_metrics_count_the_language_turns_and_tokens(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=WAIT_S) as http:
        before = http.get("/metrics").text
        out = served.client().completions.create(model="tiny", prompt="x", max_tokens=5)
        after = http.get("/metrics").text
    assert out.usage is not None
    done = {"model": "tiny", "outcome": "completed"}
    assert (
        metric(after, "tandem_llm_turns_total", **done)
        == metric(before, "tandem_llm_turns_total", **done) + 1
    )
    grown = metric(after, "tandem_llm_tokens_total", model="tiny") - metric(
        before, "tandem_llm_tokens_total", model="tiny"
    )
    assert grown == out.usage.completion_tokens
    assert metric(after, "tandem_llm_active_turns", model="tiny") == 0
