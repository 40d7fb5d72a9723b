"""The hub model's ONNX graph run by plain ONNX Runtime, for verifying drafts.

Why not ONNX Runtime GenAI: ``og.Generator.get_logits()`` gives the last
position only, and ``og.Engine`` verifies external drafts
(``Request.set_draft_tokens``) only where ``max_draft_tokens_per_proposal()``
is above 0, which needs a PagedAttention model (built for CUDA FP16/BF16 or
WebGPU); for the CPU models here it is 0. Where it is above 0 the engine
path would hand each round's drafts to ``set_draft_tokens`` and read the
accepted count from the request's tokens; not written here, since it cannot
run on this hub.

So ``VerifyModel`` loads the same ``model.onnx`` of the served folder with
``onnxruntime.InferenceSession`` (its names from ``genai_config.json``) and
runs ``forward``: ``input_ids`` int64 ``[1, s]``, ``attention_mask`` int64
``[1, past + s]``, the past keys and values ``[1, kv_heads, past, head]``
per layer, giving logits ``[1, s, vocab]`` for every position and the
present keys and values ``[1, kv_heads, past + s, head]``. One sequence per
call once there is a past: the GroupQueryAttention kernel of these models
refuses a batch above 1 when ``s > 1`` and a past is given ("batch_size must
be 1 when sequence_length > 1 and past context is given", ONNX Runtime
1.32; ``tests/test_spec_verifier.py`` keeps that refusal in sight). With no
past it takes a batch: ``forward_batch`` runs several sequences of one
length in one call, exactly (no padding; tested against ``forward``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import RepositoryError

__all__ = ["VerifyModel"]

KV = list[np.ndarray]  # key 0, value 0, key 1, value 1, ...


@dataclass(frozen=True)
class _Names:
    input_ids: str
    attention_mask: str
    past: list[str]  # in the order of ``KV``
    logits: str
    present: list[str]


class VerifyModel:
    """One model folder's ONNX graph in an ONNX Runtime session (thread-safe ``forward``)."""

    def __init__(self, directory: str | Path) -> None:
        import onnxruntime as ort

        self.directory = Path(directory)
        try:
            config = json.loads((self.directory / "genai_config.json").read_text())
            model = config["model"]
            decoder = model["decoder"]
            self.layers = int(decoder["num_hidden_layers"])
            self.kv_heads = int(decoder["num_key_value_heads"])
            self.head_size = int(decoder["head_size"])
            self.vocab_size = int(model["vocab_size"])
            self.context = int(model["context_length"])
            top_k = config.get("search", {}).get("top_k")
            self.top_k = int(top_k) if top_k else None  # what the engine samples with
            eos = model.get("eos_token_id", [])
            self.eos = frozenset(int(t) for t in (eos if isinstance(eos, list) else [eos]))
            names = self._names(decoder)
            providers = ["CPUExecutionProvider"]
            wanted = json.dumps(decoder.get("session_options", {})).lower()
            if "cuda" in wanted and "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, "CUDAExecutionProvider")
            self._session = ort.InferenceSession(
                str(self.directory / decoder.get("filename", "model.onnx")), providers=providers
            )
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise RepositoryError(f"{self.directory}: cannot load it for verifying: {e}") from e
        self._n = names
        self._dtype: Any = np.float32
        for i in self._session.get_inputs():
            if i.name == names.past[0] and "float16" in i.type:
                self._dtype = np.float16
        self._lock = threading.Lock()
        self.forwards = 0

    @staticmethod
    def _names(decoder: dict[str, Any]) -> _Names:
        inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
        layers = int(decoder["num_hidden_layers"])
        past_k = inputs.get("past_key_names", "past_key_values.%d.key")
        past_v = inputs.get("past_value_names", "past_key_values.%d.value")
        pres_k = outputs.get("present_key_names", "present.%d.key")
        pres_v = outputs.get("present_value_names", "present.%d.value")
        return _Names(
            input_ids=inputs.get("input_ids", "input_ids"),
            attention_mask=inputs.get("attention_mask", "attention_mask"),
            past=[n % i for i in range(layers) for n in (past_k, past_v)],
            logits=outputs.get("logits", "logits"),
            present=[n % i for i in range(layers) for n in (pres_k, pres_v)],
        )

    def empty(self) -> KV:
        """The KV cache of no tokens."""
        shape = (1, self.kv_heads, 0, self.head_size)
        return [np.zeros(shape, dtype=self._dtype) for _ in range(2 * self.layers)]

    def forward(self, ids: list[int], past: KV) -> tuple[np.ndarray, KV]:
        """Logits ``[s, vocab]`` (float32) of every position of ``ids`` after ``past``, and
        the KV cache of ``past`` plus ``ids``."""
        n = self._n
        total = past[0].shape[2] + len(ids)
        feeds: dict[str, np.ndarray] = {
            n.input_ids: np.asarray([ids], dtype=np.int64),
            n.attention_mask: np.ones((1, total), dtype=np.int64),
        }
        feeds.update(zip(n.past, past, strict=True))
        outputs = self._session.run([n.logits, *n.present], feeds)
        with self._lock:
            self.forwards += 1
        return np.asarray(outputs[0][0], dtype=np.float32), list(outputs[1:])

    def forward_batch(self, rows: list[list[int]]) -> list[tuple[np.ndarray, KV]]:
        """``forward`` of several sequences of one length after no past, in one run (exact:
        no padding, and the kernel takes a batch when there is no past)."""
        n = self._n
        if len({len(r) for r in rows}) != 1:
            raise ValueError("forward_batch takes sequences of one length")
        b = len(rows)
        feeds: dict[str, np.ndarray] = {
            n.input_ids: np.asarray(rows, dtype=np.int64),
            n.attention_mask: np.ones((b, len(rows[0])), dtype=np.int64),
        }
        shape = (b, self.kv_heads, 0, self.head_size)
        feeds.update((name, np.zeros(shape, dtype=self._dtype)) for name in n.past)
        outputs = self._session.run([n.logits, *n.present], feeds)
        with self._lock:
            self.forwards += 1
        logits = np.asarray(outputs[0], dtype=np.float32)
        return [(logits[i], [x[i : i + 1] for x in outputs[1:]]) for i in range(b)]
