"""``tandem demo --llm``: the language-model pair through broker, hub and an edge agent.

``run_llm_demo`` builds (or loads from cache) the device and hub models,
starts an MQTT broker (in-process amqtt unless a URL is given), a hub that
serves the hub model over MQTT from a temporary repository, and one edge
agent holding the device model with the hub's model as its
``cloud_language_model``. It warms the agent up (a few edge turns, which
measure this device's prefill and decode rates, and one hub turn; none is
counted), then runs every held-out prompt under each preset: ``edge_only``,
``cloud_only`` and ``prefer_edge`` (the heavy rule: a turn whose predicted
prefill + decode on this device would miss the deadline goes to the hub).
``edge_only`` and ``cloud_only`` run without a deadline: each side alone,
unhurried, is the reference for quality and speed. ``prefer_edge`` runs
with the deadline its heavy rule needs (the agent also ends a turn at its
deadline, so a turn late on either side is cut and counted); by default
("auto") it is the 40th percentile of the prompts' predicted times on this
device, so about half of them are heavy. On one machine the hub is not faster than the
device model (it is several times larger and answers over MQTT), so a heavy
turn may end at the deadline there: the report counts those turns.
No printing here: the CLI renders.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_hub import Hub, HubError
from edge_agent import EdgeAgent, EdgeError
from edge_agent.language import Preset, predicted_ms
from shared import MqttSettings, Topics

from ...broker import EmbeddedBroker
from ._demo_prompts import HeldoutPrompt, heldout_prompts
from ._demo_stats import PresetSummary, TurnFacts, summarize_preset, token_agreement, turn_side
from ._errors import LanguageDemoError

__all__ = ["HUB_MODEL", "PRESETS", "LlmDemoConfig", "LlmDemoReport", "serve_and_run"]

Progress = Callable[[str, float], None]
HUB_MODEL = "pydoc-lm"  # the hub model's name in the hub's repository
PRESETS = (Preset.EDGE_ONLY, Preset.CLOUD_ONLY, Preset.PREFER_EDGE)
_WARMUP_EDGE_TURNS = 3
AUTO_DEADLINE_PERCENTILE = 40.0
_CLOUD_ROUTES = ("heavy", "cloud_only", "prefer_cloud")


@dataclass(frozen=True, kw_only=True)
class LlmDemoConfig:
    prompts: int = 24
    max_tokens: int = 24
    deadline_ms: float | None = None  # prefer_edge's; None: 40th pct of predicted device times
    broker_url: str | None = None  # None: start the embedded amqtt broker
    cache_dir: Path | None = None
    recipe: Any = None  # a tandem.demo.language.LanguageRecipe; None: the default recipe
    topic_prefix: str = "tandem/demo-llm"

    def __post_init__(self) -> None:
        problems = [
            f"{name} {value!r}"
            for name, value, ok in (
                ("prompts", self.prompts, self.prompts >= 1),
                ("max_tokens", self.max_tokens, self.max_tokens >= 1),
                ("deadline_ms", self.deadline_ms, self.deadline_ms is None or self.deadline_ms > 0),
            )
            if not ok
        ]
        if problems:
            raise ValueError(f"bad demo settings: {', '.join(problems)}")


@dataclass
class LlmDemoReport:
    presets: list[PresetSummary]
    turns: dict[str, list[TurnFacts]]  # by preset, in prompt order
    prompts: list[HeldoutPrompt]
    max_tokens: int
    deadline_ms: float  # prefer_edge's deadline (the other two presets run without one)
    deadline_auto: bool
    device_rates: dict[str, float]  # tokens/s, as prefer_edge's turns were routed by
    model_report: dict[str, Any]
    broker: str
    elapsed_s: float
    quality_measure: str = (
        "token agreement: share of the held-out continuation's tokens the greedy "
        "continuation reproduces at the same position"
    )
    notes: list[str] = field(default_factory=list)

    def preset(self, name: str) -> PresetSummary:
        return next(p for p in self.presets if p.preset == name)

    def to_dict(self) -> dict[str, Any]:
        """``llm_report.json``: settings, per-preset figures, every turn, the models' report."""
        return {
            "quality_measure": self.quality_measure,
            "max_tokens": self.max_tokens,
            "deadline_ms": self.deadline_ms,
            "deadline_auto": self.deadline_auto,
            "device_rates_tokens_per_s": self.device_rates,
            "presets": [p.to_dict() for p in self.presets],
            "turns": {
                name: [
                    {"document": prompt.document, **vars_of(t)}
                    for prompt, t in zip(self.prompts, turns, strict=True)
                ]
                for name, turns in self.turns.items()
            },
            "broker": self.broker,
            "models": self.model_report,
            "notes": self.notes,
            "elapsed_s": self.elapsed_s,
        }


def vars_of(turn: TurnFacts) -> dict[str, Any]:
    return {name: getattr(turn, name) for name in turn.__dataclass_fields__}


def serve_and_run(
    config: LlmDemoConfig,
    models: Any,
    heldout: dict[str, str],
    report: Progress,
    started: float,
) -> LlmDemoReport:
    """Run the three presets on held-out prompts through a broker, a hub and an agent
    (``run_llm_demo`` builds ``models`` and the held-out text first)."""
    topics = Topics(config.topic_prefix)
    with (
        tempfile.TemporaryDirectory(prefix="tandem-demo-llm-") as workdir,
        _broker(config.broker_url) as mqtt,
    ):
        repository = _hub_repository(Path(workdir), models.hub_model, config.max_tokens)
        share_group = None if config.broker_url is None else "hubs"
        try:
            hub = Hub(repository, mqtt=mqtt, topics=topics, share_group=share_group)
            hub.start()
        except HubError as e:
            raise LanguageDemoError(f"the hub did not start: {e}") from e
        try:
            with _agent(models.device_model, mqtt, topics) as agent:
                return _run_presets(agent, config, heldout, models, report, started)
        finally:
            hub.stop()


def _run_presets(
    agent: EdgeAgent,
    config: LlmDemoConfig,
    documents: dict[str, str],
    models: Any,
    report: Progress,
    started: float,
) -> LlmDemoReport:
    runtime = agent.language
    assert runtime is not None
    try:
        prompts = heldout_prompts(
            documents, count=config.prompts, max_tokens=config.max_tokens,
            context=runtime.context_length, encode=runtime.encode, decode=runtime.decode,
        )  # fmt: skip
    except ValueError as e:
        raise LanguageDemoError(str(e)) from e
    report("warm up (rates measured)", 0.0)
    for i, prompt in enumerate(prompts[:_WARMUP_EDGE_TURNS]):
        _turn(agent, prompt, config.max_tokens, None, Preset.EDGE_ONLY)
        report("warm up (rates measured)", (i + 1) / (_WARMUP_EDGE_TURNS + 1))
    _turn(agent, prompts[0], config.max_tokens, None, Preset.CLOUD_ONLY)
    report("warm up (rates measured)", 1.0)
    turns: dict[str, list[TurnFacts]] = {}
    deadline, rates = math.nan, runtime.rates
    for preset in PRESETS:
        stage = f"preset {preset.value}"
        report(stage, 0.0)
        facts = []
        bound = None
        if preset is Preset.PREFER_EDGE:
            # The rates as the agent routes by them now: the edge_only turns refined them.
            rates = runtime.rates
            if rates is None:
                raise LanguageDemoError("the edge turns did not measure the device's rates")
            deadline = config.deadline_ms or auto_deadline_ms(prompts, config.max_tokens, rates)
            bound = deadline
        for i, prompt in enumerate(prompts):
            facts.append(_turn(agent, prompt, config.max_tokens, bound, preset))
            report(stage, (i + 1) / len(prompts))
        turns[preset.value] = facts
    return LlmDemoReport(
        presets=[summarize_preset(name, facts) for name, facts in turns.items()],
        turns=turns,
        prompts=prompts,
        max_tokens=config.max_tokens,
        deadline_ms=deadline,
        deadline_auto=config.deadline_ms is None,
        device_rates={}
        if rates is None
        else {
            "prefill": rates.prefill_tokens_per_s,
            "decode": rates.decode_tokens_per_s,
        },
        model_report=dict(models.report),
        broker=config.broker_url or "embedded amqtt",
        elapsed_s=time.perf_counter() - started,
    )


def auto_deadline_ms(prompts: list[HeldoutPrompt], max_tokens: int, rates: Any) -> float:
    """The 40th percentile of the prompts' predicted prefill + decode times on this device.

    Below the median: the agent refines its rates with every turn (they rise as
    the runtime warms), so a deadline at the median would leave few prompts heavy.
    """
    from ._demo_stats import percentile

    times = [predicted_ms(len(p.prompt_ids), max_tokens, rates) for p in prompts]
    return percentile([t for t in times if t is not None], AUTO_DEADLINE_PERCENTILE)


def _turn(
    agent: EdgeAgent,
    prompt: HeldoutPrompt,
    max_tokens: int,
    deadline_ms: float | None,
    preset: Preset,
) -> TurnFacts:
    """One turn, read to its end; what it produced, by side, and what it cost."""
    try:
        stream = agent.generate(
            prompt.text, max_tokens=max_tokens, deadline_ms=deadline_ms, preset=preset.value
        )
        record = stream.final()
    except EdgeError as e:
        raise LanguageDemoError(f"a {preset.value} turn failed: {e}") from e
    return TurnFacts(
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
    )


def _hub_repository(root: Path, hub_model: Path, max_tokens: int) -> Path:
    """A one-model repository: the hub model as ``HUB_MODEL`` version 1."""
    repository = root / "repository"
    shutil.copytree(hub_model, repository / HUB_MODEL / "1")
    config = {"platform": "onnxruntime_genai", "generation": {"max_output_tokens": max_tokens}}
    (repository / HUB_MODEL / "config.json").write_text(json.dumps(config))
    return repository


@contextlib.contextmanager
def _agent(device_model: Path, mqtt: MqttSettings, topics: Topics) -> Iterator[EdgeAgent]:
    try:
        agent = EdgeAgent(
            None, device_id="llm-demo-001", broker=mqtt, language_model=device_model,
            cloud_language_model=HUB_MODEL, topics=topics,
        )  # fmt: skip
    except EdgeError as e:
        raise LanguageDemoError(f"the edge agent did not start: {e}") from e
    try:
        agent.start(wait_s=10.0)
        yield agent
    finally:
        agent.close()


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[MqttSettings]:
    if url is not None:
        yield MqttSettings.from_url(url)
        return
    with EmbeddedBroker() as broker:
        # amqtt speaks MQTT 3.1.1 only: say so rather than probe for 5.
        yield MqttSettings.from_url(broker.url, protocol="3.1.1")
