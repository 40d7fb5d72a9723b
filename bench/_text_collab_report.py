"""Bench part i's result: targets next to their figures, the tables, the notes (no I/O)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._text_collab_tables import (
    NOT_RUN,
    quality_tables,
    quality_targets,
    spec_notes,
    spec_table,
    spec_targets,
)

__all__ = ["report"]

TTFT_RATIO = 1 / 3
TTFT_RTT = "50"
HUB_TPOT_MS = (15.0, 40.0)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _target(
    name: str, target: str, measured: str, met: bool | None, limited: str | None
) -> dict[str, Any]:
    return {"name": name, "target": target, "measured": measured, "met": met,
            "limited_by": limited}  # fmt: skip


def _ttft_target(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    cloud, edge = results["cloud_only"].get(TTFT_RTT), results["prefer_edge"].get(TTFT_RTT)
    name = "time to first token, prefer_edge / cloud_only at a 50 ms round trip (medians)"
    if not cloud or not edge or cloud.get("ttft_s") is None or edge.get("ttft_s") is None:
        return _target(name, f"<= {TTFT_RATIO:.2f}", NOT_RUN, None, "no 50 ms round trip run")
    ratio = edge["ttft_s"] / cloud["ttft_s"]
    return _target(
        name, f"<= {TTFT_RATIO:.2f}",
        f"{ratio:.3f} ({_ms(edge['ttft_s'])} vs {_ms(cloud['ttft_s'])})", ratio <= TTFT_RATIO,
        None if ratio <= TTFT_RATIO else "the device model's own prefill and first step",
    )  # fmt: skip


def _hub_target(results: dict[str, dict[str, dict[str, Any]]], quick: bool) -> dict[str, Any]:
    tpots = [r["hub_s_per_token"] for r in results["cloud_only"].values()
             if r.get("hub_s_per_token")]  # fmt: skip
    name = "the hub's greedy time per token at its engine (heavy hub), median over round trips"
    low, high = HUB_TPOT_MS
    if not tpots:
        return _target(name, f"{low:g}-{high:g} ms", NOT_RUN, None, "no cloud-only turn timed")
    ms = sorted(tpots)[len(tpots) // 2] * 1e3
    met = None if quick else low <= ms <= high
    return _target(name, f"{low:g}-{high:g} ms", f"{ms:.2f} ms", met,
                   "the tiny pair (quick mode)" if quick else
                   (None if met else "the hub's size against this CPU's load"))  # fmt: skip


def _latency_table(
    results: dict[str, dict[str, dict[str, Any]]],
    rtts: Sequence[float],
    holds: dict[str, dict[str, float | None]],
    pings: dict[str, float | None],
) -> dict[str, Any]:
    rows = []
    for rtt in rtts:
        key = f"{rtt:g}"
        cloud, edge = results["cloud_only"][key], results["prefer_edge"][key]
        ratio = (edge["ttft_s"] / cloud["ttft_s"]
                 if edge.get("ttft_s") and cloud.get("ttft_s") else None)  # fmt: skip
        hold = holds.get(key, {})
        rows.append([
            f"{rtt:g} ms",
            " / ".join("-" if hold.get(d) is None else f"{hold[d]:.2f}" for d in ("up", "down")),
            _ms(pings.get(key)),
            _ms(cloud["ttft_s"]), _ms(cloud["e2e_s"]), _ms(cloud.get("hub_s_per_token")),
            _ms(cloud["client_s_per_token"]), _ms(edge["ttft_s"]), _ms(edge["e2e_s"]),
            "-" if ratio is None else f"{ratio:.3f}",
        ])  # fmt: skip
    return {"title": "Per round trip (medians over the prompts)",
            "columns": ["round trip", "relay hold up / down (ms)", "MQTT round trip (ping)",
                        "cloud_only TTFT",
                        "cloud_only end-to-end", "hub time/token (engine)",
                        "cloud_only time/token (client)", "prefer_edge TTFT",
                        "prefer_edge end-to-end", "TTFT prefer_edge / cloud_only"],
            "rows": rows}  # fmt: skip


def _crossover_table(
    results: dict[str, dict[str, dict[str, Any]]],
    rtts: Sequence[float],
    p: float,
    crossover: Callable[..., Any],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows, data = [], []
    for rtt in rtts:
        key = f"{rtt:g}"
        hub = results["cloud_only"][key].get("hub_s_per_token")
        draft = results["prefer_edge"][key].get("client_s_per_token")
        if hub is None or draft is None:
            rows.append([f"{rtt:g} ms"] + ["-"] * 7)
            continue
        c = crossover(p, rtt / 1e3, hub, draft)
        data.append({"rtt_ms": rtt, "hub_s": hub, "draft_s": draft, "best_k": c.best_k,
                     "threshold_s": c.threshold_s, "predicted_s": c.predicted_s_per_token,
                     "wins": c.wins, "max_rtt_s": c.max_rtt_s, "source": c.source})  # fmt: skip
        rows.append([
            f"{rtt:g} ms", _ms(hub), _ms(draft), str(c.best_k), _ms(c.threshold_s),
            _ms(c.predicted_s_per_token), "yes" if c.wins else "no", _ms(c.max_rtt_s),
        ])  # fmt: skip
    table = {
        "title": f"The crossover (predicted, agreement p = {p:.3f}): speculative decoding "
                 "wins when the hub's time per token exceeds h* = (rtt + k d) / (E - 1)",
        "columns": ["round trip", "hub time/token h", "device time/token d", "best k", "h*",
                    "predicted speculative time/token", "speculative wins",
                    "longest round trip it wins at"],
        "rows": rows,
    }  # fmt: skip
    return table, data


def report(
    *,
    results: dict[str, dict[str, dict[str, Any]]],
    rtts: Sequence[float],
    models: Any,
    agreement: dict[str, Any],
    agreement_from: str,
    relay_holds: dict[str, dict[str, float | None]],
    pings: dict[str, float | None],
    notes: list[str],
    quick: bool,
    prompts: int,
    max_tokens: int,
    crossover: Callable[..., Any],
    quality: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The part's result: targets beside their figures, tables, notes, and the raw data
    (``results`` per row and round trip, ``quality``: the handoff+budget measure's own)."""
    p = float(agreement["agreement"])
    cross_table, cross_data = _crossover_table(results, rtts, p, crossover)
    wins_below = max((c["max_rtt_s"] for c in cross_data), default=None)
    source = cross_data[0]["source"] if cross_data else "inline"
    for rows in results.values():
        for row in rows.values():
            row.pop("texts", None)  # compared in the run; not kept in the file
    params = models.report.get("params", {})
    summary = (
        f"{'QUICK MODE (the tiny pair): ' if quick else ''}Hub model "
        f"{params.get('hub', '?')} parameters (FP32, CPU) in one embedded hub in its own "
        f"process, its MQTT text front on Mosquitto (loopback); the device "
        f"({params.get('device', '?')} parameters) behind a user-space delay relay holding "
        f"every byte half the round trip each way (this kernel has no sch_netem: "
        f"'Specified qdisc kind is unknown'). {prompts} held-out prompts, {max_tokens} "
        "greedy tokens each, per preset and round trip, after one warm-up turn. TTFT and "
        "end-to-end from the call at the client; the hub's time per token at its engine."
    )
    return {
        "part": "text-collab",
        "title": "(i) Text collaboration across a delayed link",
        "summary": summary,
        "targets": [
            _ttft_target(results),
            _hub_target(results, quick),
            *spec_targets(results, cross_data, p, quick),
            *quality_targets(quality, quick),
        ],
        "tables": [
            _latency_table(results, rtts, relay_holds, pings),
            cross_table,
            spec_table(results, rtts, cross_data),
            *quality_tables(quality, quick),
        ],
        "plots": [],
        "notes": [
            f"Device/hub greedy next-token agreement p = {p:.4f} over "
            f"{agreement.get('positions')} teacher-forced held-out positions "
            f"({agreement_from}); device accuracy {agreement.get('device_accuracy')}, hub "
            f"{agreement.get('hub_accuracy')}. The hub's argmax takes "
            f"{agreement.get('hub_distinct')} distinct tokens, the most common at "
            f"{agreement.get('hub_top_share')} of the positions: a weak hub whose choices "
            "are concentrated is agreed with more easily, so p says as much about the hub's "
            "training as about the distillation. The crossover assumes positions agree "
            "independently with probability p and one hub pass per verification.",
            "Crossover: "
            + (
                "no round trip timed"
                if wins_below is None
                else f"speculative decoding is predicted to win below a round trip of "
                f"{wins_below * 1e3:.1f} ms at the best draft length"
            )
            + f" (formula: {source}; "
            + (
                "edge_agent.language.crossover"
                if source == "edge_agent"
                else "computed inline until edge_agent.language.crossover lands"
            )
            + ").",
            "MQTT round trip (ping): a client behind the relay publishes to a topic it "
            "subscribes to (QoS 0) and times the message's return, the median of 20: the "
            "link's own round trip, which the relay lengthens by the nominal round trip.",
            "TTFT of cloud_only includes the round trip, the hub's prefill of the prompt and "
            "its first decode step; prefer_edge's is the device's own prefill and first step, "
            "with no link in the way.",
            "cloud_only's time per token at the client passes through the hub's MQTT chunk "
            "coalescing as shipped (Coalescing(max_delay_s=0.02): a chunk at most every 20 ms),"
            " which would hide a hub faster than that; the crossover uses the engine's figure.",
            *spec_notes(results, p),
            *_quality_notes(quality, quick),
            *notes,
        ],
        "data": {
            "results": results,
            "agreement": agreement,
            "crossover": cross_data,
            "relay_holds_ms": relay_holds,
            "mqtt_round_trip_s": pings,
            "rtts_ms": list(rtts),
            "quick": quick,
            "quality": quality,
        },
    }


def _quality_notes(quality: dict[str, Any] | None, quick: bool) -> list[str]:
    if quality is None or "error" in quality:
        return []
    turns, settings = quality["turns"], quality["settings"]
    pair = "the tiny pair" if quick else "the default pair, build_language_models()"
    return [
        "Handoff + budget (bench._text_collab_measure.measure_text_collaboration, run once "
        f"before the links on {pair}): the quality is "
        "link-independent, since it replays the device's and the hub's own steps on "
        "held-out text and a round trip changes when tokens arrive, not which. "
        f"{turns['calibration']} calibration and {turns['test']} test turns of "
        f"{settings['max_tokens']} tokens (window score {settings['score']}, window "
        f"{settings['window']}, {turns['other']} turns of training documents for the shift, "
        f"{turns['router_fit']} to fit the learned router), {quality['seconds']} s. "
        "(a) teacher-forced next-token accuracy grades against the real text; (b) the hub's "
        "log-likelihood of the spliced greedy continuation grades what a user reads, by the "
        "hub's own opinion. Gap recovered = (Q - Q edge only) / (Q hub only - Q edge only); "
        "± is a bootstrap standard error over the test turns.",
    ]
