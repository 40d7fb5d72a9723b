"""What a hub operator and a client choose about a turn: limits (``generation``) and sampling."""

from __future__ import annotations

from dataclasses import dataclass

from ._conversations import ConversationLimits

__all__ = ["GenerationLimits", "Sampling"]


@dataclass(frozen=True, kw_only=True)
class GenerationLimits:
    """Per-turn limits and the engine's admission bounds (``generation`` in config.json)."""

    max_prompt_tokens: int | None = None  # None: the model's context length - 1
    max_output_tokens: int = 256
    max_wall_s: float = 60.0  # seconds in the engine, from the turn's begin
    max_queue: int = 64  # turns waiting for a slot; beyond it: overloaded
    max_active: int | None = None  # turns in the engine at once; None: its batch size
    batch_wait_ms: float = 0.0  # a new Engine batch gathers turns this long (free slots)
    max_conversations: int = 64  # conversations kept between turns (LRU); 0: none
    conversation_ttl_s: float = 600.0  # a kept conversation unused this long is dropped
    max_conversation_tokens: int | None = None  # a kept conversation's cache; None: context

    def __post_init__(self) -> None:
        ints = {
            "max_output_tokens": self.max_output_tokens,
            "max_queue": self.max_queue,
            **({"max_prompt_tokens": self.max_prompt_tokens} if self.max_prompt_tokens else {}),
            **({"max_active": self.max_active} if self.max_active is not None else {}),
        }
        for name, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"generation.{name} must be a whole number >= 1, got {value!r}")
        if not isinstance(self.max_wall_s, int | float) or not self.max_wall_s > 0:
            raise ValueError(f"generation.max_wall_s must be > 0, got {self.max_wall_s!r}")
        if not isinstance(self.batch_wait_ms, int | float) or not self.batch_wait_ms >= 0:
            raise ValueError(f"generation.batch_wait_ms must be >= 0, got {self.batch_wait_ms!r}")
        self.conversations  # noqa: B018 (validates them)

    @property
    def conversations(self) -> ConversationLimits:
        return ConversationLimits(
            max_conversations=self.max_conversations,
            idle_ttl_s=self.conversation_ttl_s,
            max_tokens=self.max_conversation_tokens,
        )

    @classmethod
    def from_json(cls, data: object, where: str) -> GenerationLimits:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"{where}: generation must be an object")
        unknown = sorted(set(data) - {f.name for f in cls.__dataclass_fields__.values()})
        if unknown:
            raise ValueError(f"{where}: generation: unknown key {unknown[0]!r}")
        try:
            return cls(**data)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Greedy unless ``temperature`` > 0; then top-p sampling (``seed`` is not applied yet)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
