"""A language model on the device, run by LiteRT-LM (the TFLite family's LLM runtime).

``LiteRTLanguageRuntime`` loads the one ``.litertlm`` file of a model folder
(the TFLite prefill/decode model, its tokenizer and its metadata, as
``litert-torch``'s exporter packs them) with ``litert_lm.Engine`` on the CPU
backend, and the ``tokenizer.json`` beside it with ``tokenizers`` (the
engine's own tokenize/detokenize corrupt the heap when called while a session
decodes on LiteRT-LM's thread, as the agent's stream would: seen as
``malloc(): unaligned fastbin chunk detected`` with litert-lm-api 0.18.1).
``litert_lm`` and ``tokenizers`` (``pip install 'tandem[litert-lm]'``) are
imported when such a model loads, so ``import edge_agent`` stays light.
It is a ``LanguageRuntime``: the agent's turns, streams, presets and rates
use it as they use ONNX Runtime GenAI's, through the generator surface that
``TextStream`` drives (``append_tokens``, ``generate_next_token``,
``get_next_tokens``, ``is_done``, ``token_count``).

What LiteRT-LM's Python API does differently, and how this module bridges it:

* A session takes text and streams text, not token ids. ``append_tokens``
  detokenizes the ids and prefills that text (the ids the agent encoded with
  the model's tokenizer come back the same); each streamed piece is
  re-tokenized into the ids the turn counts. Byte-level tokens that form no
  character arrive as U+FFFD and re-tokenize as its bytes: only there do the
  ids differ from the model's (the text is what the ids decode to). The
  engine's own decode count (its benchmark figures) decides whether the turn
  stopped at a stop token, which is then reported as the model's
  end-of-sequence id, as ONNX Runtime GenAI reports it.
* A session cannot rewind (``resumable = False``): a conversation frees its
  generator when a turn ends and prefills its whole history again the next
  turn (``Conversation.reprefills``).
* The engine still tokenizes a prompt inside its prefill: two turns at once
  on one runtime (one prefilling while another decodes) may meet the heap
  fault above; not guarded, so run one turn at a time per model.
* Decoding runs ahead on LiteRT-LM's own thread up to the generator's
  ``max_length``; ``release`` cancels and closes the session.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

from .._errors import InferenceError, ModelLoadError, RuntimeUnavailableError
from ._runtime import LanguageRuntime

__all__ = ["LiteRTLanguageRuntime", "TextPieces"]


class LiteRTLanguageRuntime(LanguageRuntime):
    """A ``.litertlm`` model and its tokenizer on LiteRT-LM's CPU backend."""

    kind = "litert-lm"
    resumable = False  # a LiteRT-LM session cannot rewind: kept conversations re-prefill
    logits = False  # its sessions give no logits: a turn cannot be scored for a handoff

    def __init__(self, directory: str | os.PathLike[str], *, name: str | None = None,
                 version: str = "0", threads: int | None = None) -> None:  # fmt: skip
        self.directory = Path(directory)
        self.name = name or self.directory.name
        self.version = version
        files = sorted(self.directory.glob("*.litertlm"))
        if len(files) != 1:
            raise ModelLoadError(
                f"cannot load language model {self.directory}: "
                f"expected one .litertlm file, found {len(files)}"
            )
        try:
            import litert_lm
            from tokenizers import Tokenizer
        except ImportError as e:
            raise RuntimeUnavailableError(
                f"{e.name} is not installed: pip install 'tandem[litert-lm]'"
            ) from e
        try:
            # The agent's own copy of the tokenizer: litert_lm's Engine.tokenize/detokenize
            # corrupt the heap when called while a session decodes on its own thread.
            self.tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        except Exception as e:  # tokenizers raises its own Exception subclass
            raise ModelLoadError(
                f"cannot load language model {self.directory}: no readable tokenizer.json "
                f"beside the .litertlm ({e})"
            ) from e
        self._lt = litert_lm
        litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)  # its INFO is per load
        backend = litert_lm.Backend.CPU(thread_count=threads)
        try:
            with litert_lm.ModelInfo(str(files[0])) as info:
                context = int(info.max_context_tokens)
            # enable_benchmark: the engine's decode counts tell a stop token from the cap.
            self.engine = litert_lm.Engine(
                str(files[0]), backend=backend, max_num_tokens=context, enable_benchmark=True
            )
        except Exception as e:  # LiteRT-LM raises RuntimeError/ValueError with its reason
            raise ModelLoadError(f"cannot load language model {self.directory}: {e}") from e
        self.model_file = files[0]
        self.context_length = context or 2048
        stops = self.engine.eos_token_ids
        self.eos_token_ids = frozenset(s[0] for s in stops if len(s) == 1)
        self.accelerator = f"LiteRT-LM {backend.get_name()}"
        self._init_counters()

    # -- tokens ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text).ids] if text else []

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """The ids' text; bytes that form no character read U+FFFD."""
        return str(self.tokenizer.decode([int(t) for t in ids])) if len(ids) else ""

    def token_stream(self) -> TextPieces:
        """An incremental detokenizer: whole characters only, in order."""
        return TextPieces(self.decode)

    # -- generators ------------------------------------------------------------------------

    def new_generator(self, search: dict[str, Any]) -> LiteRTGenerator:
        """A generator with ONNX Runtime GenAI's ``search`` options; counted until ``release``."""
        generator = LiteRTGenerator(self, search)
        self._count(1)
        return generator

    def release(self, generator: Any) -> None:
        """Cancel the generator's decoding and free its session."""
        generator.close()
        self._count(-1)

    def __repr__(self) -> str:
        return f"<LiteRTLanguageRuntime {self.name}@{self.version} on {self.accelerator}>"


class TextPieces:
    """Ids in, text out: holds ids back while they end inside a character (U+FFFD)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._held: list[int] = []

    def decode(self, token: int) -> str:
        self._held.append(int(token))
        text = self._decode(self._held)
        if text.endswith("\ufffd") and len(self._held) < 8:  # a character is at most 4 bytes
            return ""
        self._held = []
        return text


def sampler_config(litert_lm: Any, search: dict[str, Any]) -> Any:
    """LiteRT-LM's ``SamplerConfig`` for ONNX Runtime GenAI's search options."""
    if not search.get("do_sample"):
        return litert_lm.SamplerConfig(top_k=1)
    return litert_lm.SamplerConfig(
        top_k=search.get("top_k"),
        top_p=search.get("top_p"),
        temperature=search.get("temperature", 1.0),
        seed=search.get("random_seed"),
    )


class LiteRTGenerator:
    """One turn on a LiteRT-LM session, stepped token by token as ``og.Generator`` is."""

    def __init__(self, runtime: LiteRTLanguageRuntime, search: dict[str, Any]) -> None:
        self._runtime = runtime
        self._sampler = sampler_config(runtime._lt, search)
        self._max_length = int(search.get("max_length") or runtime.context_length)
        self._session: Any = None
        self._chunks: Generator[Any, None, None] | None = None
        self._ready: collections.deque[int] = collections.deque()
        self._cap = 0  # the session's max_output_tokens
        self._tokens = 0  # prompt and output ids so far
        self._last: int | None = None
        self._ended = False

    def append_tokens(self, ids: Sequence[int]) -> None:
        """Prefill ``ids`` (as their text); only before decoding, as the session allows."""
        if self._chunks is not None:
            raise InferenceError("a LiteRT-LM session takes no tokens after it decoded")
        ids = [int(t) for t in ids]
        if not ids:
            return
        if self._session is None:
            self._cap = self._max_length - len(ids)
            if self._cap < 1:
                raise InferenceError(f"the prompt fills max_length {self._max_length}")
            self._session = self._runtime.engine.create_session(
                apply_prompt_template=False,
                sampler_config=self._sampler,
                max_output_tokens=self._cap,
            )
        self._session.run_prefill([self._runtime.decode(ids)])
        self._tokens += len(ids)

    def generate_next_token(self) -> None:
        if not self._fill():
            raise InferenceError("the LiteRT-LM session has nothing more to decode")
        self._last = self._ready.popleft()
        self._tokens += 1

    def get_next_tokens(self) -> list[int]:
        if self._last is None:
            raise InferenceError("no token decoded yet")
        return [self._last]

    def is_done(self) -> bool:
        """True once the session stopped (waits for its next piece to know)."""
        return self._tokens >= self._max_length or not self._fill()

    def token_count(self) -> int:
        return self._tokens

    def _fill(self) -> bool:
        """Make sure an id is ready; False once the session has no more."""
        if self._session is None:
            raise InferenceError("append the prompt's tokens first")
        if self._chunks is None:
            self._chunks = self._session.run_decode_async()
        while not self._ready and not self._ended:
            try:
                piece = next(self._chunks)
            except StopIteration:
                self._end_of_stream()
                break
            self._ready.extend(self._runtime.encode("".join(piece.texts)))
        return bool(self._ready)

    def _end_of_stream(self) -> None:
        """The session ended: at a stop token (reported as EOS) or at its cap."""
        self._ended = True
        decoded = self._session.get_benchmark_info().last_decode_token_count
        eos = sorted(self._runtime.eos_token_ids)
        if decoded < self._cap and eos:
            self._ready.append(eos[0])

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            if self._chunks is not None and not self._ended:
                session.cancel_process()
                self._chunks.close()  # the Python side of LiteRT-LM's stream
            session.close()
