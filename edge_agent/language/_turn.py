"""Starting a turn: checks, the preset's route, the stream. Shared by both agents.

Everything here runs at call time, before any token: an invalid prompt,
``max_tokens``, sampling or deadline raises ``InvalidInputError``, a preset
that needs the hub raises ``TextOffloadUnavailableError``, and the prompt
is tokenized. The model runs (or the turn is sent to the hub) when the
stream is first read.

Text offload is there when the agent has a broker and a
``cloud_language_model`` (``CloudAccess``): ``prefer_cloud``, ``cloud_only``
and a heavy ``prefer_edge`` turn go to the hub; the first two of those and
the heavy one may fall back to the device (``CloudPlan.fallback``),
``cloud_only`` may not.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared import (
    MAX_DRAFTS,
    ConfigError,
    GenerateRequest,
    Limits,
    TextSampling,
    Topics,
    new_request_id,
    validate_name,
)

from .._errors import InvalidInputError, ModelLoadError
from .._input_values import check_deadline
from ._chat import Conversation
from ._cloud import CloudPlan, CloudTextSettings, TextLink
from ._draft_length import DraftLength
from ._generation import Sampling
from ._handoff import Handoff, HandoffPolicy
from ._presets import Preset, TextRoute, route_text
from ._runtime import LanguageRuntime
from ._spec_link import SpecLink
from ._speculative import DraftControl, SpecPlan, SpecStream
from ._stream import TextStream

if TYPE_CHECKING:
    from .._device_link import DeviceLink

__all__ = ["CloudAccess", "start_chat", "start_generate"]


@dataclass(frozen=True)
class CloudAccess:
    """The agent's way to the hub for text: its link, device id and the hub's model name."""

    link: TextLink
    device_id: str
    model: str
    settings: CloudTextSettings
    spec: SpecLink | None = None  # speculative rounds (verify topics)
    draft_length: DraftControl = field(default_factory=lambda: DraftLength(ahead=True))

    @classmethod
    def open(
        cls, link: DeviceLink, device_id: str, model: str, *, topics: Topics | None,
        limits: Limits | None, settings: CloudTextSettings | None,
    ) -> CloudAccess:  # fmt: skip
        """Listen on the device's text topic (subscribed with its reply topic on every
        connection, so before any turn is published on it); ``InvalidInputError`` for a
        model name that cannot be a topic level."""
        try:
            validate_name(model, "cloud_language_model")
        except ConfigError as e:
            raise InvalidInputError(str(e)) from e
        text_link = TextLink(link, device_id, topics=topics, limits=limits)
        text_link.attach()
        spec = SpecLink(link, device_id, topics=topics, limits=limits)
        spec.attach()
        return cls(text_link, device_id, model, settings or CloudTextSettings(), spec)

    def detach(self) -> None:
        self.link.detach()
        if self.spec is not None:
            self.spec.detach()


def _checked(
    runtime: LanguageRuntime | None,
    max_tokens: object,
    sampling: Sampling | None,
    deadline_ms: object,
) -> tuple[LanguageRuntime, int, Sampling, float | None]:
    if runtime is None:
        raise ModelLoadError(
            "this agent has no language model: give language_model= (an ONNX Runtime GenAI "
            "model folder) to the agent"
        )
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if sampling is None:
        sampling = Sampling()
    elif not isinstance(sampling, Sampling):
        raise InvalidInputError(f"sampling must be a Sampling, got {type(sampling).__name__}")
    deadline = None if deadline_ms is None else check_deadline(deadline_ms)
    return runtime, max_tokens, sampling, deadline


def _stream(
    runtime: LanguageRuntime,
    ids: list[int],
    prompt_total: int,
    *,
    max_tokens: int,
    sampling: Sampling,
    deadline_ms: float | None,
    preset: str,
    conversation: Conversation | None,
    cloud: CloudAccess | None,
    prompt_text: str,
    handoff: HandoffPolicy | None = None,
    draft_length: int | DraftControl | None = None,
) -> TextStream:
    if prompt_total >= runtime.context_length:
        raise InvalidInputError(
            f"the prompt is {prompt_total} tokens, the model's context is {runtime.context_length}"
        )
    chosen = Preset.parse(preset)
    route = route_text(
        chosen,
        prompt_tokens=prompt_total,
        max_tokens=max_tokens,
        deadline_ms=deadline_ms,
        rates=runtime.rates,
        offload_available=cloud is not None,
    )
    if chosen is Preset.SPECULATIVE:
        return _speculative(runtime, ids, max_tokens=max_tokens, sampling=sampling,
                            deadline_ms=deadline_ms, route=route, conversation=conversation,
                            cloud=cloud, handoff=handoff, draft_length=draft_length)  # fmt: skip
    plan = None
    if route.side == "cloud":
        assert cloud is not None
        plan = _plan(cloud, prompt_text, max_tokens, sampling, deadline_ms, conversation, route)
    splice = None
    if handoff is not None or chosen is Preset.HANDOFF:
        if not runtime.logits:
            raise InvalidInputError(
                f"handoff= needs a runtime that gives logits; {runtime.kind} does not"
            )
        splice = _splice(chosen, handoff, conversation, cloud, sampling, route)
    return TextStream(
        runtime, ids, max_tokens=max_tokens, sampling=sampling, deadline_ms=deadline_ms,
        preset=chosen.value, route=route, conversation=conversation, cloud=plan,
        handoff=splice,
    )  # fmt: skip


def _speculative(
    runtime: LanguageRuntime,
    ids: list[int],
    *,
    max_tokens: int,
    sampling: Sampling,
    deadline_ms: float | None,
    route: TextRoute,
    conversation: Conversation | None,
    cloud: CloudAccess | None,
    handoff: HandoffPolicy | None,
    draft_length: int | DraftControl | None,
) -> SpecStream:
    """A ``speculative`` turn: refused at call time where it cannot run as documented."""
    if conversation is not None:
        raise InvalidInputError("preset 'speculative' is for generate(); chat turns cannot use it")
    if handoff is not None:
        raise InvalidInputError("preset 'speculative' takes no handoff=")
    if not (runtime.resumable and runtime.logits):
        raise InvalidInputError(
            f"preset 'speculative' needs a runtime that rewinds; {runtime.kind} does not"
        )
    if draft_length is None:  # the agent's own, learning the link across turns
        draft_length = cloud.draft_length if cloud is not None else 4
    if isinstance(draft_length, bool) or (
        isinstance(draft_length, int) and not 0 <= draft_length <= MAX_DRAFTS
    ):
        raise InvalidInputError(f"draft_length must be 0..{MAX_DRAFTS}, got {draft_length!r}")
    plan = None
    if cloud is not None and cloud.spec is not None:
        plan = SpecPlan(cloud.spec, cloud.device_id, cloud.model, cloud.settings, draft_length)
    return SpecStream(
        runtime, ids, max_tokens=max_tokens, sampling=sampling, deadline_ms=deadline_ms,
        preset=Preset.SPECULATIVE.value, route=route, plan=plan,
    )  # fmt: skip


def _splice(
    chosen: Preset,
    handoff: HandoffPolicy | None,
    conversation: Conversation | None,
    cloud: CloudAccess | None,
    sampling: Sampling,
    route: TextRoute,
) -> Handoff:
    """The turn's watch, and how it reaches the hub (``None``: it only measures its peak)."""
    if not isinstance(handoff, HandoffPolicy):
        raise InvalidInputError(
            f"preset 'handoff' needs handoff=HandoffPolicy(...), got {handoff!r}"
        )
    if chosen is not Preset.HANDOFF or cloud is None or route.side != "edge":
        return Handoff(handoff.watch(observe=False), None)

    def to_hub(ids: list[int], max_tokens: int, deadline_ms: float | None) -> CloudPlan:
        if conversation is not None:  # the hub reads the whole dialogue, as ids
            ids = conversation._hand_off(ids)
        return _plan(cloud, "", max_tokens, sampling, deadline_ms, None, route, prompt_ids=ids)

    return Handoff(handoff.watch(), to_hub)


def _plan(
    cloud: CloudAccess,
    prompt_text: str,
    max_tokens: int,
    sampling: Sampling,
    deadline_ms: float | None,
    conversation: Conversation | None,
    route: TextRoute,
    *,
    prompt_ids: list[int] | None = None,
) -> CloudPlan:
    wire = TextSampling()
    if not sampling.greedy:
        wire = TextSampling(
            temperature=float(sampling.temperature or 1.0), top_p=sampling.top_p,
            top_k=sampling.top_k, seed=sampling.seed,
        )  # fmt: skip
    request = GenerateRequest(
        request_id=new_request_id(), model=cloud.model, max_tokens=max_tokens,
        prompt=None if prompt_ids is not None else prompt_text, sampling=wire,
        prompt_ids=None if prompt_ids is None else tuple(prompt_ids),
        device_id=cloud.device_id, timeout_ms=deadline_ms,
        sent_at_ms=time.time() * 1000.0,
        conversation=None if conversation is None else conversation.id,
        turn=None if conversation is None else conversation.turns,
    )  # fmt: skip
    return CloudPlan(
        cloud.link, request, cloud.settings, fallback=route.reason != "cloud_only",
        hub=None if conversation is None else conversation.hub,
    )  # fmt: skip


def start_generate(
    runtime: LanguageRuntime | None,
    prompt: str,
    *,
    max_tokens: int,
    sampling: Sampling | None,
    deadline_ms: float | None,
    preset: str,
    cloud: CloudAccess | None = None,
    handoff: HandoffPolicy | None = None,
    draft_length: int | DraftControl | None = None,
) -> TextStream:
    model, max_tokens, sampling, deadline = _checked(runtime, max_tokens, sampling, deadline_ms)
    if not isinstance(prompt, str) or not prompt:
        raise InvalidInputError(f"the prompt must be non-empty text, got {prompt!r}")
    if not prompt.isascii():
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInputError(
                f"the prompt is not valid Unicode (a lone surrogate?): {e}"
            ) from e
    ids = model.encode(prompt)
    if not ids:
        raise InvalidInputError("the prompt encodes to no tokens")
    return _stream(
        model, ids, len(ids), max_tokens=max_tokens, sampling=sampling, deadline_ms=deadline,
        preset=preset, conversation=None, cloud=cloud, prompt_text=prompt, handoff=handoff,
        draft_length=draft_length,
    )  # fmt: skip


def start_chat(
    runtime: LanguageRuntime | None,
    messages: Sequence[Mapping[str, str]],
    conversation: Conversation | None,
    *,
    max_tokens: int,
    sampling: Sampling | None,
    deadline_ms: float | None,
    preset: str,
    cloud: CloudAccess | None = None,
    handoff: HandoffPolicy | None = None,
) -> TextStream:
    model, max_tokens, sampling, deadline = _checked(runtime, max_tokens, sampling, deadline_ms)
    if conversation is None:
        conversation = Conversation()
    elif not isinstance(conversation, Conversation):
        raise InvalidInputError(
            f"conversation must be a Conversation, got {type(conversation).__name__}"
        )
    text = conversation._open_turn(messages)
    try:
        ids = model.encode(text)
        return _stream(
            model, ids, len(conversation.history) + len(ids), max_tokens=max_tokens,
            sampling=sampling, deadline_ms=deadline, preset=preset, conversation=conversation,
            cloud=cloud,
            prompt_text=model.decode(conversation.history) + text if cloud is not None else text,
            handoff=handoff,
        )  # fmt: skip
    except BaseException:
        conversation._abort_turn(keep_state=True)  # refused before it ran
        raise
