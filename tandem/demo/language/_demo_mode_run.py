"""Running the ``tandem demo --llm`` modes through a live agent and hub (``ModeRun``).

``ModeRun.run`` warms the agent up (a few edge turns, which measure this
device's rates, a hub turn and, for the speculative mode, a speculative turn;
none is counted), then runs each preset the modes show once on every shown
prompt, ``edge_only`` and ``cloud_only`` first, so every later turn's text is
compared with the hub's own on the same prompt (``hub_agreement``).

``handoff`` runs under a ``HandoffPolicy`` holding a budget of the hub's
share of generated tokens (``unit="tokens"``, the window score
``HANDOFF_SCORE`` over ``handoff_window(max_tokens)`` tokens): first the
calibration prompts run on the device with the policy only watching
(``edge_only`` with ``handoff=``: each leaves a trace), ``calibrate_traces``
sets its threshold from them, then the shown prompts run with it handing off
and adapting. ``speculative`` runs with the agent's own adaptive draft length;
the hub's verifier counts its forward passes (``spec_forwards``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cloud_hub import Hub
from edge_agent import EdgeAgent, EdgeError, HandoffPolicy
from edge_agent.language import Preset, SpecStats, predicted_ms

from ._demo_modes import (
    CollaborativeFacts,
    SpeculativeFacts,
    collaborative_facts,
    hub_ms_per_token,
    modes_of,
    presets_to_run,
    speculative_facts,
    split_calibration,
)
from ._demo_prompts import HeldoutPrompt, heldout_prompts
from ._demo_stats import PresetSummary, TurnFacts, summarize_preset, token_agreement, turn_side
from ._errors import LanguageDemoError

__all__ = [
    "AUTO_DEADLINE_PERCENTILE",
    "HANDOFF_SCORE",
    "ModeResults",
    "ModeRun",
    "auto_deadline_ms",
    "handoff_window",
    "spec_forwards",
]

Progress = Callable[[str, float], None]
AUTO_DEADLINE_PERCENTILE = 40.0
HANDOFF_SCORE = "mean_entropy"  # the quality measure's pick (docs/language-models.md)
_WARMUP_EDGE_TURNS = 3
_CLOUD_ROUTES = ("heavy", "cloud_only", "prefer_cloud")


def handoff_window(max_tokens: int) -> int:
    """The handoff policy's window: 4 tokens (the quality measure's), at most half a turn
    so that a handed-off turn leaves the hub something to write."""
    return max(1, min(4, max_tokens // 2))


def spec_forwards(hub: Hub) -> int | None:
    """The hub verifier's forward passes so far (``None``: no speculative front)."""
    front = hub.spec_front
    return None if front is None else int(front.stats().get("verify_forwards", 0))


@dataclass
class ModeResults:
    """What the modes ran: per preset its summary and turns, and the modes' own figures."""

    presets: list[PresetSummary]
    turns: dict[str, list[TurnFacts]]
    prompts: list[HeldoutPrompt]
    calibration: list[HeldoutPrompt]
    deadline_ms: float
    device_rates: dict[str, float]
    collaborative: CollaborativeFacts | None = None
    speculative: SpeculativeFacts | None = None
    notes: list[str] = field(default_factory=list)


class ModeRun:
    """One agent, its hub and the demo's settings (an ``LlmDemoConfig``): ``run`` the modes."""

    def __init__(self, agent: EdgeAgent, hub: Hub, config: Any, report: Progress) -> None:
        self.agent, self.hub, self.config, self.progress = agent, hub, config, report
        self.max_tokens = int(config.max_tokens)

    def run(self, documents: dict[str, str]) -> ModeResults:
        modes = modes_of(self.config.mode)
        shown, calibration = self._prompts(documents, "collaborative" in modes)
        self._warm_up(shown, "speculative" in modes)
        names = presets_to_run(modes)
        turns: dict[str, list[TurnFacts]] = {}
        ids: dict[str, list[tuple[int, ...]]] = {}
        specs: list[SpecStats] = []
        deadline, policy, calibrated, forwards = math.nan, None, math.nan, None
        for name in names:
            bound = None
            if name == Preset.PREFER_EDGE.value:
                deadline = self._deadline(shown)
                bound = deadline
            if name == Preset.HANDOFF.value:
                policy, calibrated = self._calibrate(calibration)
            before = spec_forwards(self.hub) if name == Preset.SPECULATIVE.value else None
            stage = f"preset {name}"
            self.progress(stage, 0.0)
            turns[name], ids[name] = [], []
            for i, prompt in enumerate(shown):
                watch = policy if name == Preset.HANDOFF.value else None
                facts, record = self._turn(prompt, bound, name, watch)
                turns[name].append(facts)
                ids[name].append(tuple(record.output_ids))
                if record.speculation is not None:
                    specs.append(record.speculation)
                self.progress(stage, (i + 1) / len(shown))
            if before is not None:
                after = spec_forwards(self.hub)
                forwards = None if after is None else after - before
        if "cloud_only" in ids:
            turns = _with_hub_agreement(turns, ids, ids["cloud_only"])
        summaries = [summarize_preset(name, facts) for name, facts in turns.items()]
        by_name = {s.preset: s for s in summaries}
        rates = self.agent.language.rates if self.agent.language is not None else None
        results = ModeResults(
            presets=summaries, turns=turns, prompts=shown, calibration=calibration,
            deadline_ms=deadline, device_rates={} if rates is None else {
                "prefill": rates.prefill_tokens_per_s, "decode": rates.decode_tokens_per_s,
            },
        )  # fmt: skip
        if policy is not None:
            results.collaborative = collaborative_facts(
                by_name, turns["handoff"], policy=policy, calibrated_threshold=calibrated,
                calibration_prompts=len(calibration),
            )  # fmt: skip
        if "speculative" in turns:
            results.speculative = self._speculative(
                by_name, turns["cloud_only"], ids, specs, forwards, rates
            )
        return results

    def _prompts(
        self, documents: dict[str, str], calibrate: bool
    ) -> tuple[list[HeldoutPrompt], list[HeldoutPrompt]]:
        runtime = self.agent.language
        assert runtime is not None
        extra = self.config.calibration_prompts if calibrate else 0
        try:
            prompts = heldout_prompts(
                documents, count=self.config.prompts + extra, max_tokens=self.max_tokens,
                context=runtime.context_length, encode=runtime.encode, decode=runtime.decode,
            )  # fmt: skip
            return split_calibration(prompts, extra)
        except ValueError as e:
            raise LanguageDemoError(str(e)) from e

    def _warm_up(self, prompts: list[HeldoutPrompt], speculative: bool) -> None:
        stage = "warm up (rates measured)"
        steps = _WARMUP_EDGE_TURNS + 1 + int(speculative)
        self.progress(stage, 0.0)
        for i, prompt in enumerate(prompts[:_WARMUP_EDGE_TURNS]):
            self._turn(prompt, None, Preset.EDGE_ONLY.value)
            self.progress(stage, (i + 1) / steps)
        self._turn(prompts[0], None, Preset.CLOUD_ONLY.value)
        if speculative:  # the verifier's session and the device's drafting path
            self._turn(prompts[0], None, Preset.SPECULATIVE.value)
        self.progress(stage, 1.0)

    def _deadline(self, prompts: list[HeldoutPrompt]) -> float:
        # The rates as the agent routes by them now: the edge_only turns refined them.
        runtime = self.agent.language
        rates = None if runtime is None else runtime.rates
        if rates is None:
            raise LanguageDemoError("the edge turns did not measure the device's rates")
        return self.config.deadline_ms or auto_deadline_ms(prompts, self.max_tokens, rates)

    def _calibrate(self, calibration: list[HeldoutPrompt]) -> tuple[HandoffPolicy, float]:
        """A token-budget policy, calibrated on the calibration prompts' device turns."""
        policy = HandoffPolicy(
            HANDOFF_SCORE, window=handoff_window(self.max_tokens), budget=self.config.budget,
            unit="tokens",
        )  # fmt: skip
        stage = "calibrate the handoff policy"
        self.progress(stage, 0.0)
        for i, prompt in enumerate(calibration):
            self._turn(prompt, None, Preset.EDGE_ONLY.value, policy)
            self.progress(stage, (i + 1) / len(calibration))
        if not policy.measured:
            raise LanguageDemoError("no calibration turn left a trace to calibrate on")
        try:
            policy.calibrate_traces()
        except ValueError as e:
            raise LanguageDemoError(f"calibrating the handoff policy failed: {e}") from e
        return policy, policy.threshold

    def _speculative(
        self,
        rows: dict[str, PresetSummary],
        cloud_turns: list[TurnFacts],
        ids: dict[str, list[tuple[int, ...]]],
        specs: list[SpecStats],
        forwards: int | None,
        rates: Any,
    ) -> SpeculativeFacts:
        cloud, spec = rows["cloud_only"], rows["speculative"]
        identical = [a == b for a, b in zip(ids["speculative"], ids["cloud_only"], strict=True)]
        decode = None if rates is None else rates.decode_tokens_per_s
        return speculative_facts(
            specs, identical, generated_tokens=spec.tokens, hub_forward_passes=forwards,
            hub_ms_per_token=hub_ms_per_token(cloud_turns),
            draft_ms_per_token=_ms_per_token(decode),
            total_ms=spec.total_p50_ms, cloud_total_ms=cloud.total_p50_ms,
        )  # fmt: skip

    def _turn(
        self,
        prompt: HeldoutPrompt,
        deadline_ms: float | None,
        preset: str,
        handoff: HandoffPolicy | None = None,
    ) -> tuple[TurnFacts, Any]:
        """One turn, read to its end: what it produced, by side, and its record."""
        try:
            stream = self.agent.generate(
                prompt.text, max_tokens=self.max_tokens, deadline_ms=deadline_ms,
                preset=preset, handoff=handoff,
            )  # fmt: skip
            record = stream.final()
        except EdgeError as e:
            raise LanguageDemoError(f"a {preset} turn failed: {e}") from e
        facts = TurnFacts(
            prompt_tokens=record.prompt_tokens,
            output_tokens=len(record.output_ids),
            edge_tokens=record.edge_tokens,
            cloud_tokens=record.cloud_tokens,
            side=turn_side(record.edge_tokens, record.cloud_tokens, record.reason in _CLOUD_ROUTES),
            agreement=token_agreement(record.output_ids, prompt.reference_ids),
            ttft_ms=record.time_to_first_token_ms,
            tokens_per_s=record.tokens_per_s,
            total_ms=record.total_ms,
            finish_reason=record.finish_reason.value,
            route_reason=record.reason,
            degraded=record.degraded,
            handoff_at=record.handoff_at,
        )
        return facts, record


def auto_deadline_ms(prompts: list[HeldoutPrompt], max_tokens: int, rates: Any) -> float:
    """The 40th percentile of the prompts' predicted prefill + decode times on this device.

    Below the median: the agent refines its rates with every turn (they rise as
    the runtime warms), so a deadline at the median would leave few prompts heavy.
    """
    from ._demo_stats import percentile

    times = [predicted_ms(len(p.prompt_ids), max_tokens, rates) for p in prompts]
    return percentile([t for t in times if t is not None], AUTO_DEADLINE_PERCENTILE)


def _with_hub_agreement(
    turns: dict[str, list[TurnFacts]],
    ids: dict[str, list[tuple[int, ...]]],
    hub: list[tuple[int, ...]],
) -> dict[str, list[TurnFacts]]:
    """Every turn with its agreement with cloud_only's tokens on the same prompt."""
    return {
        name: [
            replace(t, hub_agreement=token_agreement(out, ref))
            for t, out, ref in zip(facts, ids[name], hub, strict=True)
        ]
        for name, facts in turns.items()
    }


def _ms_per_token(rate: float | None) -> float:
    return math.inf if rate is None or not rate > 0 else 1e3 / rate
