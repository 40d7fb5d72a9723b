"""Text turns while the hub is SIGKILLed mid-stream (issue 22 item 9, bench part h).

``python -m bench text-hub-kills`` (or ``python -m bench.text_hub_kills``)
runs ``TURNS`` greedy ``prefer_cloud`` turns of ``MAX_TOKENS`` tokens from one
``EdgeAgent`` (the device model on the device, the hub model at the hub) over
a real Mosquitto on loopback to a real ``tandem hub`` process plane (two MQTT
ingress processes, an HTTP ingress, the language executor;
``--restart-max-s 2``) serving the hub model of hub-generate's pair. One turn
in ``KILL_EVERY`` (the sixth of each ten) is struck by a SIGKILL once its first
chunk has reached the device:

* the first half of the run kills the **language executor** by its PID; the
  supervisor restarts it (what the product claims to survive: the device
  finishes the turn, the hub serves the next one);
* the second half kills the **whole ``tandem hub``** (its process group:
  supervisor, ingresses, executor), which the bench starts again on the same
  port and prefix, as a service manager would.

The next turn waits until the hub is ready again. Every turn is audited
(``bench._text_audit``): lost (an exception, no result, an error, no text),
repeated or missing text (an index twice or skipped, the hub's text not a
prefix of the hub model's greedy text nor the text of the chunks the hub
sent for it, the device's continuation not the device model's greedy text
after the prompt and the hub's text), and who finished it (the hub,
degraded: the hub then the device, or the device alone). A spy client on
the device's topics sees each request and the hub's chunks, and counts hub
frames seen twice.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from ._text_audit import CLOUD, EDGE, TurnSeen, audit, outcome, sent_texts, wire_repeats

__all__ = ["run"]

TURNS = 100
KILL_EVERY = 10
KILL_AT = 5  # the turn i with i % KILL_EVERY == KILL_AT is struck
MAX_TOKENS = 400  # the hub model: ~0.2 s of decoding, so a kill lands mid-stream
DEVICE = "bench-phone-kills"
TARGETS = {"lost": 0, "damaged": 0}


def _prompts() -> list[str]:
    from ._hub_generate_client import PROMPTS

    return list(PROMPTS)


def _one_turn(agent: Any, prompt: str, strike: Any) -> dict[str, Any]:
    """One prefer_cloud turn; ``strike()`` runs once its first chunk is here (or None)."""
    chunks: list[tuple[int, str, str]] = []
    started = time.perf_counter()
    turn: dict[str, Any] = {"prompt": prompt, "raised": None, "record": None, "struck": False}
    try:
        stream = agent.generate(prompt, max_tokens=MAX_TOKENS, preset="prefer_cloud")
        for chunk in stream:
            chunks.append((chunk.index, chunk.source.value, chunk.text))
            if strike is not None and not turn["struck"]:
                turn["struck"] = True
                turn["struck_source"] = chunk.source.value
                strike()
        record = stream.result
        if record is not None:
            turn["record"] = {
                "text": record.text, "error": record.error, "degraded": record.degraded,
                "cloud_tokens": record.cloud_tokens, "edge_tokens": record.edge_tokens,
                "fallbacks": list(record.fallbacks),
            }  # fmt: skip
    except Exception as e:  # a lost turn is what is counted
        turn["raised"] = f"{type(e).__name__}: {e}"
    turn["chunks"] = chunks
    turn["seconds"] = time.perf_counter() - started
    return turn


def _turns(hub: Any, agent: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run: ``TURNS`` turns, the executor struck in the first half, the hub in the second."""
    prompts = _prompts()
    turns, kills = [], []
    for i in range(TURNS):
        mode = "executor" if i < TURNS // 2 else "hub"
        box: dict[str, Any] = {}
        struck = i % KILL_EVERY == KILL_AT
        if struck and mode == "executor":  # looked up before: the kill itself is one syscall
            box["pid"], box["before"] = hub.executor_pid(), hub.restarts()

        def strike(mode: str = mode, box: dict[str, Any] = box) -> None:
            box["at"] = time.perf_counter()
            if mode == "executor":
                os.kill(box["pid"], signal.SIGKILL)
            else:
                hub.kill_all()

        turn = _one_turn(agent, prompts[i % len(prompts)], strike if struck else None)
        turn.update(i=i, mode=mode)
        if "at" in box:
            if mode == "executor":
                hub.executor_back(box["pid"], box["before"])
            else:
                hub.start()
            kills.append({"i": i, "mode": mode, "back_s": time.perf_counter() - box["at"]})
        turns.append(turn)
    return turns, kills


def _expected(turns: list[dict[str, Any]], hub_model: Path, device_model: Path) -> None:
    """Each turn's ``hub_expected`` and (with device text) ``local_expected``, from the models."""
    from tandem.demo.language import greedy_generate, load_model

    hub, device = load_model(hub_model), load_model(device_model)
    greedy = {p: greedy_generate(hub, p, MAX_TOKENS).text for p in {t["prompt"] for t in turns}}
    for t in turns:
        t["hub_expected"] = greedy[t["prompt"]]
        record = t["record"]
        if record is None or not any(s == EDGE for _, s, _ in t["chunks"]):
            continue
        cloud = "".join(text for _, s, text in t["chunks"] if s == CLOUD)
        ids = [int(x) for x in device[1].encode(t["prompt"])]
        ids += [int(x) for x in device[1].encode(cloud)] if cloud else []
        left = MAX_TOKENS - record["cloud_tokens"]
        t["local_expected"] = greedy_generate(device, ids, left).text


def _sent(
    turns: list[dict[str, Any]], frames: list[tuple[str, str, int, str]], requests: list[str]
) -> None:
    """Each turn's request id and ``hub_sent`` (the hub's chunks the spy saw), when the spy
    saw one request per turn (the turns run one after the other)."""
    if len(requests) != len(turns):
        return
    texts = sent_texts(frames)
    for t, rid in zip(turns, requests, strict=True):
        t["request_id"], t["hub_sent"] = rid, texts.get(rid, "")


def _seen(t: dict[str, Any]) -> TurnSeen:
    record = t["record"] or {}
    return TurnSeen(
        chunks=tuple(tuple(c) for c in t["chunks"]),  # type: ignore[misc]
        text=record.get("text"), error=t["raised"] or record.get("error"),
        degraded=bool(record.get("degraded")), hub_expected=t["hub_expected"],
        local_expected=t.get("local_expected"), raised=t["raised"] is not None,
        hub_sent=t.get("hub_sent"),
    )  # fmt: skip


def run(model: Path | None = None) -> dict[str, Any]:
    from edge_agent import EdgeAgent
    from shared import Topics
    from tandem.demo.language import build_language_models

    from ._procs import BrokerProcess
    from ._text_plane import MODEL, Spy, TandemHub, language_repo
    from .hub_generate import _recipe

    models = build_language_models(recipe=_recipe())
    hub_model = model or models.hub_model
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = language_repo(work, hub_model, MAX_TOKENS)
        prefix = f"tandem/{uuid.uuid4().hex[:8]}/v1"
        with BrokerProcess(work).start() as broker:
            hub = TandemHub(repo, broker.url, work, prefix).start()
            topics = Topics(prefix)
            spy = Spy(broker.url, [topics.text(DEVICE), topics.device_generate(DEVICE, MODEL)])
            agent = EdgeAgent(
                None, device_id=DEVICE, broker=broker.url, language_model=models.device_model,
                cloud_language_model=MODEL, topics=Topics(prefix),
            )  # fmt: skip
            try:
                with agent:
                    turns, kills = _turns(hub, agent)
            finally:
                spy.close()
                hub.stop()
            frames, requests = list(spy.frames), spy.requests()
    seconds = time.perf_counter() - started
    load_after = os.getloadavg()
    _expected(turns, hub_model, models.device_model)
    _sent(turns, frames, requests)
    return _report(hub_model, turns, kills, frames, seconds, load_before, load_after)


def _report(
    hub_model: Path,
    turns: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    frames: list[tuple[str, str, int, str]],
    seconds: float,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    for t in turns:
        seen = _seen(t)
        t["problems"], t["outcome"] = audit(seen), outcome(seen)
    lost = [t for t in turns if t["outcome"] == "lost"]
    damaged = [t for t in turns if t["problems"] and t["outcome"] != "lost"]
    reasons = Counter(p for t in damaged for p in t["problems"])
    repeats = wire_repeats((rid, kind, seq) for rid, kind, seq, _ in frames if kind != "request")
    hub_frames = sum(1 for f in frames if f[1] != "request")
    checked = sum(1 for t in turns if t.get("hub_sent") is not None)
    load = f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    targets = [
        {"name": f"{TURNS} prefer_cloud turns, the hub SIGKILLed mid-stream in {len(kills)}: "
                 "turns lost (an exception, no result, an error or no text)",
         "target": "0", "measured": f"{len(lost)} of {TURNS}",
         "met": len(lost) == TARGETS["lost"], "limited_by": None},
        {"name": "turns whose text repeats or misses chunks (an index twice or skipped, the "
                 "hub's text not its greedy prefix nor the chunks it sent, the device's splice "
                 "not its greedy continuation)", "target": "0",
         "measured": f"{len(damaged)} of {TURNS}"
                     + (f" ({', '.join(f'{k}: {v}' for k, v in reasons.items())})"
                        if reasons else ""),
         "met": len(damaged) == TARGETS["damaged"], "limited_by": None},
    ]  # fmt: skip
    return {
        "part": "text-hub-kills",
        "title": "(h) Text turns with the hub SIGKILLed mid-stream",
        "summary": _summary(hub_model, kills, seconds, load),
        "targets": targets,
        "tables": _tables(turns, kills),
        "plots": [],
        "notes": [*_notes(turns, kills, hub_frames, repeats, load_before, load_after),
                  f"Turns whose text was checked against the hub's chunks on the wire: "
                  f"{checked} of {len(turns)}."],
        "data": {"turns": [_slim(t) for t in turns], "kills": kills, "wire_repeats": repeats,
                 "frames": hub_frames,
                 "load_before": load_before, "load_after": load_after},
    }  # fmt: skip


def _slim(t: dict[str, Any]) -> dict[str, Any]:
    """A turn for the result file: what was counted, its chunks and characters per side."""
    record = {k: v for k, v in (t["record"] or {}).items() if k != "text"}
    by = {
        side: [text for _, source, text in t["chunks"] if source == side] for side in (CLOUD, EDGE)
    }
    return {
        "i": t["i"], "mode": t["mode"], "struck": t["struck"], "outcome": t["outcome"],
        "problems": t["problems"], "seconds": round(t["seconds"], 4), "raised": t["raised"],
        "record": record or None, "request_id": t.get("request_id"),
        "chunks": {side: len(texts) for side, texts in by.items()},
        "chars": {side: sum(map(len, texts)) for side, texts in by.items()},
    }  # fmt: skip


def _summary(hub_model: Path, kills: list[dict[str, Any]], seconds: float, load: str) -> str:
    return (
        f"{TURNS} greedy prefer_cloud turns of {MAX_TOKENS} tokens (the 8 prompts of "
        f"hub-generate in turn) from one EdgeAgent (device model "
        f"{hub_model.parent.name}/device) over Mosquitto on loopback to a `tandem hub` "
        f"process plane (--workers 2, --restart-max-s 2) serving {hub_model.parent.name}/"
        f"{hub_model.name} (FP32, CPU). One turn in {KILL_EVERY} is SIGKILLed once its first "
        f"chunk reached the device: turns 0-{TURNS // 2 - 1} kill the language executor "
        f"(the supervisor restarts it), turns {TURNS // 2}-{TURNS - 1} the whole `tandem "
        "hub` process group (the bench starts it again, same port and prefix); the next "
        f"turn waits for readiness. {len(kills)} kills in {seconds:.0f} s ({load}). "
        "Device defaults: CloudTextSettings(first_chunk_s=10, stall_s=2)."
    )


def _tables(turns: list[dict[str, Any]], kills: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for mode, label in (("executor", "language executor"), ("hub", "whole `tandem hub`")):
        mine = [t for t in turns if t["mode"] == mode]
        struck = [t for t in mine if t["struck"]]
        count = Counter(t["outcome"] for t in mine)
        back = [k["back_s"] for k in kills if k["mode"] == mode]
        struck_s = [t["seconds"] for t in struck]
        rows.append([
            label, len(mine), len(struck), count["hub"], count["degraded"], count["local"],
            count["lost"], sum(1 for t in mine if t["problems"] and t["outcome"] != "lost"),
            sum(1 for t in struck if t["outcome"] == "hub"),
            f"{statistics.median(struck_s):.2f} s" if struck_s else "-",
            f"{statistics.median(back):.1f} s" if back else "-",
        ])  # fmt: skip
    return [
        {"title": "Turns by what was killed, and who finished them",
         "columns": ["killed", "turns", "struck", "by the hub", "degraded (hub, then device)",
                     "by the device alone", "lost", "repeated or missing text",
                     "struck but whole at the hub", "struck turn's time (median)",
                     "kill to ready again (median)"],
         "rows": rows},
    ]  # fmt: skip


def _notes(
    turns: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    frames: int,
    repeats: int,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> list[str]:
    fallbacks = Counter(
        f.removesuffix(": finished on the device")
        for t in turns
        if t["record"]
        for f in t["record"]["fallbacks"]
    )
    return [
        f"Hub frames on the device's text topic seen twice by a spy client: {repeats} of "
        f"{frames} (the device's reorder buffer drops such duplicates).",
        "Why turns left the hub (the records' fallbacks): "
        + ("; ".join(f"{k} ({v})" for k, v in fallbacks.most_common()) or "none"),
        "A struck turn that is whole at the hub: the kill landed after the hub's final.",
        f"Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after.",
    ]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ._report import publish

    parser = argparse.ArgumentParser(prog="python -m bench.text_hub_kills", description=__doc__)
    parser.add_argument("--model", type=Path, help="an ONNX Runtime GenAI hub model folder")
    args = parser.parse_args(argv)
    return publish(lambda: run(args.model))


if __name__ == "__main__":
    sys.exit(main())
