"""ONNX Runtime GenAI's ``Engine`` hosted on one thread: continuous batching with limits.

One scheduling thread owns the ``og.Engine`` (every ONNX Runtime GenAI call on
it happens there). Callers ``submit`` a turn from any thread and get a
:class:`Turn`; its ``sink`` is called on the engine thread with each
:class:`TurnUpdate` (new text, then a final update with the finish reason).
The thread begins waiting turns while fewer than ``slots`` are active, runs
one ``Engine.run`` step for all active turns at once (continuous batching:
a turn joins and leaves between steps), and routes each event to its turn.

Limits per turn (:class:`GenerationLimits`): prompt tokens, output tokens
(and prompt + output within the model's context), wall time in the engine
(counted from when the turn begins there; a turn past it is cancelled in the
engine and finishes ``"length"``); at most ``max_queue`` turns wait for a
slot, beyond that ``submit`` raises ``OverloadedError``.
``Turn.cancel()`` (a client gone) cancels the turn in the engine and frees
its slot at the next loop iteration, before the next step.

A turn submitted with ``conversation=ID`` (an opaque id the client picks)
runs on an ``og.Generator`` kept under that id after the turn (``_kept``:
why not the Engine, and how the two share the loop); the next turn of that
id prefills only what the kept history lacks (``cached_prompt_tokens``).
Bounded by ``_conversations.ConversationLimits``; a miss or an eviction is a
prefill from scratch, never an error.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import InvalidRequestError, OverloadedError, RepositoryError
from ._kept import KeptTurns
from ._options import GenerationLimits, Sampling
from ._turn import Sink, Turn, TurnUpdate

__all__ = ["LanguageEngine", "TurnSizes", "check_turn"]

log = logging.getLogger(__name__)


# A turn that arrives while the Engine's batch decodes waits for the next batch only if
# that one ends within this many steps; otherwise it starts at once beside it.
_JOIN_STEPS = 8

_FINISH = {"EOS": "stop", "STOP_STRING": "stop", "MAX_GENERATED_TOKENS": "length"}
_FINISH.update({"MAX_SESSION_TOKENS": "length", "CANCELLED": "cancelled", "FAILED": "error"})


def check_turn(
    prompt_tokens: int,
    max_tokens: int,
    *,
    max_prompt_tokens: int,
    max_output_tokens: int,
    context: int,
) -> None:
    """``InvalidRequestError`` when a turn of these sizes breaks a model's limits (the
    engine's, and the process plane's client of it, before the turn crosses to it)."""
    if prompt_tokens < 1:
        raise InvalidRequestError("the prompt encodes to no tokens")
    if prompt_tokens > max_prompt_tokens:
        raise InvalidRequestError(
            f"the prompt has {prompt_tokens} tokens; this model takes at most {max_prompt_tokens}"
        )
    if not 1 <= max_tokens <= max_output_tokens:
        raise InvalidRequestError(f"max_tokens must be 1..{max_output_tokens}, got {max_tokens}")
    if prompt_tokens + max_tokens > context:
        raise InvalidRequestError(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
            f"model's context of {context} tokens"
        )


class TurnSizes:
    """``encode``, ``check``, ``default_max_tokens`` and ``checked_prompt`` of an engine, over
    its tokenizer (``_tokenizer`` under ``_tokenizer_lock``), ``limits``,
    ``max_prompt_tokens``, ``context`` and ``vocab_size``: the same for every engine behind
    the turn contract."""

    limits: GenerationLimits
    max_prompt_tokens: int
    context: int
    vocab_size: int
    _tokenizer: Any
    _tokenizer_lock: threading.Lock

    def encode(self, text: str) -> np.ndarray:
        with self._tokenizer_lock:
            return np.asarray(self._tokenizer.encode(text), dtype=np.int32)

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """``InvalidRequestError`` when a turn of these sizes breaks a limit."""
        limit = self.limits.max_output_tokens
        check_turn(prompt_tokens, max_tokens, max_prompt_tokens=self.max_prompt_tokens,
                   max_output_tokens=limit, context=self.context)  # fmt: skip

    def default_max_tokens(self, prompt_tokens: int) -> int:
        return max(1, min(self.limits.max_output_tokens, self.context - prompt_tokens))

    def checked_prompt(
        self, prompt: Sequence[int] | np.ndarray, max_tokens: int, conversation: str | None
    ) -> np.ndarray:
        """The prompt's ids, once the turn is one ``submit`` takes (``InvalidRequestError``)."""
        if conversation is not None and (not isinstance(conversation, str) or not conversation):
            raise InvalidRequestError("a conversation id must be a non-empty string")
        if not isinstance(prompt, np.ndarray):
            bad = [t for t in prompt if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"token id {bad[0]} is out of the model's vocabulary (0..{self.vocab_size - 1})"
                )
        ids = np.asarray(prompt, dtype=np.int32)
        self.check(len(ids), max_tokens)
        return ids


class LanguageEngine(TurnSizes):
    """An ONNX Runtime GenAI model directory served by one ``og.Engine`` on its own thread."""

    platform = "onnxruntime_genai"

    def __init__(self, directory: str | Path, *, limits: GenerationLimits | None = None) -> None:
        import onnxruntime_genai as og

        self.directory = Path(directory)
        self.limits = limits or GenerationLimits()
        try:
            config = json.loads((self.directory / "genai_config.json").read_text())
            self.context = int(config["model"]["context_length"])
            self.vocab_size = int(config["model"]["vocab_size"])
            eos = config["model"].get("eos_token_id", [])
            self._eos = frozenset(int(t) for t in (eos if isinstance(eos, list) else [eos]))
            self._og = og
            self._model = self._load_model(og)
            self._tokenizer = og.Tokenizer(self._model)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise RepositoryError(f"{self.directory}: cannot load the language model: {e}") from e
        self.max_prompt_tokens = min(
            self.limits.max_prompt_tokens or self.context, self.context - 1
        )
        self.slots = 0  # set by the engine thread: max_active, else the engine's batch size
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._cond = threading.Condition()
        self._waiting: collections.deque[Turn] = collections.deque()
        self._active: dict[int, Turn] = {}  # id(og.Request) -> turn
        # Requests cancelled in the engine whose last event has not come yet: kept alive (and
        # open) until it does, so that a late event is never taken for a new request's.
        self._draining: dict[int, Any] = {}
        self._cancels: list[Turn] = []
        self._ids = itertools.count(1)
        self._closing = False
        self._tokenizer_lock = threading.Lock()
        self.counters = collections.Counter[str]()
        self._kept = KeptTurns(og, self._model, context=self.context, eos=self._eos,
                               limits=self.limits.conversations, lock=self._cond)  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise RepositoryError(
                f"{self.directory}: cannot start its engine: {self._start_error}"
            ) from self._start_error

    def _load_model(self, og: Any) -> Any:
        """The model; ``max_active`` above the Engine's default batch size widens its batch."""
        if self.limits.max_active is None:
            return og.Model(str(self.directory))
        config = og.Config(str(self.directory))
        batch = {"max_batch_size": self.limits.max_active}
        config.overlay(json.dumps({"engine": {"static_batching": batch}}))
        return og.Model(config)

    # -- callers' side ----------------------------------------------------------------

    def submit(
        self,
        prompt: Sequence[int] | np.ndarray,
        *,
        max_tokens: int,
        sink: Sink,
        sampling: Sampling | None = None,
        conversation: str | None = None,
    ) -> Turn:
        """Queue a turn; ``InvalidRequestError`` for a broken limit, ``OverloadedError`` if full.

        With ``conversation`` (an opaque id), the turn continues that kept
        conversation where its prompt repeats the kept history, and is kept after.
        """
        ids = self.checked_prompt(prompt, max_tokens, conversation)
        turn = Turn(
            id=next(self._ids),
            prompt=ids,
            max_tokens=max_tokens,
            sampling=sampling or Sampling(),
            sink=sink,
            deadline=math.inf,  # set when it begins in the engine
            engine=self,
            conversation=conversation,
        )
        with self._cond:
            if self._closing:
                raise OverloadedError("the language engine is stopping")
            if len(self._waiting) >= self.limits.max_queue:
                self.counters["refused"] += 1
                raise OverloadedError(
                    f"{len(self._waiting)} turns already wait for a slot; retry later"
                )
            self._waiting.append(turn)
            self.counters["submitted"] += 1
            self._cond.notify()
        return turn

    def stats(self) -> dict[str, int]:
        """Counters (submitted, completed, cancelled, refused, timed_out, tokens, beside_batch; kept
        conversations' hits, misses, evictions, cached_prompt_tokens) and gauges (active,
        waiting, conversations: those kept now)."""
        with self._cond:
            store = self._kept.store
            kept = {f"conversation_{k}": store.counters[k] for k in ("hits", "misses", "evictions")}
            return {
                **self.counters, **kept,
                "cached_prompt_tokens": store.counters["cached_prompt_tokens"],
                "active": len(self._active) + len(self._kept.active),
                "waiting": len(self._waiting), "conversations": len(store),
                "beside_batch": self.counters["beside_batch"],
            }  # fmt: skip

    def close(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _cancel(self, turn: Turn) -> None:
        with self._cond:
            if turn.finished:
                return
            self.counters["cancel_requests"] += 1
            if turn in self._waiting:
                self._waiting.remove(turn)
                self._finish(turn, "cancelled")
                return
            self._cancels.append(turn)
            self._cond.notify()

    # -- the engine thread ------------------------------------------------------------

    def _run(self) -> None:
        # ONNX Runtime GenAI wants every Engine call on the thread that made it.
        try:
            self._engine = self._og.Engine(self._model)
            batch = int(self._engine.get_capabilities().configured_max_batch_size) or 1
            self.slots = self.limits.max_active or batch
            self._buffer = self._engine.create_event_buffer(max(64, 4 * self.slots))
        except Exception as e:
            self._start_error = e
            return
        finally:
            self._started.set()
        try:
            while self._step():
                pass
        except Exception as e:  # the engine failed: every turn gets an error, none hangs
            log.exception("the language engine failed")
            self._fail_all(f"the language engine failed: {e}")
            return
        self._fail_all("the language engine stopped", finish="cancelled")

    def _step(self) -> bool:
        with self._cond:
            while not (
                self._closing
                or self._waiting
                or self._active
                or self._cancels
                or self._draining
                or self._kept.active
            ):
                self._cond.wait()
            if self._closing:
                return False
            cancels, self._cancels = self._cancels, []
            admit, gather_s = self._admit()
            self._kept.store.expire()
            idle = not (self._active or self._kept.active or cancels or self._draining)
            if not admit and gather_s > 0 and idle:
                self._cond.wait(gather_s)  # a batch is gathering: more turns may come
                return True
        now = time.monotonic()
        for turn in cancels:
            self._drop(turn, "cancelled")
        for turn in [*self._active.values(), *self._kept.active.values()]:
            if now > turn.deadline:
                self.counters["timed_out"] += 1
                self._drop(turn, "length")
        for turn in admit:
            try:
                self._begin(turn)
            except Exception as e:  # this turn's options or prompt: not the engine's end
                with self._cond:
                    self._active.pop(id(turn.request), None)
                    self._kept.end(turn, keep=False)
                self._finish(turn, "error", error=f"the engine refused the turn: {e}")
        if self._active or self._draining:
            for event in self._engine.run(self._buffer):
                self._on_event(event)
            if self._draining and not self._engine.has_pending_requests():
                for request in self._draining.values():
                    request.close()
                self._draining.clear()
        for turn in list(self._kept.active.values()):
            self._step_kept(turn)
        return True

    def _admit(self) -> tuple[list[Turn], float]:
        """The waiting turns that begin now, in order, while slots are free.

        ONNX Runtime GenAI 0.18's CPU Engine batches statically: a request begun
        while a batch decodes gets its first token only when the whole batch has
        finished (observed). So Engine turns begin together, when no batch runs;
        while one runs, a turn with a free slot that would end before the batch
        does begins at once on a generator beside it (``beside``); a turn at least
        as long as what is left of the batch, or any turn when the batch ends
        within ``_JOIN_STEPS`` steps, waits to join the next batch (so it is
        delayed by less than its own length, and stays batched). Conversation
        turns always run on their generators.

        A new batch may gather Engine turns for up to ``batch_wait_ms`` (default
        0) from its first turn's arrival until ``slots`` are waiting (Triton's
        ``max_queue_delay``): streams whose turns ended together come back a
        moment apart, and a batch begun with the first of them runs part empty.
        Conversation turns do not wait for it. The second value returned is how
        long to wait for more, while gathering.
        """
        running = bool(self._active) or self._engine.has_pending_requests()
        left = max((t.max_tokens - len(t.tokens) for t in self._active.values()), default=0)
        free = self.slots - len(self._active) - len(self._kept.active)
        bound = [t for t in self._waiting if t.conversation is None]
        wait = 0.0
        if not running and bound:  # a new batch: gathering while it has free slots?
            wait = bound[0].queued_at + self.limits.batch_wait_ms / 1e3 - time.monotonic()
            wait = wait if wait > 0 and len(bound) < self.slots else 0.0
        admit: list[Turn] = []
        held: list[Turn] = []  # they join the next batch; the turns behind them need not wait
        while self._waiting and len(admit) < free:
            turn = self._waiting.popleft()
            if turn.conversation is None and wait > 0:
                held.append(turn)
                continue
            if turn.conversation is None and running:
                if left <= _JOIN_STEPS or turn.max_tokens >= left:
                    held.append(turn)  # the batch ends first (or soon)
                    continue
                turn.beside = True
                self.counters["beside_batch"] += 1
            admit.append(turn)
        self._waiting.extendleft(reversed(held))
        return admit, wait

    def _step_kept(self, turn: Turn) -> None:
        """One token of a conversation turn (its generator), then its text or its end."""
        try:
            finish = self._kept.step(turn)
        except Exception as e:  # this generator's failure: its turn ends, the loop goes on
            with self._cond:
                self._kept.end(turn, keep=False)
            self._finish(turn, "error", error=f"the engine failed the turn: {e}")
            return
        self.counters["tokens"] += 1
        if finish is not None:
            with self._cond:
                self._kept.end(turn)
            self._finish(turn, finish)
        elif self._emit(turn, final=False):
            self._drop(turn, "stop")

    def _begin(self, turn: Turn) -> None:
        if turn.conversation is not None or turn.beside:
            turn.deadline = time.monotonic() + self.limits.max_wall_s
            self._kept.begin(turn)
            return
        og = self._og
        request = self._engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(turn.max_tokens)
        if turn.sampling.temperature > 0:
            options.set_do_sample(True)
            options.set_temperature(turn.sampling.temperature)
            options.set_top_p(turn.sampling.top_p)
            # No TurnOptions.set_seed: this engine configuration refuses a per-turn seed
            # ("requires an Engine configured for dynamic batching"); OpenAI's seed is
            # best effort, so it is accepted and not applied.
        else:
            options.set_do_sample(False)
        # Stop strings are matched here, on the decoded text: this engine configuration
        # refuses TurnOptions.set_stop_strings ("require an Engine configured for
        # dynamic batching").
        turn.request = request
        turn.deadline = time.monotonic() + self.limits.max_wall_s
        turn.turn_id = request.begin_turn(turn.prompt, options)
        with self._cond:
            self._active[id(request)] = turn

    def _drop(self, turn: Turn, finish: str) -> None:
        """Cancel an active turn in the engine and free its slot now."""
        with self._cond:
            self._active.pop(id(turn.request), None)
            self._kept.end(turn)  # a conversation turn: kept with what it generated so far
        if turn.request is not None:
            try:
                turn.request.cancel_turn(turn.turn_id)
                self._draining[id(turn.request)] = turn.request
            except RuntimeError:  # already finished in the engine
                turn.request.close()
        self._finish(turn, finish)

    def _on_event(self, event: Any) -> None:
        flags = int(event.flags)
        turn = self._active.get(id(event.request))
        if turn is None:  # a turn dropped since (cancelled): its last events are ignored
            done = flags & int(self._og.EngineEventFlags.TURN_FINISHED)
            if done or flags & int(self._og.EngineEventFlags.FAILED):
                request = self._draining.pop(id(event.request), None)
                if request is not None:
                    request.close()
            return
        if flags & int(self._og.EngineEventFlags.TOKEN):
            turn.tokens.append(int(event.token))
            self.counters["tokens"] += 1
        finished = flags & int(self._og.EngineEventFlags.TURN_FINISHED)
        if flags & int(self._og.EngineEventFlags.FAILED):
            with self._cond:
                self._active.pop(id(event.request), None)
            self._finish(turn, "error", error=f"the engine failed the turn: {event.error_code}")
            return
        if finished:
            with self._cond:
                self._active.pop(id(event.request), None)
            turn.request.close()
            self._finish(turn, _FINISH.get(event.finish_reason.name, "stop"))
        elif flags & int(self._og.EngineEventFlags.TOKEN) and self._emit(turn, final=False):
            self._drop(turn, "stop")  # a stop string appeared: end the turn, free the slot

    def _visible(self, turn: Turn, text: str, final: bool) -> tuple[str, bool]:
        """The text that may be sent now, and whether a stop string ended it."""
        stop = turn.sampling.stop
        if not stop:
            return text, False
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        if hits:
            return text[: min(hits)], True
        if final:
            return text, False
        hold = max(len(s) for s in stop) - 1  # the tail may be the start of a stop string
        return text[: max(len(turn.sent), len(text) - hold)], False

    def _emit(self, turn: Turn, *, final: bool, finish: str | None = None) -> bool:
        """Send the turn's new text; True when a stop string appeared in it."""
        text = self._decode(turn.tokens)
        if not final and text.endswith("\ufffd"):
            return False  # a character's bytes are split across tokens: wait for the rest
        text, stopped = self._visible(turn, text, final)
        if stopped and not final:
            return True  # _drop sends it, with finish "stop"
        if stopped and finish in ("length", "stop"):
            finish = "stop"  # the turn's last tokens completed a stop string
        delta = text[len(turn.sent) :]
        if not delta and not final:
            return False
        turn.sent = text
        update = TurnUpdate(
            delta,
            tuple(turn.tokens),
            finish,
            prompt_tokens=turn.prompt_tokens,
            completion_tokens=len(turn.tokens),
            cached_prompt_tokens=turn.cached,
        )
        self._deliver(turn, update)
        return stopped

    def _finish(self, turn: Turn, finish: str, *, error: str | None = None) -> None:
        if turn.finished:
            return
        turn.finished = True
        self.counters["completed" if finish in ("stop", "length") else finish] += 1
        if error is not None:
            update = TurnUpdate("", tuple(turn.tokens), "error", turn.prompt_tokens, 0, error,
                                turn.cached)  # fmt: skip
            self._deliver(turn, update)
        else:
            self._emit(turn, final=True, finish=finish)

    def _deliver(self, turn: Turn, update: TurnUpdate) -> None:
        try:
            turn.sink(update)
        except Exception:  # a consumer's failure must not stop the engine
            log.exception("a language turn's sink failed")

    def _decode(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        with self._tokenizer_lock:
            return str(self._tokenizer.decode(np.asarray(tokens, dtype=np.int32)))

    def _fail_all(self, message: str, *, finish: str = "error") -> None:
        with self._cond:
            turns = [*self._active.values(), *self._kept.active.values(), *self._waiting]
            self._active.clear()
            self._kept.active.clear()
            self._kept.store.clear()
            self._waiting.clear()
            self._closing = True
        for turn in turns:
            if finish == "error":
                self._finish(turn, "error", error=message)
            else:
                self._finish(turn, finish)
