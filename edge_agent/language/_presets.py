"""Where a text turn runs: the presets and Tandem's heavy rule, without I/O.

The presets are the ones users know from Firebase AI Logic's hybrid API:

* ``edge_only``: the device model answers, always.
* ``prefer_edge``: the device model answers unless the turn is *heavy* (see
  below), which goes to the hub.
* ``prefer_cloud``: the hub answers; the device when the hub cannot.
* ``cloud_only``: the hub answers, always.
* ``handoff``: Tandem's own: the device model starts the turn and hands it to
  the hub mid-turn when it becomes unsure (a ``HandoffPolicy``; see
  ``_handoff``). Routed like ``prefer_edge`` (a heavy turn goes to the hub).
* ``speculative``: Tandem's own: the device model drafts, the hub's model
  verifies each round (``_speculative``); the output is the hub's. Always
  "edge" here (the device runs the loop); without a way to the hub it runs
  on the device alone and says so in the route's notes.

The **heavy rule**: a turn whose prefill and decode, predicted from this
device's measured prompt and decode rates (tokens/s), would not finish
within its deadline is heavy. Unmeasured rates (a fresh agent) or no
deadline never make a turn heavy.

``offload_available`` says whether the agent has a way to the hub for text
(a broker and ``cloud_language_model``). Without one, ``prefer_edge``
serves on the device and says so in the route's notes, ``prefer_cloud``
and ``cloud_only`` raise ``TextOffloadUnavailableError``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from .._errors import InvalidInputError, TextOffloadUnavailableError

__all__ = [
    "OFFLOAD_UNAVAILABLE",
    "DeviceRates",
    "Preset",
    "TextRoute",
    "is_heavy",
    "predicted_ms",
    "route_text",
]

OFFLOAD_UNAVAILABLE = (
    "text offload to the hub is not available: give the agent broker= and cloud_language_model="
)


class Preset(enum.StrEnum):
    EDGE_ONLY = "edge_only"
    PREFER_EDGE = "prefer_edge"
    PREFER_CLOUD = "prefer_cloud"
    CLOUD_ONLY = "cloud_only"
    HANDOFF = "handoff"
    SPECULATIVE = "speculative"

    @classmethod
    def parse(cls, value: object) -> Preset:
        try:
            return cls(str(value)) if isinstance(value, str) else cls(value)  # type: ignore[arg-type]
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise InvalidInputError(f"unknown preset {value!r}; expected one of {names}") from None


@dataclass(frozen=True, slots=True)
class DeviceRates:
    """This device's measured speeds for a language model, in tokens per second."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float


def predicted_ms(prompt_tokens: int, max_tokens: int, rates: DeviceRates | None) -> float | None:
    """Predicted prefill + decode time of a turn in ms; ``None`` while the rates are unknown."""
    if rates is None or rates.prefill_tokens_per_s <= 0 or rates.decode_tokens_per_s <= 0:
        return None
    seconds = prompt_tokens / rates.prefill_tokens_per_s + max_tokens / rates.decode_tokens_per_s
    return seconds * 1000.0


def is_heavy(
    prompt_tokens: int, max_tokens: int, deadline_ms: float | None, rates: DeviceRates | None
) -> bool:
    """True when the predicted time of the turn exceeds ``deadline_ms``."""
    if deadline_ms is None:
        return False
    predicted = predicted_ms(prompt_tokens, max_tokens, rates)
    return predicted is not None and math.isfinite(predicted) and predicted > deadline_ms


@dataclass(frozen=True, slots=True)
class TextRoute:
    """Where a turn runs (``"edge"`` or ``"cloud"``), why, and what the caller should know."""

    side: str
    reason: str  # "edge_only", "prefer_edge", "heavy", ...
    notes: tuple[str, ...] = ()


def route_text(
    preset: Preset | str,
    *,
    prompt_tokens: int,
    max_tokens: int,
    deadline_ms: float | None,
    rates: DeviceRates | None,
    offload_available: bool,
) -> TextRoute:
    """Decide where a text turn runs. Raises ``TextOffloadUnavailableError`` when only the
    hub may answer and there is no path to it."""
    preset = Preset.parse(preset)
    if preset is Preset.EDGE_ONLY:
        return TextRoute("edge", "edge_only")
    if preset is Preset.SPECULATIVE:
        notes = () if offload_available else (f"served as edge_only: {OFFLOAD_UNAVAILABLE}",)
        return TextRoute("edge", "speculative", notes)
    if preset in (Preset.PREFER_EDGE, Preset.HANDOFF):
        if not is_heavy(prompt_tokens, max_tokens, deadline_ms, rates):
            if offload_available:
                return TextRoute("edge", preset.value)
            note = f"served as edge_only: {OFFLOAD_UNAVAILABLE}"
            return TextRoute("edge", preset.value, (note,))
        if offload_available:
            return TextRoute("cloud", "heavy")
        return TextRoute(
            "edge",
            "heavy",
            (f"heavy turn kept on the device: {OFFLOAD_UNAVAILABLE}",),
        )
    if not offload_available:
        raise TextOffloadUnavailableError(f"preset {preset.value!r}: {OFFLOAD_UNAVAILABLE}")
    return TextRoute("cloud", preset.value)
