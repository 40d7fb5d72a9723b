"""Train the pair of Llama-family causal language models with torch, for a bounded budget.

The configurations are built here in code (``transformers.LlamaConfig``),
never fetched from a model hub. Each step samples random windows of
``context`` tokens from the training documents (joined with ``</s>``); AdamW
with a short linear warm-up and cosine decay. The two models train in
lockstep, one step each in turn, for ``steps`` steps or until
``max_seconds`` of wall time, whichever comes first (the report says which;
the learning-rate schedule follows whichever is nearer to its end):
the hub model therefore never gets fewer steps than the device model, however
busy the machine is, and the time bound holds for the pair.

With ``distill`` (a weight in ``(0, 1]``) the pair trains one after the other
instead, for a device that agrees with the hub (a speculative-decoding draft):
the hub first, alone, for ``steps`` steps or ``HUB_SHARE`` of ``max_seconds``;
then the hub (frozen, FP32, in torch) gives its temperature-1 log-probabilities
on a pool of up to ``POOL_WINDOWS`` training windows, and the device trains on
that pool for ``device_steps`` steps (or the rest of the time) on
``distill * KL(hub || device) + (1 - distill) * cross-entropy`` to the text.
The pool is computed once because a heavy hub's forward pass costs a hundred
device steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM

__all__ = ["HUB_SHARE", "POOL_WINDOWS", "ModelShape", "TrainResult", "llama_config", "train_pair"]

HUB_SHARE = 0.7  # of max_seconds, the hub's phase of a distilled build
POOL_WINDOWS = 64  # training windows the hub labels for the device's distillation


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The size of one model of the family (all share vocabulary, context and tokenizer)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    batch_size: int
    lr: float

    def __post_init__(self) -> None:
        ints = ("hidden", "layers", "heads", "kv_heads", "intermediate", "batch_size")
        bad = [n for n in ints if getattr(self, n) < 1]
        if bad:
            raise ValueError(f"model shape fields must be >= 1: {', '.join(bad)}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"hidden {self.hidden} must divide by heads {self.heads}, "
                f"and heads by kv_heads {self.kv_heads}"
            )
        if (self.hidden // self.heads) % 16:
            # ONNX Runtime's GroupQueryAttention kernel refuses other head sizes.
            raise ValueError(f"head size {self.hidden // self.heads} must be a multiple of 16")
        if self.lr <= 0:
            raise ValueError("lr must be > 0")


@dataclass(frozen=True)
class TrainResult:
    model: LlamaForCausalLM
    params: int
    steps_run: int
    seconds: float  # this model's own share of the training time
    final_loss: float  # mean training loss over the last 10% of steps


def llama_config(shape: ModelShape, *, vocab_size: int, context: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=context,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attention_bias=False,
        mlp_bias=False,
    )


class _Trainer:
    """One model, its optimizer, schedule and batch sampler; ``step()`` runs one update."""

    def __init__(
        self, shape: ModelShape, stream: torch.Tensor, *, vocab: int, context: int, seed: int
    ) -> None:
        import torch
        from transformers import LlamaForCausalLM

        torch.manual_seed(seed)
        self.model = LlamaForCausalLM(llama_config(shape, vocab_size=vocab, context=context))
        self.model.train()
        self.shape, self.stream, self.vocab, self.context = shape, stream, vocab, context
        self.generator = torch.Generator().manual_seed(seed)
        named = list(self.model.named_parameters())
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=shape.lr,
            betas=(0.9, 0.95),
        )
        self.offsets = torch.arange(context + 1)
        self.losses: list[float] = []
        self.seconds = 0.0

    def step(self, done: float) -> None:
        """One update at learning rate ``lr * schedule(done)``, ``done`` the budget spent (0..1)."""
        import torch.nn.functional as F

        started = time.perf_counter()
        window = self.windows(self.shape.batch_size)
        logits = self.model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), window[:, 1:].reshape(-1))
        self._update(done, loss)
        self.seconds += time.perf_counter() - started

    def distill_step(
        self, done: float, pool: torch.Tensor, teacher: torch.Tensor, weight: float
    ) -> None:
        """One update on a batch of the pool's windows: ``weight`` * KL to the teacher's
        log-probabilities ``teacher`` (float16, pool x context x vocab) + the rest * CE."""
        import torch
        import torch.nn.functional as F

        started = time.perf_counter()
        pick = torch.randint(0, len(pool), (self.shape.batch_size,), generator=self.generator)
        window = pool[pick]
        logits = self.model(input_ids=window[:, :-1]).logits.reshape(-1, self.vocab)
        log_p = F.log_softmax(logits, dim=-1)
        target = teacher[pick].reshape(-1, self.vocab).float()
        kl = F.kl_div(log_p, target, log_target=True, reduction="batchmean")
        ce = F.nll_loss(log_p, window[:, 1:].reshape(-1))
        self._update(done, weight * kl + (1.0 - weight) * ce)
        self.seconds += time.perf_counter() - started

    def windows(self, n: int) -> torch.Tensor:
        """``n`` random windows of ``context + 1`` tokens of the training stream."""
        import torch

        high = len(self.stream) - self.context - 1
        starts = torch.randint(0, high, (n,), generator=self.generator)
        return self.stream[starts[:, None] + self.offsets[None, :]]

    def _update(self, done: float, loss: torch.Tensor) -> None:
        import torch

        for group in self.optimizer.param_groups:
            group["lr"] = self.shape.lr * _lr_factor(done)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.losses.append(float(loss.detach()))

    def result(self) -> TrainResult:
        tail = self.losses[-max(1, len(self.losses) // 10) :] or [math.nan]
        return TrainResult(
            model=self.model.eval(),
            params=sum(p.numel() for p in self.model.parameters()),
            steps_run=len(self.losses),
            seconds=self.seconds,
            final_loss=float(np.mean(tail)),
        )


def train_pair(
    shapes: dict[str, ModelShape],
    tokens: np.ndarray,
    *,
    vocab_size: int,
    context: int,
    steps: int,
    max_seconds: float,
    seed: int,
    progress: Callable[[float], None],
    distill: float | None = None,
    device_steps: int | None = None,
) -> tuple[dict[str, TrainResult], str]:
    """Train one model per shape from fresh weights, in lockstep, on the token stream ``tokens``.

    Returns the results by name and what stopped training: ``"steps"`` or ``"time"``
    (``"time"`` when either phase of a distilled build ran out of its time).
    ``distill`` (needs shapes named ``"device"`` and ``"hub"``): train the hub,
    then the device on its soft targets, as the module says; ``device_steps``
    (default ``steps``) bounds the device's phase.
    """
    import torch

    if len(tokens) <= context + 1:
        raise ValueError(f"{len(tokens)} training tokens is too few for context {context}")
    stream = torch.from_numpy(tokens.astype(np.int64))
    trainers = {
        name: _Trainer(shape, stream, vocab=vocab_size, context=context, seed=seed + i)
        for i, (name, shape) in enumerate(shapes.items())
    }
    if distill is not None:
        if set(trainers) != {"device", "hub"} or not 0.0 < distill <= 1.0:
            raise ValueError("distill needs a device and a hub shape and a weight in (0, 1]")
        stopped = _distill(
            trainers["hub"], trainers["device"], steps=steps, device_steps=device_steps or steps,
            max_seconds=max_seconds, weight=distill, progress=progress,
        )  # fmt: skip
        return {name: t.result() for name, t in trainers.items()}, stopped
    started = time.perf_counter()
    stopped_by = "steps"
    progress(0.0)
    for step in range(steps):
        elapsed = time.perf_counter() - started
        if elapsed > max_seconds:
            stopped_by = "time"
            break
        # The schedule follows whichever bound is nearer, so a run cut short by the clock
        # still ends at a low learning rate instead of mid-schedule.
        done = max(step / steps, elapsed / max_seconds)
        for trainer in trainers.values():
            trainer.step(done)
        progress((step + 1) / steps)
    return {name: t.result() for name, t in trainers.items()}, stopped_by


def _distill(
    hub: _Trainer,
    device: _Trainer,
    *,
    steps: int,
    device_steps: int,
    max_seconds: float,
    weight: float,
    progress: Callable[[float], None],
) -> str:
    """The hub alone, then its soft targets on a pool, then the device on them (see above)."""
    import torch

    progress(0.0)
    stopped = "steps"
    hub_seconds = max_seconds * HUB_SHARE
    started = time.perf_counter()
    for step in range(steps):
        elapsed = time.perf_counter() - started
        if elapsed > hub_seconds:
            stopped = "time"
            break
        hub.step(max(step / steps, elapsed / hub_seconds))
        progress(0.5 * (step + 1) / steps)
    hub.model.eval()
    pool_parts: list[torch.Tensor] = []
    teacher_parts: list[torch.Tensor] = []
    with torch.no_grad():
        while sum(int(p.shape[0]) for p in pool_parts) < POOL_WINDOWS:
            window = device.windows(hub.shape.batch_size)
            logits = hub.model(input_ids=window[:, :-1]).logits
            pool_parts.append(window)
            teacher_parts.append(torch.log_softmax(logits.float(), dim=-1).half())
            if time.perf_counter() - started > max_seconds * (1 + HUB_SHARE) / 2:
                break  # a slow hub: fewer windows, the device's phase keeps its time
    hub.model.train()
    pool, teacher = torch.cat(pool_parts), torch.cat(teacher_parts)
    device_started = time.perf_counter()
    device_seconds = max(max_seconds - (device_started - started), 1e-3)
    for step in range(device_steps):
        elapsed = time.perf_counter() - device_started
        if elapsed > device_seconds:
            stopped = "time"
            break
        device.distill_step(
            max(step / device_steps, elapsed / device_seconds), pool, teacher, weight
        )
        progress(0.5 + 0.5 * (step + 1) / device_steps)
    return stopped


_WARMUP = 0.05  # of the budget


def _lr_factor(done: float) -> float:
    """Linear warm-up over the first 5% of the budget, then cosine decay to 10%."""
    if done < _WARMUP:
        return max(done / _WARMUP, 0.02)
    progress = min(1.0, (done - _WARMUP) / (1.0 - _WARMUP))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
