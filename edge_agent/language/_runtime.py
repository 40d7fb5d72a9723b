"""A language model on the device, run by ONNX Runtime GenAI.

``LanguageRuntime`` loads an ONNX Runtime GenAI model folder
(``genai_config.json``, the ONNX model and its data, the tokenizer files) with
``og.Model`` and ``og.Tokenizer``. ``onnxruntime_genai`` is imported when the
first model loads, so ``import edge_agent`` stays light and a device without
language models never needs it (``pip install 'tandem[llm]'`` adds it).

``accelerator`` names the execution provider the model's configuration asks
for, as ONNX Runtime calls it (``CPUExecutionProvider``,
``QNNExecutionProvider`` for a Qualcomm NPU, ``CUDAExecutionProvider``, ...),
like the tensor runtimes report theirs. It also counts the generators alive
(``live_generators``: a closed or finished stream frees its own at once) and
measures this device's prompt (prefill) and decode rates, which the heavy
rule of the presets reads.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from shared import genai_execution_provider

from .._errors import InferenceError, ModelLoadError, RuntimeUnavailableError
from .._estimator import Ewma
from ._presets import DeviceRates

__all__ = ["LanguageRuntime"]


class LanguageRuntime:
    """An ONNX Runtime GenAI model and its tokenizer, loaded from a model folder."""

    kind = "onnxruntime-genai"
    # A generator takes more tokens after it decoded (``rewind_to`` and ``append_tokens``),
    # so a conversation keeps it between turns and reuses its KV cache (``Conversation``).
    resumable = True
    # ``get_logits`` on its generators: a turn can be scored and handed off (``_handoff``).
    logits = True

    def __init__(self, directory: str | os.PathLike[str], *, name: str | None = None,
                 version: str = "0") -> None:  # fmt: skip
        self.directory = Path(directory)
        self.name = name or self.directory.name
        self.version = version
        config_path = self.directory / "genai_config.json"
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelLoadError(
                f"cannot load language model {self.directory}: no readable genai_config.json ({e})"
            ) from e
        try:
            import onnxruntime_genai as og
        except ImportError as e:
            raise RuntimeUnavailableError(
                "onnxruntime-genai is not installed: pip install 'tandem[llm]'"
            ) from e
        self._og = og
        try:
            self.model = og.Model(str(self.directory))
            self.tokenizer = og.Tokenizer(self.model)
        except Exception as e:  # ONNX Runtime GenAI's own errors
            raise ModelLoadError(f"cannot load language model {self.directory}: {e}") from e
        model_config = config.get("model", {})
        self.context_length = int(model_config.get("context_length", 0)) or 2048
        eos = model_config.get("eos_token_id", [])
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])
        self.accelerator = genai_execution_provider(config)
        self._init_counters()

    def _init_counters(self) -> None:
        """The generator count and the rate estimates, shared with the other runtimes."""
        self._lock = threading.Lock()
        self._live = 0
        self._prefill_rate = Ewma(alpha=0.3)
        self._decode_rate = Ewma(alpha=0.3)

    # -- tokens ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        import numpy as np

        return str(self.tokenizer.decode(np.asarray(ids, dtype=np.int32))) if ids else ""

    def token_stream(self) -> Any:
        """ONNX Runtime GenAI's incremental detokenizer: whole characters only, in order."""
        return self.tokenizer.create_stream()

    # -- generators ------------------------------------------------------------------------

    def new_generator(self, search: dict[str, Any]) -> Any:
        """An ``og.Generator`` with ``search`` options; count it until ``release``."""
        try:
            params = self._og.GeneratorParams(self.model)
            params.set_search_options(**search)
            generator = self._og.Generator(self.model, params)
        except Exception as e:
            raise InferenceError(f"{self.kind} could not start a generator: {e}") from e
        self._count(1)
        return generator

    def _count(self, delta: int) -> None:
        with self._lock:
            self._live += delta

    def release(self, generator: Any) -> None:
        """Forget a generator from ``new_generator``; the caller drops its last reference."""
        del generator
        self._count(-1)

    @property
    def live_generators(self) -> int:
        """Generators started and not yet released (a finished or closed stream has none)."""
        return self._live

    # -- measured rates --------------------------------------------------------------------

    def observe(self, *, prefill_tokens: int, prefill_s: float, decode_tokens: int,
                decode_s: float) -> None:  # fmt: skip
        if prefill_tokens > 0 and prefill_s > 0:
            self._prefill_rate.update(prefill_tokens / prefill_s)
        if decode_tokens > 0 and decode_s > 0:
            self._decode_rate.update(decode_tokens / decode_s)

    @property
    def rates(self) -> DeviceRates | None:
        """This device's prefill and decode rates, once both were measured."""
        prefill, decode = self._prefill_rate.value, self._decode_rate.value
        if prefill is None or decode is None:
            return None
        return DeviceRates(prefill, decode)

    def close(self) -> None:
        """Nothing to release explicitly: the model goes with its last reference."""

    def __repr__(self) -> str:
        return f"<LanguageRuntime {self.name}@{self.version} on {self.accelerator}>"
