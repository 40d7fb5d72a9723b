"""A text turn as a stream of chunks, then a final record.

``TextStream`` (an iterator) and ``AsyncTextStream`` (its async twin, which
runs each step in a worker thread) produce ``TextChunk``s: text decoded
incrementally by ONNX Runtime GenAI's tokenizer stream, so a character split
over several byte-level BPE tokens arrives whole, in one chunk, never as
U+FFFD. A token that completes no character yields no chunk; the next
chunk counts it (``tokens``).

The turn ends by itself at the end-of-sequence token (``stop``), at
``max_tokens`` or the model's context length (``length``) or past its
deadline (``deadline``, checked before every step, the first included), or
when the caller closes the stream (``cancelled``; leaving a ``for`` loop
early and garbage collection do too). Whatever ends it, the generator is
released at once (a conversation keeps it for its next turn) and the
``GenerationRecord`` is on ``stream.result``; ``stream.final()`` reads the
rest of the stream and returns it.

A turn routed to the hub (``CloudPlan``) streams the hub's chunks
(``source=cloud``), in order and each once (``CloudLeg``), and ends with the
hub's final; a conversation's turn goes to the replica that answered its
last one (``CloudLeg``: sticky, re-routed to any replica when that one is
gone or silent), and the record names the replica (``hub``), ``sticky``
and ``rerouted``. When the hub fails mid-turn (silent past the stall timeout, the
connection lost, an error final), a turn that may fall back
(``prefer_cloud``, a heavy ``prefer_edge`` turn) is finished here: the
device model continues from the prompt plus the text the hub sent, its
chunks ``source=edge``, and the record says ``degraded`` and why in
``fallbacks``; nothing the user saw is repeated and nothing is lost. A
``cloud_only`` turn ends instead with finish reason ``error`` and the reason
in ``record.error`` (iteration simply stops: no exception mid-stream).
Closing the stream, its deadline, or giving up on the hub sends the hub a
cancel.

A ``handoff`` turn (``_handoff.Handoff``) scores its prompt, then each token;
over a threshold (at a character boundary) the hub continues from the prompt
plus the tokens streamed (``record.handoff_at``), falling back as above.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import GenerateChunk, GenerateFinish

from .._errors import InferenceError, UplinkError
from .._result import Source
from ._cloud import CloudLeg, CloudPlan, LinkFault
from ._confidence import step_score
from ._generation import FinishReason, GenerationRecord, Sampling, TextChunk
from ._handoff import Handoff
from ._presets import TextRoute

if TYPE_CHECKING:
    from ._chat import Conversation
    from ._runtime import LanguageRuntime

__all__ = ["AsyncTextStream", "TextStream"]

_now = time.perf_counter
_EDGE = Source.EDGE
_CLOUD = Source.CLOUD


_HUB_FINISH = {
    GenerateFinish.STOP: FinishReason.STOP,
    GenerateFinish.LENGTH: FinishReason.LENGTH,
    GenerateFinish.DEADLINE: FinishReason.DEADLINE,
}


class TextStream(Iterator[TextChunk]):
    """One turn's chunks; ``result`` holds the ``GenerationRecord`` once it ended."""

    def __init__(
        self,
        runtime: LanguageRuntime,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        sampling: Sampling,
        deadline_ms: float | None,
        preset: str,
        route: TextRoute,
        conversation: Conversation | None = None,
        cloud: CloudPlan | None = None,
        handoff: Handoff | None = None,
    ) -> None:
        self._started = _now()
        self._handoff = handoff
        self._handoff_at: int | None = None
        self._hand_due = False
        self._runtime = runtime
        self._prompt_ids = prompt_ids
        self._max_tokens = max_tokens
        self._sampling = sampling
        self._deadline_at = None if deadline_ms is None else self._started + deadline_ms / 1000.0
        self._preset = preset
        self._route = route
        self.conversation = conversation
        self._lock = threading.Lock()
        self._generator: Any = None
        self._detokenizer: Any = None
        self._prompt_total = len(prompt_ids)
        self._reused = 0
        self._out: list[int] = []
        self._parts: list[str] = []
        self._pending = 0  # tokens decoded since the last chunk
        self._index = 0
        self._prefilled_at = 0.0
        self._prefill_from = 0.0
        self._first_at: float | None = None
        self._last_at = 0.0
        self._decode_from = 0.0  # when output began: the first hub chunk or the local prefill
        self._plan = cloud  # None once the turn is (or falls back to) local
        self._leg: CloudLeg | None = None
        self._cloud_ids: list[int] = []
        self._cloud_tokens = 0
        self._fallbacks = list(route.notes)
        self._degraded = False
        self._error: str | None = None
        self._closing = False
        self.result: GenerationRecord | None = None

    # -- the iterator ----------------------------------------------------------------------

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> TextChunk:
        with self._lock:
            if self.result is None:
                try:
                    chunk = self._step()
                except BaseException:
                    self._abandon()
                    raise
                if chunk is not None:
                    return chunk
        raise StopIteration

    def step(self) -> TextChunk | None:
        """The next chunk, or ``None`` once the turn has ended."""
        try:
            return self.__next__()
        except StopIteration:
            return None

    def _step(self) -> TextChunk | None:
        if self._plan is not None:
            chunk = self._cloud_step()
            if self._plan is not None or self.result is not None:
                return chunk  # still at the hub, or the turn ended
        # The hot loop: one og step, one tokenizer-stream decode, one chunk per character.
        if self._generator is None:
            self._prefill()
            if self._plan is not None:
                return self._step()  # the prompt sent the turn to the hub
        generator = self._generator
        out = self._out
        eos = self._runtime.eos_token_ids
        deadline = self._deadline_at
        decode = self._detokenizer.decode
        while True:
            if deadline is not None and _now() >= deadline:
                self._finish(FinishReason.DEADLINE)
                return None
            try:
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
            except Exception as e:
                raise InferenceError(f"{self._runtime.kind} failed while decoding: {e}") from e
            self._last_at = now = _now()
            if self._first_at is None:
                self._first_at = now
            out.append(token)
            self._pending += 1
            if token in eos:
                self._finish(FinishReason.STOP)
                return None
            text = decode(token)
            chunk = None
            if text:
                chunk = TextChunk(text, _EDGE, self._index, self._pending)
                self._parts.append(text)
                self._index += 1
                self._pending = 0
            if len(out) >= self._max_tokens or generator.is_done():
                self._finish(FinishReason.LENGTH)
                return chunk
            if self._handoff is not None and self._handoff_at is None:
                self._watch_step(generator, token, chunk is not None)
            if chunk is not None:
                return chunk

    def _watch_step(self, generator: Any, token: int, boundary: bool) -> None:
        """Score the token; hand the turn to the hub once due, after a whole character."""
        assert self._handoff is not None
        self._hand_due |= self._handoff.watch.push(step_score(generator.get_logits(), token))
        if self._hand_due and boundary and self._handoff.to_hub is not None:
            self._hand_off()

    def _hand_off(self) -> None:
        out, left = self._out, self._deadline_at and max(self._deadline_at - _now(), 1e-3) * 1e3
        assert self._handoff is not None and self._handoff.to_hub is not None
        self._plan = self._handoff.to_hub(self._prompt_ids + out, self._max_tokens - len(out), left)
        self._handoff_at = len(self._out)
        self._observe_device()
        self._release()  # the hub continues; the device's generator is freed now

    def _prefill(self) -> None:
        runtime = self._runtime
        search = self._sampling.search_options()
        if self.conversation is not None:
            generator, new_ids, self._reused = self.conversation._begin_turn(
                runtime, self._prompt_ids, search
            )
        else:
            search["max_length"] = min(
                runtime.context_length, len(self._prompt_ids) + self._max_tokens
            )
            generator, new_ids = runtime.new_generator(search), self._prompt_ids
        self._generator = generator
        self._prompt_total = self._reused + len(new_ids)
        self._detokenizer = runtime.token_stream()
        self._prefill_from = _now()
        try:
            generator.append_tokens(np.asarray(new_ids, dtype=np.int32))
        except Exception as e:
            raise InferenceError(f"{runtime.kind} failed on the prompt: {e}") from e
        self._prefilled_at = _now()
        self._decode_from = self._decode_from or self._prefilled_at
        handoff = self._handoff
        if handoff and self._handoff_at is None and handoff.prefilled(generator, new_ids):
            self._hand_off()  # the prompt's score sends the whole turn to the hub

    # -- the hub's leg ---------------------------------------------------------------------

    def _cloud_step(self) -> TextChunk | None:
        """The next hub chunk; None when the turn ended or moved to the device."""
        plan = self._plan
        assert plan is not None
        if self._leg is None:
            try:
                self._leg = plan.link.open(plan.request, plan.settings, hub=plan.hub)
            except UplinkError as e:
                self._cloud_failed(f"the turn could not be sent: {e}")
                return None
        while True:
            message = self._leg.next(self._deadline_at)
            if message is None:
                self._finish(FinishReason.DEADLINE)
                return None
            if isinstance(message, LinkFault):
                if self._closing:
                    self._finish(FinishReason.CANCELLED)
                    return None
                self._cloud_failed(message.reason)
                return None
            if not isinstance(message, GenerateChunk):  # the final, after every chunk
                finish = _HUB_FINISH.get(message.finish)
                if message.ok and finish is not None:
                    # The prompt as the hub counted it, and what its KV cache already held.
                    self._prompt_total = message.prompt_tokens or self._prompt_total
                    self._reused = min(message.cached_tokens, self._prompt_total)
                    self._finish(finish)
                    return None
                why = message.error_message or message.finish.value
                self._cloud_failed(f"the hub answered {message.error.value}: {why}")
                return None
            self._last_at = now = _now()
            if self._first_at is None:
                self._first_at = self._decode_from = now
            self._cloud_ids.extend(message.token_ids)
            assert message.tokens is not None
            self._cloud_tokens += message.tokens
            self._pending += message.tokens
            if message.text:
                chunk = TextChunk(message.text, _CLOUD, self._index, self._pending)
                self._parts.append(message.text)
                self._index += 1
                self._pending = 0
                return chunk

    def _cloud_failed(self, reason: str) -> None:
        """The hub will not finish the turn: the device does, or the turn ends ``error``."""
        plan = self._plan
        assert plan is not None
        if self._leg is not None:
            self._leg.cancel()
        if not plan.fallback:
            self._error = reason
            self._finish(FinishReason.ERROR)
            return
        self._plan = None
        self._degraded = True
        self._fallbacks.append(f"the hub failed the turn ({reason}): finished on the device")
        text = "".join(self._parts)
        if text:  # the device model continues from what the user has already seen
            self._prompt_ids = self._prompt_ids + self._runtime.encode(text)
        self._max_tokens -= self._cloud_tokens
        history = len(self.conversation.history) if self.conversation is not None else 0
        if self._max_tokens <= 0 or history + len(self._prompt_ids) >= self._runtime.context_length:
            self._finish(FinishReason.LENGTH)

    def _release(self) -> None:
        generator, self._generator = self._generator, None
        if generator is None:
            return
        if self.conversation is not None:
            self.conversation._end_turn(self._prompt_ids, self._out, "".join(self._parts))
        else:
            self._runtime.release(generator)

    def _abandon(self) -> None:
        """A failed step: free the generator; a conversation re-prefills its next turn."""
        if self._leg is not None:
            self._leg.cancel()
        generator, self._generator = self._generator, None
        if self.conversation is not None:
            self.conversation._abort_turn()
        elif generator is not None:
            self._runtime.release(generator)
        if self.result is None:
            self._record(FinishReason.CANCELLED)

    def _finish(self, reason: FinishReason) -> None:
        if self._leg is not None:
            self._leg.cancel()  # a no-op once the hub's final came
        hub_leg = self._handoff_at is not None or (self._leg and not self._prefilled_at)
        if self._generator is None and hub_leg:  # the hub's turn, or its handed-off part
            self._end_cloud_turn(reason)
            return
        prefilled = self._prefilled_at != 0.0
        if not prefilled:
            self._prefilled_at = _now()  # closed before the prefill ran
            if self.conversation is not None:
                self.conversation._abort_turn(keep_state=True)
        self._release()
        self._record(reason)
        if prefilled and self._handoff_at is None:
            self._observe_device()

    def _observe_device(self) -> None:
        self._runtime.observe(
            prefill_tokens=self._prompt_total - self._reused,
            prefill_s=self._prefilled_at - self._prefill_from,
            decode_tokens=len(self._out),
            decode_s=self._last_at - self._prefilled_at if self._out else 0.0,
        )

    def _end_cloud_turn(self, reason: FinishReason) -> None:
        conversation = self.conversation
        if conversation is not None:
            text = "".join(self._parts)
            if text or self._cloud_tokens:  # the reply joins the history, as a local one does
                ids = self._runtime.encode(text) if text else []
                conversation._end_cloud_turn(self._prompt_ids, ids, text)
            else:
                conversation._abort_turn(keep_state=True)
        self._record(reason)

    def _record(self, reason: FinishReason) -> None:
        now = _now()
        leg = self._leg
        hub = None if leg is None else leg.hub
        if hub is not None and self.conversation is not None:
            self.conversation.hub = hub  # its next turn goes to the replica that holds it
        tokens = len(self._out) + self._cloud_tokens
        at = self._handoff_at
        watch = None if self._handoff is None else self._handoff.watch
        if watch is not None:
            watch.end(at is not None, tokens=tokens, hub_tokens=self._cloud_tokens)
        began = self._decode_from or self._prefilled_at
        decode_s = self._last_at - began if tokens and began else 0.0
        prefill_ms = max(0.0, (began or now) - self._started) * 1000.0
        self.result = GenerationRecord(
            finish_reason=reason,
            text="".join(self._parts),
            output_ids=(*self._out[: at or 0], *self._cloud_ids, *self._out[at or 0 :]),
            preset=self._preset,
            reason=self._route.reason,
            edge_tokens=len(self._out),
            cloud_tokens=self._cloud_tokens,
            prompt_tokens=self._prompt_total,
            prompt_tokens_prefilled=self._prompt_total - self._reused,
            prompt_tokens_reused=self._reused,
            time_to_first_token_ms=(
                None if self._first_at is None else (self._first_at - self._started) * 1000.0
            ),
            tokens_per_s=tokens / decode_s if decode_s > 0 else None,
            prefill_ms=prefill_ms,
            decode_ms=decode_s * 1000.0,
            total_ms=(now - self._started) * 1000.0,
            fallbacks=tuple(self._fallbacks),
            model=f"{self._runtime.name}@{self._runtime.version}",
            accelerator=self._runtime.accelerator,
            degraded=self._degraded,
            error=self._error,
            hub=hub,
            sticky=leg is not None and leg.sticky_to is not None,
            rerouted=None if leg is None else leg.rerouted,
            handoff_at=at,
            handoff_score=None if watch is None else watch.peak,
            prompt_score=None if watch is None else watch.prompt_nll,
        )

    # -- ending early ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the turn (``cancelled`` unless it had ended) and free its generator.

        A turn at the hub is cancelled there; a step waiting for the hub wakes at once.
        """
        leg = self._leg
        if leg is not None and self.result is None:
            self._closing = True
            leg.interrupt("the stream was closed")
        with self._lock:
            if self.result is None:
                self._finish(FinishReason.CANCELLED)

    def final(self) -> GenerationRecord:
        """Read the rest of the stream; the turn's record."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    @property
    def text(self) -> str:
        """The text produced so far."""
        return "".join(self._parts)

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "result", True) is None and not self._lock.locked():
            self.close()


class AsyncTextStream(AsyncIterator[TextChunk]):
    """``TextStream`` for asyncio: every step runs in a worker thread."""

    def __init__(self, stream: TextStream) -> None:
        self._stream = stream

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> TextChunk:
        chunk = await asyncio.to_thread(self._stream.step)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Stop the turn (waits for a step in flight) and free its generator."""
        await asyncio.to_thread(self._stream.close)

    async def final(self) -> GenerationRecord:
        async for _ in self:
            pass
        result = self._stream.result
        assert result is not None
        return result

    @property
    def result(self) -> GenerationRecord | None:
        return self._stream.result

    @property
    def conversation(self) -> Conversation | None:
        return self._stream.conversation

    @property
    def text(self) -> str:
        return self._stream.text

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
