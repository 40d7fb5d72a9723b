"""Text generation in the hub (issue 22, bench part h, the hub's engine figures).

``python -m bench hub-generate`` (or ``python -m bench.hub_generate``) serves a
hub-shaped language model (the default recipe's hub shape, 1.97M parameters,
FP32 on CPU, with a 1024-token context; trained a few steps: speed, not
quality, is measured) in an embedded ``cloud_hub.Hub`` with its OpenAI HTTP
app on loopback, and writes ``bench/results/hub-generate.json``. Each figure is
a ratio of two measurements in the same run:

(a) tokens/s of the hub's ``/v1/completions`` SSE stream at 16 concurrent
    streams against 1 stream (target >= 4x), and against the same
    ``LanguageEngine`` called in-process by 16 threads (target: HTTP within
    10%, i.e. >= 0.9). The clients run in a second process
    (``bench._hub_generate_client``), each sending greedy requests of
    ``MAX_TOKENS`` one after the other for ``SECONDS``.
(b) time to first token of a turn after 512 tokens of history: the
    conversation's kept KV cache (the turn prefills its 16 new tokens) against
    the same turn re-prefilled from scratch (a conversation id never seen),
    alternated over ``TTFT_ROUNDS`` rounds; medians (target >= 3x faster).
    The same turn on the Engine path (no conversation) is reported beside.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["run"]

STREAMS = 16
SECONDS = 8.0
MAX_TOKENS = 100
HISTORY = 512
NEW = 16
TTFT_ROUNDS = 30
ROUNDS = 2  # each throughput measurement, alternated
BATCH_WAIT_MS = 5.0  # generation.batch_wait_ms: a new batch gathers the streams coming back
TARGETS = {"concurrency": 4.0, "http": 0.9, "ttft": 3.0}


SSE_INTERVAL_S = 0.02  # cloud_hub.http._openai.SSE_INTERVAL_S, reported


def _recipe() -> Any:
    from tandem.demo.language import LanguageRecipe

    return LanguageRecipe(context=1024, steps=4, max_train_seconds=60.0, hub_provider="cpu")


def _turn(engine: Any, prompt: Any, n: int, conversation: str | None = None) -> tuple[Any, float]:
    """Run one greedy turn to its end: its last update and the seconds to its first token."""
    done = threading.Event()
    box: list[Any] = []
    started = time.perf_counter()

    def sink(update: Any) -> None:
        if update.tokens and not box:
            box.append(time.perf_counter() - started)
        if update.finish is not None:
            box.append(update)
            done.set()

    engine.submit(prompt, max_tokens=n, sink=sink, conversation=conversation)
    assert done.wait(120) and isinstance(box[0], float), "the turn gave no token"
    return box[-1], box[0]


def _in_process(engine: Any, streams: int, seconds: float, n: int) -> dict[str, Any]:
    """``streams`` threads, each submitting one greedy turn after the other."""
    from bench._hub_generate_client import PROMPTS

    prompts = [engine.encode(p) for p in PROMPTS]
    totals: list[tuple[int, float]] = []
    lock = threading.Lock()
    started = time.perf_counter()
    until = started + seconds

    def stream(i: int) -> None:
        while time.perf_counter() < until:
            last, _ = _turn(engine, prompts[i % len(prompts)], n)
            with lock:
                totals.append((last.completion_tokens, time.perf_counter()))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"tokens": sum(t for t, _ in totals), "requests": len(totals),
            "seconds": max(e for _, e in totals) - started}  # fmt: skip


def _over_http(url: str, streams: int, seconds: float, n: int) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "bench._hub_generate_client", url, "hub", str(streams),
         str(seconds), str(n)],
        capture_output=True, text=True, check=True, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _rate(r: dict[str, Any]) -> float:
    return float(r["tokens"] / r["seconds"])


def _first_token_s(engine: Any, prompt: Any, conversation: str | None) -> tuple[float, int]:
    """Seconds from submit to the first token of a 1-token turn, and its cached tokens."""
    last, first = _turn(engine, prompt, 1, conversation)
    return first, last.cached_prompt_tokens


def _ttft(engine: Any) -> dict[str, Any]:
    from pydoc_data.topics import topics

    import numpy as np

    text = " ".join(topics.values())
    ids = [int(t) for t in engine.encode(text[:20_000])]
    history, new = ids[:HISTORY], ids[HISTORY : HISTORY + NEW]
    kept, fresh, plain, cached = [], [], [], []
    for i in range(TTFT_ROUNDS + 2):  # 2 warm-up rounds
        first, _ = _turn(engine, np.asarray(history, np.int32), 1, f"kept-{i}")
        turn = np.asarray([*history, *first.tokens, *new], np.int32)
        k, c = _first_token_s(engine, turn, f"kept-{i}")
        f, c0 = _first_token_s(engine, turn, f"never-seen-{i}")
        p, _ = _first_token_s(engine, turn, None)
        assert c > HISTORY - 2 and c0 == 0, (c, c0)
        if i >= 2:
            kept.append(k)
            fresh.append(f)
            plain.append(p)
            cached.append(c)
    return {"kept_s": kept, "fresh_s": fresh, "engine_s": plain, "cached": cached,
            "prompt_tokens": HISTORY + 1 + NEW}  # fmt: skip


def run(model: Path | None = None) -> dict[str, Any]:
    from cloud_hub import Hub
    from cloud_hub.http import HttpServer, create_app
    from tandem.demo.language import build_language_models

    directory = model or build_language_models(recipe=_recipe()).hub_model
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        shutil.copytree(directory, repo / "hub" / "1")
        generation = {
            "max_active": STREAMS,
            "max_output_tokens": 256,
            "max_queue": 256,
            "batch_wait_ms": BATCH_WAIT_MS,
        }
        (repo / "hub" / "config.json").write_text(
            json.dumps({"platform": "onnxruntime_genai", "generation": generation})
        )
        with Hub(repo) as hub, HttpServer(create_app(hub), port=0) as server:
            engine = hub.language.get("hub").engine
            rounds: dict[str, list[dict[str, Any]]] = {"http1": [], "http16": [], "proc16": []}
            for _ in range(ROUNDS):
                rounds["http1"].append(_over_http(server.url, 1, SECONDS, MAX_TOKENS))
                rounds["http16"].append(_over_http(server.url, STREAMS, SECONDS, MAX_TOKENS))
                rounds["proc16"].append(_in_process(engine, STREAMS, SECONDS, MAX_TOKENS))
            proc1 = _in_process(engine, 1, SECONDS, MAX_TOKENS)
            beside = engine.stats().get("beside_batch", 0)
            ttft = _ttft(engine)
    load_after = os.getloadavg()
    return _report(directory, rounds, proc1, beside, ttft, load_before, load_after)


def _report(
    directory: Path,
    rounds: dict[str, list[dict[str, Any]]],
    proc1: dict[str, Any],
    beside: int,
    ttft: dict[str, Any],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    rate = {k: statistics.median(_rate(r) for r in v) for k, v in rounds.items()}
    concurrency = rate["http16"] / rate["http1"]
    http = rate["http16"] / rate["proc16"]
    kept, fresh = statistics.median(ttft["kept_s"]), statistics.median(ttft["fresh_s"])
    plain = statistics.median(ttft["engine_s"])
    speedup = fresh / kept
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    size = sum(p.stat().st_size for p in directory.iterdir() if p.name.startswith("model.onnx"))
    engine_gain = rate["proc16"] / _rate(proc1)
    load = f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    batch_bound = (
        f"the engine itself: in process, 16 streams give {engine_gain:.1f}x one stream's (on 2 "
        f"shared cores a static-batch step of 16 costs several steps of 1; {load}); over "
        "HTTP the server and its clients take cores from the engine too"
    )
    cpu_bound = (
        "2 shared cores: the HTTP server (one Python process: uvicorn, SSE events, the "
        f"engine thread, one interpreter lock) and its client process share them ({load})"
    )
    targets = [
        {"name": "hub tokens/s, 16 concurrent SSE streams / 1 stream",
         "target": f">= {TARGETS['concurrency']}x",
         "measured": f"{concurrency:.2f}x ({rate['http16']:.0f} vs {rate['http1']:.0f} tokens/s)",
         "met": concurrency >= TARGETS["concurrency"],
         "limited_by": None if concurrency >= TARGETS["concurrency"] else batch_bound},
        {"name": "hub tokens/s over HTTP (16 streams) / the same engine in-process (16 threads)",
         "target": f">= {TARGETS['http']}",
         "measured": f"{http:.2f} ({rate['http16']:.0f} vs {rate['proc16']:.0f} tokens/s)",
         "met": http >= TARGETS["http"],
         "limited_by": None if http >= TARGETS["http"] else cpu_bound},
        {"name": f"time to first token after {HISTORY} tokens of history, re-prefilled / kept",
         "target": f">= {TARGETS['ttft']}x",
         "measured": f"{speedup:.1f}x ({ms(fresh)} vs {ms(kept)})",
         "met": speedup >= TARGETS["ttft"], "limited_by": None},
    ]  # fmt: skip
    return {
        "part": "hub-generate",
        "title": "(h) Text generation in the hub: batching over HTTP, kept KV caches",
        "summary": (
            f"Hub model {directory.parent.name}/{directory.name} ({size} bytes of model.onnx + "
            f"data; the default hub shape, FP32, context 1024, CPUExecutionProvider), "
            f"embedded Hub with its OpenAI app on loopback, generation.max_active {STREAMS}, "
            f"batch_wait_ms {BATCH_WAIT_MS:g}; SSE chunks at least {SSE_INTERVAL_S * 1e3:g} ms "
            "apart after the first. "
            f"Greedy, {MAX_TOKENS} tokens per request, {SECONDS:.0f} s per measurement, "
            f"{ROUNDS} alternated rounds (median); TTFT over {TTFT_ROUNDS} alternated rounds."
        ),
        "targets": targets,
        "tables": _tables(rate, proc1, ttft, kept, fresh, plain),
        "plots": [],
        "notes": [
            f"Turns run beside the Engine's static batch (arrived while it decoded): {beside}.",
            "ONNX Runtime GenAI 0.18's CPU Engine batches statically (a request begun while a "
            "batch decodes starts when the batch ends); conversations run on og.Generators "
            "(batch of one each). See docs/language-models.md.",
            f"Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after.",
        ],
        "data": {
            "rounds": rounds,
            "proc1": proc1,
            "ttft": ttft,
            "load_before": load_before,
            "load_after": load_after,
        },
    }


def _tables(
    rate: dict[str, float],
    proc1: dict[str, Any],
    ttft: dict[str, Any],
    kept: float,
    fresh: float,
    plain: float,
) -> list[dict[str, Any]]:
    n = ttft["prompt_tokens"]
    reused = int(statistics.median(ttft["cached"]))
    rows = [
        ["HTTP /v1/completions, stream: true", round(rate["http1"]), round(rate["http16"])],
        ["LanguageEngine in process", round(_rate(proc1)), round(rate["proc16"])],
    ]
    first = [
        ["kept conversation (KV cache reused)", f"{kept * 1e3:.2f} ms", n - reused],
        ["conversation re-prefilled (an id never seen)", f"{fresh * 1e3:.2f} ms", n],
        ["Engine path (no conversation)", f"{plain * 1e3:.2f} ms", n],
    ]
    return [
        {"title": "Tokens per second (median of rounds)",
         "columns": ["", "1 stream", f"{STREAMS} streams"], "rows": rows},
        {"title": f"Time to first token, a {n}-token turn after {HISTORY} tokens of history "
                  "(median)", "columns": ["path", "TTFT", "prompt tokens prefilled"],
         "rows": first},
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ._report import publish

    parser = argparse.ArgumentParser(prog="python -m bench.hub_generate", description=__doc__)
    parser.add_argument("--model", type=Path, help="an ONNX Runtime GenAI model folder")
    args = parser.parse_args(argv)
    return publish(lambda: run(args.model))


if __name__ == "__main__":
    sys.exit(main())
