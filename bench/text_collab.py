"""Text collaboration across a delayed link (issue 23 items 4 and 6, bench part i).

``python -m bench text-collab`` (or ``python -m bench.text_collab [--quick]``)
serves the speculative pair's heavy hub (``tandem.demo.language.
speculative_pair``: ~84M parameters, FP32 on the CPU, and a device distilled
from it) from one embedded hub in a process of its own, and puts the device
(an ``EdgeAgent``) behind a user-space delay relay (``bench._delay_relay``:
this kernel has no ``sch_netem``) at round trips of 5, 20, 50 and 100 ms. At
each round trip every row runs on the same ``Link`` (``bench._text_collab_link``),
one after the other, on the same held-out prompts:

(a) ``cloud_only``: streaming time to first token (TTFT) and end-to-end
    latency at the client, and the hub's time per token at its engine;
(b) ``prefer_edge``: the device answers (no deadline: no turn is heavy);
    target: its TTFT <= 1/3 of cloud-only's at 50 ms (medians, same run);
(c) the crossover (``bench._text_collab_cross``): from the hub's measured
    time per token, the device's, and the pair's teacher-forced greedy
    agreement, where speculative decoding would beat cloud-only streaming;
(d) ``speculative`` (the preset of ``edge_agent.language``; the agent's
    adaptive ``DraftLength``, drafting ahead): its text against cloud-only's
    on every prompt (greedy: identical), end-to-end latency against
    cloud-only's, the hub's forward passes per generated token (one per
    verified round), acceptance, tokens per round and the ``k`` chosen
    (``bench._text_collab_spec``), beside the crossover's prediction;
(e) handoff plus budget: the budget work's measure
    (``bench._text_collab_measure.measure_text_collaboration``) on the
    DEFAULT pair (``build_language_models()``, cached), run once before the
    hub starts: it replays the models' own steps on held-out text, so its
    quality and budget adherence do not depend on the link, and every round
    trip's row points to ``data.quality``.

A row is a function ``(harness, link) -> dict`` (``ROWS``); a row's dict has
``measured`` (bool) and, when False, ``why``. ``--quick`` runs the tiny pair,
two round trips and two prompts, and the quality measure on the tiny pair
with a few short turns (the test's mode), and writes nowhere unless
``--out`` says where.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._text_collab_cross import crossover_at
from ._text_collab_link import CollabHarness, Link, Turn, serving
from ._text_collab_spec import spec_figures

__all__ = ["ROWS", "run"]

RTTS_MS = (5.0, 20.0, 50.0, 100.0)
PROMPTS = 12
MAX_TOKENS = 48
QUICK = {"rtts": (5.0, 50.0), "prompts": 2, "max_tokens": 6}
# The quality measure in quick mode: the tiny pair, a few short turns (as its own test).
QUICK_QUALITY = {"budgets": (0.3,), "max_tokens": 6, "stride": 200, "lengths": (8, 12, 16),
                 "limit": 24, "other_limit": 12, "fit_limit": 24}  # fmt: skip
AGREEMENT_POSITIONS = 8192  # held-out positions the part compares (as the build does)


def _absent(why: str) -> dict[str, Any]:
    return {"measured": False, "why": why}


def _turn_rows(turns: list[Turn]) -> list[dict[str, Any]]:
    return [{k: v for k, v in dataclasses.asdict(t).items() if k != "text"} for t in turns]


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(statistics.median(kept)) if kept else None


def _summary(turns: list[Turn]) -> dict[str, Any]:
    per_token = [(t.e2e_s - t.ttft_s) / (t.tokens - 1) for t in turns
                 if t.ttft_s is not None and t.tokens > 1]  # fmt: skip
    return {
        "measured": True,
        "ttft_s": _median([t.ttft_s for t in turns]),
        "e2e_s": _median([t.e2e_s for t in turns]),
        "client_s_per_token": _median(list(per_token)),
        "tokens": sum(t.tokens for t in turns),
        "failed": sum(1 for t in turns if t.error is not None or t.degraded),
        "turns": _turn_rows(turns),
        "texts": [t.text for t in turns],
    }


def cloud_only(harness: CollabHarness, link: Link) -> dict[str, Any]:
    """The hub answers every turn; its engine's time per token beside the client's figures."""
    before = harness.engine_turns() + 1  # the warm-up turn is the first the engine ends
    got = _summary(link.turns("cloud_only"))
    got["hub_s_per_token"] = _median(list(harness.engine_tpots(before)))
    return got


def prefer_edge(harness: CollabHarness, link: Link) -> dict[str, Any]:
    """The device answers (no deadline, so no turn is heavy)."""
    got = _summary(link.turns("prefer_edge"))
    if any(t["cloud_tokens"] for t in got["turns"]):
        harness.notes.append(f"prefer_edge sent a turn to the hub at {link.rtt_ms:g} ms")
    return got


def _preset_exists(name: str) -> bool:
    from edge_agent.language import Preset

    return name in {p.value for p in Preset}


def speculative(harness: CollabHarness, link: Link) -> dict[str, Any]:
    """The device drafts, the hub verifies (the agent's adaptive ``DraftLength``): the text
    against cloud-only's on the same link, the latency, the hub's forwards per token."""
    if not _preset_exists("speculative"):
        return _absent("no 'speculative' preset in edge_agent.language.Preset in this build")
    try:
        got = _summary(link.turns("speculative"))
    except Exception as e:  # a preset this part does not know how to drive yet: say so
        return _absent(f"the 'speculative' preset failed here ({type(e).__name__}: {e})")
    got.update(spec_figures(got, link.results.get("cloud_only")))
    return got


def handoff_budget(harness: CollabHarness, link: Link) -> dict[str, Any]:
    """Handoff held to a budget: the budget work's measure (``measure_text_collaboration``),
    run once before the links (it replays the models' own steps, so no link changes it)."""
    if harness.quality is None:
        return _absent("the handoff-with-budget quality measure did not run")
    if "error" in harness.quality:
        return _absent(f"the quality measure failed ({harness.quality['error']})")
    return {"measured": True, "link_independent": True, "see": "data.quality"}


ROWS: dict[str, Callable[[CollabHarness, Link], dict[str, Any]]] = {
    "cloud_only": cloud_only,
    "prefer_edge": prefer_edge,
    "speculative": speculative,
    "handoff_budget": handoff_budget,
}


def _quick_recipe() -> Any:
    from tandem.demo.language import LanguageRecipe, ModelShape

    device = ModelShape(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64,
                        batch_size=2, lr=1e-3)  # fmt: skip
    hub = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                     batch_size=2, lr=1e-3)  # fmt: skip
    return LanguageRecipe(vocab_size=320, context=48, device=device, hub=hub, steps=4,
                          max_train_seconds=120.0, hub_provider="cpu")  # fmt: skip


def _agreement(models: Any) -> tuple[dict[str, Any], str]:
    """The pair's greedy agreement, measured now (with how varied the hub's choices are);
    the build report's figure, where it has one, is named beside it."""
    from tandem.demo.language import greedy_agreement, text_splits

    recipe = models.report["recipe"]
    splits = text_splits(dataclasses.replace(_quick_recipe(), **_split_fields(recipe)))
    measured = greedy_agreement(
        models.device_model, models.hub_model, splits.heldout.values(),
        context=int(recipe["context"]), eos_id=2, max_positions=AGREEMENT_POSITIONS,
    )  # fmt: skip
    built = models.report.get("agreement")
    if built:
        return measured, (
            f"measured by this part; the build's report: {built['agreement']} over "
            f"{built['positions']} positions"
        )
    return measured, "measured by this part (the pair's build report has none)"


def _split_fields(recipe: dict[str, Any]) -> dict[str, Any]:
    return {"heldout_fraction": recipe["heldout_fraction"], "split_seed": recipe["split_seed"]}


def _prompts(models: Any, count: int, max_tokens: int) -> list[Any]:
    from tandem.demo.language import heldout_prompts, load_model, text_splits

    recipe = models.report["recipe"]
    _, tokenizer = load_model(models.device_model)
    splits = text_splits(dataclasses.replace(_quick_recipe(), **_split_fields(recipe)))
    return heldout_prompts(
        splits.heldout, count=count, max_tokens=max_tokens, context=int(recipe["context"]),
        encode=tokenizer.encode, decode=lambda ids: tokenizer.decode(ids),
    )  # fmt: skip


def run(*, quick: bool = False, models: Any = None) -> dict[str, Any]:
    """Run every row at every round trip; the result as ``bench._report`` describes it."""
    from tandem.demo.language import build_language_models, speculative_pair

    if models is None:
        models = build_language_models(recipe=_quick_recipe()) if quick else speculative_pair()
    rtts = QUICK["rtts"] if quick else RTTS_MS
    count = int(QUICK["prompts"] if quick else PROMPTS)  # type: ignore[call-overload]
    max_tokens = int(QUICK["max_tokens"] if quick else MAX_TOKENS)  # type: ignore[call-overload]
    agreement, agreement_from = _agreement(models)
    prompts = _prompts(models, count, max_tokens)
    quality = _quality(models if quick else None)  # before the hub runs: no CPU shared
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in ROWS}
    relay_holds: dict[str, dict[str, float | None]] = {}
    pings: dict[str, float | None] = {}
    loads: list[str] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        serving(models, prompts, max_tokens, Path(tmp)) as harness,
    ):
        harness.quality = quality
        for rtt in rtts:
            with harness.link(rtt) as link:
                for name, row in ROWS.items():
                    link.results[name] = results[name][f"{rtt:g}"] = row(harness, link)
                relay_holds[f"{rtt:g}"] = _holds(link)
                pings[f"{rtt:g}"] = _median(list(link.mqtt_round_trips()))
                loads.append(f"{rtt:g} ms {os.getloadavg()[0]:.1f}")
        notes = [*harness.notes, _load_note(loads)]
    from ._text_collab_report import report

    return report(
        results=results, rtts=rtts, models=models, agreement=agreement,
        agreement_from=agreement_from, relay_holds=relay_holds, pings=pings, notes=notes,
        quick=quick,
        prompts=count, max_tokens=max_tokens, crossover=crossover_at, quality=quality,
    )  # fmt: skip


def _load_note(loads: list[str]) -> str:
    return (
        f"The machine's 1-minute load average after each round trip's rows ({os.cpu_count()} "
        f"logical CPUs, shared with other jobs): {', '.join(loads)}. The rows of one round "
        "trip run one after the other, so a load that changes between them moves their "
        "ratios; the hub's time per token at its engine, per round trip, shows how much."
    )


def _quality(tiny: Any) -> dict[str, Any]:
    """``measure_text_collaboration`` on the default pair (``build_language_models()``,
    cached), or on ``tiny`` with the quick settings; a failure is kept as ``error``."""
    from tandem.demo.language import build_language_models

    from ._text_collab_measure import measure_text_collaboration

    try:
        if tiny is not None:
            return measure_text_collaboration(tiny, **QUICK_QUALITY)  # type: ignore[arg-type]
        return measure_text_collaboration(build_language_models())
    except Exception as e:  # the part still reports its other rows, and says why
        return {"error": f"{type(e).__name__}: {e}"}


def _holds(link: Link) -> dict[str, float | None]:
    """The relay's own median hold per direction (written - read), in ms."""
    chunks = link.relay.chunks()
    return {
        d: _median([(c.released - c.received) * 1e3 for c in chunks if c.direction == d])
        for d in ("up", "down")
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ._report import publish, write_result

    parser = argparse.ArgumentParser(prog="python -m bench.text_collab", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny pair, 2 round trips, 2 prompts")
    parser.add_argument("--out", type=Path, help="write the result's JSON into this folder")
    args = parser.parse_args(argv)
    if args.quick or args.out:
        result = run(quick=args.quick)
        if args.out:
            print(f"[bench] wrote {write_result(result, args.out)}")
        for target in result["targets"]:
            print(f"[bench] {target['name']}: {target['measured']} (target {target['target']})")
        return 0
    return publish(run)


if __name__ == "__main__":
    sys.exit(main())
