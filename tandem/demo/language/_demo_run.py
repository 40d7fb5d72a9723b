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

``mode`` (``_demo_modes``) picks what runs: ``presets`` (the above, the
default), ``collaborative`` (``edge_only``, ``cloud_only`` and ``handoff``
under a budget of hub tokens, the policy calibrated first on
``calibration_prompts`` held-out prompts that are not shown;
``_demo_mode_run``), ``speculative`` (``cloud_only`` and ``speculative``) or
``all``; every preset runs once on the same prompts, the references first.
No printing here: the CLI renders.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_hub import Hub, HubError
from edge_agent import EdgeAgent, EdgeError
from edge_agent.language import Preset
from shared import MqttSettings, Topics

from ...broker import EmbeddedBroker
from ._demo_mode_run import ModeRun
from ._demo_modes import (
    MODE_ROWS,
    MODES,
    CollaborativeFacts,
    SpeculativeFacts,
    modes_of,
)
from ._demo_prompts import HeldoutPrompt
from ._demo_stats import PresetSummary, TurnFacts
from ._errors import LanguageDemoError

__all__ = ["HUB_MODEL", "PRESETS", "LlmDemoConfig", "LlmDemoReport", "serve_and_run"]

Progress = Callable[[str, float], None]
HUB_MODEL = "pydoc-lm"  # the hub model's name in the hub's repository
PRESETS = (Preset.EDGE_ONLY, Preset.CLOUD_ONLY, Preset.PREFER_EDGE)


@dataclass(frozen=True, kw_only=True)
class LlmDemoConfig:
    prompts: int = 24
    max_tokens: int = 24
    deadline_ms: float | None = None  # prefer_edge's; None: 40th pct of predicted device times
    broker_url: str | None = None  # None: start the embedded amqtt broker
    cache_dir: Path | None = None
    recipe: Any = None  # a tandem.demo.language.LanguageRecipe; None: the default recipe
    topic_prefix: str = "tandem/demo-llm"
    mode: str = "presets"  # one of _demo_modes.MODES
    budget: float = 0.3  # collaborative: the hub's share of generated tokens
    calibration_prompts: int = 16  # collaborative: prompts the policy calibrates on (not shown)

    def __post_init__(self) -> None:
        problems = [
            f"{name} {value!r}"
            for name, value, ok in (
                ("prompts", self.prompts, self.prompts >= 1),
                ("max_tokens", self.max_tokens, self.max_tokens >= 1),
                ("deadline_ms", self.deadline_ms, self.deadline_ms is None or self.deadline_ms > 0),
                ("mode", self.mode, self.mode in MODES),
                ("budget", self.budget, 0.0 <= self.budget <= 1.0),
                ("calibration_prompts", self.calibration_prompts, self.calibration_prompts >= 1),
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
    mode: str = "presets"
    collaborative: CollaborativeFacts | None = None
    speculative: SpeculativeFacts | None = None
    calibration: list[HeldoutPrompt] = field(default_factory=list)  # collaborative's, not shown

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes this run shows, in order (``mode`` "all": every one)."""
        return modes_of(self.mode)

    def preset(self, name: str) -> PresetSummary:
        """The summary of preset ``name``; ``ValueError`` if this run did not run it."""
        found = [p for p in self.presets if p.preset == name]
        if not found:
            raise ValueError(f"preset {name!r} did not run in mode {self.mode!r}")
        return found[0]

    def rows(self, mode: str) -> list[PresetSummary]:
        """One mode's table rows (``MODE_ROWS``)."""
        return [self.preset(name) for name in MODE_ROWS[mode]]

    def to_dict(self) -> dict[str, Any]:
        """``llm_report.json``: settings, per-preset figures, every turn, the models' report;
        ``modes``: per mode shown, its rows (preset names) and the figures it adds."""
        modes: dict[str, Any] = {m: {"rows": list(MODE_ROWS[m])} for m in self.modes}
        if self.collaborative is not None:
            modes["collaborative"].update(self.collaborative.to_dict())
        if self.speculative is not None:
            modes["speculative"].update(self.speculative.to_dict())
        return {
            "mode": self.mode,
            "modes": modes,
            "calibration_prompt_ids": [list(p.prompt_ids) for p in self.calibration],
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
    """Run the modes' presets on held-out prompts through a broker, a hub and an agent
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
                results = ModeRun(agent, hub, config, report).run(heldout)
        finally:
            hub.stop()
    return LlmDemoReport(
        presets=results.presets,
        turns=results.turns,
        prompts=results.prompts,
        max_tokens=config.max_tokens,
        deadline_ms=results.deadline_ms,
        deadline_auto=config.deadline_ms is None,
        device_rates=results.device_rates,
        model_report=dict(models.report),
        broker=config.broker_url or "embedded amqtt",
        elapsed_s=time.perf_counter() - started,
        notes=results.notes,
        mode=config.mode,
        collaborative=results.collaborative,
        speculative=results.speculative,
        calibration=results.calibration,
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
