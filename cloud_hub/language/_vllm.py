"""vLLM's ``AsyncLLMEngine`` behind the turn contract (``TurnEngine``), for CUDA hubs.

Written against vLLM's documented API (``AsyncEngineArgs``,
``AsyncLLMEngine.from_engine_args``, ``generate(TokensPrompt(prompt_token_ids=...),
SamplingParams(output_kind=RequestOutputKind.DELTA, ...), request_id)``,
``abort(request_id)``, ``RequestOutput.num_cached_tokens``,
``CompletionOutput.finish_reason``) and NOT yet run in this repository (no GPU
was lent to its development); ``tests/test_vllm_engine.py`` is its entry on a
CUDA machine. Everything that does not need vLLM is in ``_vllm_mapping`` and
tested without it.

One asyncio loop in a thread of its own hosts the engine. ``submit`` (any
thread) queues a turn; the loop begins turns while fewer than ``slots``
(``max_active``) run, each as a task iterating ``generate``, whose deltas
become the same ``TurnUpdate`` records ``LanguageEngine``'s sink receives
(``_vllm_mapping.DeltaStream``; sinks are called on the loop's thread). A
cancel, or a turn past ``max_wall_s`` (finish ``"length"``), ends the turn at
once (its slot is free for the next waiting turn) and aborts it in vLLM.

Conversations: the turn's prompt repeats the conversation's history, as for
the CPU engine; vLLM's automatic prefix caching (``enable_prefix_caching``)
reuses the KV blocks of that repeated prefix, and ``cached_prompt_tokens`` is
vLLM's ``num_cached_tokens`` (whole blocks; any turn's repeated prefix counts,
a conversation's or not). ``_vllm_mapping.ConversationHistories`` keeps each
conversation's token history, bounded as the CPU engine bounds its kept
caches, for the same conversation counters (hits, misses, evictions).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import OverloadedError, RepositoryError
from ._engine import TurnSizes
from ._options import GenerationLimits, Sampling
from ._turn import Sink, Turn, TurnUpdate
from ._vllm_mapping import ConversationHistories, DeltaStream, sampling_kwargs

__all__ = ["Checkpoint", "Runtime", "VllmEngine", "find_checkpoint", "vllm_runtime"]

log = logging.getLogger(__name__)

_DEFAULT_SLOTS = 256  # vLLM's own default max_num_seqs on a GPU


@dataclass(frozen=True)
class Checkpoint:
    """The Hugging Face directory vLLM loads for a model version, and its sizes."""

    path: Path
    context: int  # genai_config.json's context_length beside it, else max_position_embeddings
    vocab_size: int
    eos: frozenset[int]


def find_checkpoint(directory: str | Path) -> Checkpoint:
    """The version folder's ``hf/`` checkpoint, else the folder itself if it is one.

    Where the folder is also an ONNX Runtime GenAI model (``genai_config.json``),
    its ``context_length`` and ``eos_token_id`` win, so that both engines serve
    the model with the same limits.
    """
    directory = Path(directory)
    path = next((p for p in (directory / "hf", directory) if (p / "config.json").is_file()), None)
    if path is None:
        expected = f"{directory}/hf/config.json or {directory}/config.json"
        raise RepositoryError(f"{directory}: no Hugging Face checkpoint for vLLM ({expected})")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        genai_path = directory / "genai_config.json"
        genai = json.loads(genai_path.read_text(encoding="utf-8")) if genai_path.is_file() else {}
        model = genai.get("model", {}) if isinstance(genai, dict) else {}
        context = int(model.get("context_length") or config["max_position_embeddings"])
        eos = model.get("eos_token_id", config.get("eos_token_id"))
        eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
        return Checkpoint(path, context, int(config["vocab_size"]), frozenset(map(int, eos)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise RepositoryError(f"{path}: cannot read the checkpoint's config: {e}") from e


@dataclass(frozen=True)
class Runtime:
    """What ``VllmEngine`` takes from vLLM: its own (:func:`vllm_runtime`) on a CUDA hub; the
    tests put a scripted engine of the same surface here, to run the loop without a GPU."""

    build: Callable[[], Any]  # called on the loop: the AsyncLLMEngine (generate, abort)
    sampling_params: Callable[..., Any]  # vllm.SamplingParams
    tokens_prompt: Callable[..., Any]  # vllm.inputs.TokensPrompt
    output_kind: Any  # RequestOutputKind.DELTA
    tokenizer: Any  # .encode(text) -> ids (the checkpoint's Hugging Face tokenizer)


def vllm_runtime(checkpoint: Checkpoint, *, dtype: str, slots: int) -> Runtime:
    """vLLM's engine for ``checkpoint`` (FP16, prefix caching, ``slots`` sequences at most)."""
    try:  # vLLM (and transformers, which it needs) only here: an optional extra
        import vllm
        from transformers import AutoTokenizer
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
    except ImportError as e:
        raise RepositoryError(f"engine 'vllm' needs the vllm package: {e}") from e
    path = str(checkpoint.path)
    args = vllm.AsyncEngineArgs(
        model=path, dtype=dtype, enable_prefix_caching=True, max_num_seqs=slots,
        max_model_len=checkpoint.context,
    )  # fmt: skip
    return Runtime(
        build=lambda: vllm.AsyncLLMEngine.from_engine_args(args),
        sampling_params=vllm.SamplingParams,
        tokens_prompt=TokensPrompt,
        output_kind=RequestOutputKind.DELTA,
        tokenizer=AutoTokenizer.from_pretrained(path),
    )


@dataclass(eq=False)
class _Running:
    """A turn's state on the loop (``Turn.request``)."""

    stream: DeltaStream
    request_id: str
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    kept: Any = field(default=None)  # the conversation's history while the turn runs


class VllmEngine(TurnSizes):
    """A model version served by vLLM's ``AsyncLLMEngine`` on an asyncio loop of its own."""

    platform = "vllm"

    def __init__(
        self,
        directory: str | Path,
        *,
        limits: GenerationLimits | None = None,
        dtype: str = "float16",
        runtime: Runtime | None = None,
    ) -> None:
        """``runtime``: what is taken from vLLM (default :func:`vllm_runtime`, vLLM's own)."""
        self.directory = Path(directory)
        self.limits = limits or GenerationLimits()
        self.checkpoint = find_checkpoint(self.directory)
        self.context, self.vocab_size = self.checkpoint.context, self.checkpoint.vocab_size
        self.max_prompt_tokens = min(
            self.limits.max_prompt_tokens or self.context, self.context - 1
        )
        self.slots = self.limits.max_active or _DEFAULT_SLOTS
        self.counters = collections.Counter[str]()
        self._lock = threading.RLock()
        self._waiting: collections.deque[Turn] = collections.deque()
        self._active: dict[int, Turn] = {}
        self._ids = itertools.count(1)
        self._closing = False
        self._histories = ConversationHistories(
            self.limits.conversations, context=self.context, eos=self.checkpoint.eos
        )
        runtime = runtime or vllm_runtime(self.checkpoint, dtype=dtype, slots=self.slots)
        self._params, self._prompt = runtime.sampling_params, runtime.tokens_prompt
        self._delta = runtime.output_kind
        self._tokenizer_lock = threading.Lock()
        self._tokenizer = runtime.tokenizer
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        try:
            self._engine = self._call(self._build(runtime), None)
        except Exception as e:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
            self._loop.close()
            raise RepositoryError(f"{self.directory}: cannot start vLLM: {e}") from e

    async def _build(self, runtime: Runtime) -> Any:
        return runtime.build()  # on the loop: the engine's tasks belong to it

    def _call(self, coroutine: Any, timeout_s: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    # -- callers' side (any thread) -----------------------------------------------------

    def submit(
        self,
        prompt: Sequence[int] | np.ndarray,
        *,
        max_tokens: int,
        sink: Sink,
        sampling: Sampling | None = None,
        conversation: str | None = None,
    ) -> Turn:
        """Queue a turn; ``InvalidRequestError`` for a broken limit, ``OverloadedError`` if full."""
        ids = self.checked_prompt(prompt, max_tokens, conversation)
        turn = Turn(id=next(self._ids), prompt=ids, max_tokens=max_tokens,
                    sampling=sampling or Sampling(), sink=sink, deadline=math.inf, engine=self,
                    conversation=conversation)  # fmt: skip
        turn.request = _Running(DeltaStream(len(ids)), f"tandem-{turn.id}-{uuid.uuid4().hex}")
        with self._lock:
            if self._closing:
                raise OverloadedError("the language engine is stopping")
            if len(self._waiting) >= self.limits.max_queue:
                self.counters["refused"] += 1
                raise OverloadedError(
                    f"{len(self._waiting)} turns already wait for a slot; retry later"
                )
            self._waiting.append(turn)
            self.counters["submitted"] += 1
        self._loop.call_soon_threadsafe(self._pump)
        return turn

    def stats(self) -> dict[str, int]:
        """The counters and gauges ``LanguageEngine.stats`` has (``beside_batch`` is 0:
        vLLM batches continuously); ``cached_prompt_tokens`` sums vLLM's cached tokens."""
        with self._lock:
            store = self._histories.store
            kept = {f"conversation_{k}": store.counters[k] for k in ("hits", "misses", "evictions")}
            return {
                **self.counters, **kept,
                "cached_prompt_tokens": self.counters["cached_prompt_tokens"],
                "active": len(self._active), "waiting": len(self._waiting),
                "conversations": len(store), "beside_batch": 0,
            }  # fmt: skip

    def close(self, timeout_s: float = 10.0) -> None:
        """End every turn ``"cancelled"``, shut vLLM down and stop the loop."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            turns = [*self._waiting, *self._active.values()]
            self._waiting.clear()
        try:
            self._call(self._shutdown(turns), timeout_s)
        except Exception:
            log.exception("the vLLM engine did not shut down cleanly")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    def _cancel(self, turn: Turn) -> None:
        with self._lock:
            if turn.finished:
                return
            self.counters["cancel_requests"] += 1
            if turn in self._waiting:
                self._waiting.remove(turn)
        self._loop.call_soon_threadsafe(self._stop, turn, "cancelled")

    # -- the loop's thread ----------------------------------------------------------------

    def _pump(self) -> None:
        """Begin waiting turns while slots are free."""
        while True:
            with self._lock:
                if self._closing or not self._waiting or len(self._active) >= self.slots:
                    return
                turn = self._waiting.popleft()
                self._active[turn.id] = turn
            self._begin(turn)

    def _begin(self, turn: Turn) -> None:
        run: _Running = turn.request
        turn.deadline = time.monotonic() + self.limits.max_wall_s
        if turn.conversation is not None:
            with self._lock:
                self._histories.expire()
                run.kept = self._histories.begin(
                    turn.conversation, turn.prompt, turn.sampling, turn.max_tokens
                )
        try:
            kwargs = sampling_kwargs(turn.sampling, turn.max_tokens)
            params = self._params(**kwargs, output_kind=self._delta)
        except Exception as e:  # this turn's options: not the engine's end
            self._end(turn, "error", error=f"the engine refused the turn: {e}")
            return
        run.task = self._loop.create_task(self._serve(turn, params))
        run.timer = self._loop.call_later(self.limits.max_wall_s, self._stop, turn, "length")

    async def _serve(self, turn: Turn, params: Any) -> None:
        """Iterate the turn's ``generate``: each delta an update, the last one its end."""
        run: _Running = turn.request
        if turn.finished:
            return
        prompt = self._prompt(prompt_token_ids=[int(t) for t in turn.prompt])
        outputs = self._engine.generate(prompt, params, run.request_id)
        try:
            async for out in outputs:
                if turn.finished:
                    break  # ended here (a cancel, its wall time): the abort is under way
                self._on_output(turn, out)
        except asyncio.CancelledError:
            self._end(turn, "cancelled")
            raise
        except Exception as e:  # this turn's failure (or the engine's): its error update
            log.warning("vLLM failed turn %s: %s", run.request_id, e)
            self._end(turn, "error", error=f"the engine failed the turn: {e}")
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()  # vLLM aborts a request whose stream closes early
        if not turn.finished:
            self._end(turn, "error", error="the engine ended the turn without a finish")

    def _on_output(self, turn: Turn, out: Any) -> None:
        """One ``RequestOutput`` (a delta): the sink's update, or the turn's end."""
        completion = out.outputs[0]
        with self._lock:
            self.counters["tokens"] += len(completion.token_ids)
        finish = completion.finish_reason if out.finished else None
        stream: DeltaStream = turn.request.stream
        update = stream.add(
            completion.text,
            completion.token_ids,
            finish_reason=finish,
            cached=out.num_cached_tokens,
        )
        if update is not None and update.finish is not None:
            self._end(turn, update=update)
        elif update is not None:
            self._deliver(turn, update)

    def _stop(self, turn: Turn, finish: str) -> None:
        """End a turn now (a cancel, its wall time, a close) and abort it in vLLM."""
        if turn.finished:
            return
        if finish == "length":
            with self._lock:
                self.counters["timed_out"] += 1
        run: _Running = turn.request
        self._end(turn, finish)
        if run.task is not None:
            self._loop.create_task(self._abort(run))

    async def _abort(self, run: _Running) -> None:
        try:
            await self._engine.abort(run.request_id)
        except Exception as e:
            log.warning("vLLM could not abort %s: %s", run.request_id, e)
        if run.task is not None:
            run.task.cancel()  # generate's own cleanup aborts it too, where the abort did not

    def _end(
        self,
        turn: Turn,
        finish: str = "error",
        *,
        error: str | None = None,
        update: TurnUpdate | None = None,
    ) -> None:
        """The turn's last update; its slot is free and its conversation kept."""
        if turn.finished:
            return
        turn.finished = True
        run: _Running = turn.request
        if update is None:
            update = run.stream.finish(finish, error=error)
        turn.tokens, turn.cached = list(run.stream.tokens), run.stream.cached
        finish = update.finish or finish
        with self._lock:
            self._active.pop(turn.id, None)
            self.counters["completed" if finish in ("stop", "length") else finish] += 1
            self.counters["cached_prompt_tokens"] += turn.cached
            if run.kept is not None and finish != "error":
                self._histories.end(run.kept, turn.prompt, turn.tokens)
            run.kept = None
        if run.timer is not None:
            run.timer.cancel()
        self._deliver(turn, update)
        self._pump()

    def _deliver(self, turn: Turn, update: TurnUpdate) -> None:
        try:
            turn.sink(update)
        except Exception:  # a consumer's failure must not stop the engine
            log.exception("a language turn's sink failed")

    async def _shutdown(self, turns: list[Turn]) -> None:
        running = [t.request for t in turns if t.request.task is not None]
        for turn in turns:
            self._end(turn, "cancelled")
        await asyncio.gather(*(self._abort(run) for run in running), return_exceptions=True)
        await asyncio.gather(*(run.task for run in running), return_exceptions=True)
        shutdown = getattr(self._engine, "shutdown", None)  # vLLM v1's AsyncLLM has one
        if callable(shutdown):
            shutdown()
