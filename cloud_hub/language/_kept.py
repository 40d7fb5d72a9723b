"""Conversation turns on ``og.Generator``s beside the ``og.Engine``, on the engine's thread.

Why not the Engine: ONNX Runtime GenAI 0.18's Engine on CPU runs its static
batch scheduler, which continues a request with a second turn only while that
request is the only one resident ("Continuous decoding requires exactly one
resident request in a static engine batch"); its dynamic batching (paged KV
cache, prefix caching) needs a model exported with ``PagedAttention``, which
the model builder makes for CUDA (FP16/BF16) and WebGPU only. A ``Generator``
keeps its KV cache between ``append_tokens`` calls and can ``rewind_to`` any
length, so a kept conversation is one generator: its next turn rewinds to the
part of the history the new prompt repeats and appends only the rest.

Each engine-loop iteration gives every active conversation turn one
``generate_next_token`` after the Engine's own step, so conversation turns and
Engine turns advance together (a turn of either kind begins between steps).
The generators are not batched with each other: a conversation turn's decode
step is a batch of one. The engine also runs here the turns that arrive while
its static batch decodes (``LanguageEngine._admit``), so that they need not
wait for the whole batch to finish.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from ._conversations import ConversationLimits, ConversationStore, Kept

if TYPE_CHECKING:
    from ._options import Sampling
    from ._turn import Turn

__all__ = ["KeptTurns"]


def _options(sampling: Sampling) -> Hashable:
    """A generator's sampling options are fixed when it is made: the key a kept one matches."""
    if sampling.temperature <= 0:
        return ("greedy",)
    return ("sample", sampling.temperature, sampling.top_p, sampling.seed)


class KeptTurns:
    """The conversation turns in progress and the conversations kept between turns."""

    def __init__(
        self,
        og: Any,
        model: Any,
        *,
        context: int,
        eos: frozenset[int],
        limits: ConversationLimits,
        lock: Any,
    ) -> None:
        """``lock`` (the engine's, re-entrant) guards the store and ``active`` for ``stats``."""
        self._og, self._model, self.context, self.eos = og, model, context, eos
        self._lock = lock
        self.budget = min(limits.max_tokens or context, context)
        self.store = ConversationStore(limits)
        self.active: dict[int, Turn] = {}  # turn id -> turn

    def begin(self, turn: Turn) -> None:
        """Continue the turn's conversation (or start one) and prefill what its cache lacks.

        A turn without a conversation (one run beside the Engine's batch) gets a
        generator of its own size, dropped when it ends.
        """
        options = _options(turn.sampling)
        needed = turn.prompt_tokens + turn.max_tokens
        kept, reuse = None, 0
        if turn.conversation is not None:
            with self._lock:
                kept, reuse = self.store.take(turn.conversation, turn.prompt, options, needed)
        if kept is None:
            capacity = needed if turn.conversation is None else max(self.budget, needed)
            capacity = min(self.context, capacity)
            kept = Kept(turn.conversation or "", self._generator(turn.sampling, capacity), [],
                        options, capacity, 0.0)  # fmt: skip
        generator = kept.state
        # The last token a generator produced is in its sequence but not in its KV cache,
        # and 0.18's append_tokens after generate_next_token does not answer as a fresh
        # generator fed the same tokens would (observed): rewind to before it and feed it.
        reuse = min(reuse, max(0, int(generator.token_count()) - 1))
        turn.kept, turn.cached = kept, reuse
        with self._lock:
            self.active[turn.id] = turn
            self.store.counters["cached_prompt_tokens"] += reuse
        if int(generator.token_count()) != reuse:
            generator.rewind_to(reuse)  # the history the prompt does not repeat is dropped
        kept.history = kept.history[:reuse]
        generator.append_tokens(turn.prompt[reuse:])
        if int(generator.token_count()) != turn.prompt_tokens:  # never a wrong cache, silently
            raise RuntimeError(
                f"the kept cache holds {generator.token_count()} tokens, not the prompt's "
                f"{turn.prompt_tokens}"
            )

    def step(self, turn: Turn) -> str | None:
        """One decoding step of ``turn``: its finish reason, or None while it goes on."""
        generator = turn.kept.state
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        turn.tokens.append(token)
        if generator.is_done():
            return "stop" if token in self.eos else "length"
        return "length" if len(turn.tokens) >= turn.max_tokens else None

    def end(self, turn: Turn, *, keep: bool = True) -> None:
        """The turn is over (finished, cancelled, cut or stopped): keep its conversation.

        What its cache holds is exactly the prompt and the tokens generated so
        far (an end-of-sequence token aside), so a cancelled turn leaves a
        history the next turn can continue or rewind.
        """
        with self._lock:
            if self.active.pop(turn.id, None) is None or turn.kept is None:
                return
            kept: Kept = turn.kept
            turn.kept = None
            if not keep or turn.conversation is None:
                return
            last_is_eos = turn.tokens and turn.tokens[-1] in self.eos
            tokens = turn.tokens[:-1] if last_is_eos else turn.tokens
            kept.history = [*map(int, turn.prompt), *tokens]
            self.store.keep(kept)

    def _generator(self, sampling: Sampling, capacity: int) -> Any:
        params = self._og.GeneratorParams(self._model)
        if sampling.temperature > 0:
            search: dict[str, Any] = {"do_sample": True, "temperature": sampling.temperature,
                                      "top_p": sampling.top_p}  # fmt: skip
            if sampling.seed is not None:
                search["random_seed"] = sampling.seed
        else:
            search = {"do_sample": False}
        params.set_search_options(max_length=capacity, **search)
        return self._og.Generator(self._model, params)
