"""What a refine trainer receives, and the default trainer: distillation with replay.

``tandem models refine --trainer MODULE:FUNC`` calls ``FUNC(data)`` with a
``TrainingData``; it returns the refined model as a ``torch.nn.Module``, ONNX
bytes, or the path of an ONNX file. The job then exports (a module),
quantizes, compares and publishes it; a trainer only trains.

``distill`` (``tandem.learning:distill``, the default) fine-tunes the model in
service, rebuilt from its float ONNX (``_onnx_torch``), on the collected
examples with the cloud's answers as soft targets (knowledge distillation:
KL divergence at ``temperature``), each step mixed with a batch of the
replay data (cross-entropy on its labels, or, without labels, distillation
from the model in service itself) so that what it knew is not forgotten.
AdamW with a one-cycle schedule, seeded: the same data give the same model.
Options (``--trainer-option key=value``): ``epochs`` (20), ``lr`` (0.01),
``batch_size`` (64), ``temperature`` (2.0), ``replay_weight`` (2.0),
``weight_decay`` (1e-4).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import RefineError
from ._onnx_torch import torch_from_onnx

if TYPE_CHECKING:
    import torch

__all__ = ["DISTILL_OPTIONS", "Trainer", "TrainingData", "distill", "load_trainer", "onnx_of"]

DISTILL_OPTIONS: Mapping[str, float] = {
    "epochs": 20,
    "lr": 0.01,
    "batch_size": 64,
    "temperature": 2.0,
    "replay_weight": 2.0,
    "weight_decay": 1e-4,
}


@dataclass(frozen=True, kw_only=True, eq=False)
class TrainingData:
    """Everything a trainer gets. Arrays are read-only views; copy what you change."""

    base_onnx: bytes  # the float model of the version in service
    input_name: str
    output_name: str
    inputs: np.ndarray  # the collected inputs for training, [N, ...]
    targets: np.ndarray  # the cloud's answer to each (its first output), [N, classes]
    target_labels: np.ndarray  # the top class of each target, int64 [N]
    replay_inputs: np.ndarray | None = None  # the original training data, against forgetting
    replay_labels: np.ndarray | None = None  # its labels (None: distill from the base model)
    options: Mapping[str, str] = field(default_factory=dict)  # --trainer-option key=value
    seed: int = 0
    progress: Callable[[float], None] = lambda fraction: None


Trainer = Callable[[TrainingData], Any]  # returns a torch.nn.Module, ONNX bytes or a path


def distill(data: TrainingData) -> torch.nn.Module:
    """The default trainer; see the module docstring."""
    import torch
    import torch.nn.functional as F

    options = _options(data.options)
    chain = torch_from_onnx(data.base_onnx)
    model = chain.module
    teacher = copy.deepcopy(model).eval() if data.replay_labels is None else None
    threads = torch.get_num_threads()
    torch.set_num_threads(min(4, max(1, len(os.sched_getaffinity(0)))))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(data.seed)
            generator = torch.Generator().manual_seed(data.seed)
            # Copies: trainers get read-only views, and torch wants arrays it may write.
            x = torch.from_numpy(np.array(data.inputs, dtype=np.float32))
            soft = torch.softmax(
                torch.from_numpy(np.array(data.targets, dtype=np.float32)) / options["temperature"],
                dim=1,
            )
            replay = _replay(data)
            batch = int(options["batch_size"])
            steps = max(1, int(options["epochs"]) * math.ceil(len(x) / batch))
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=options["lr"], weight_decay=options["weight_decay"]
            )
            schedule = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=options["lr"], total_steps=steps
            )
            model.train()
            step = 0
            t = options["temperature"]
            while step < steps:
                for index in torch.randperm(len(x), generator=generator).split(batch):
                    if step == steps:
                        break
                    logits = model(x[index])
                    loss = F.kl_div(
                        F.log_softmax(logits / t, dim=1), soft[index], reduction="batchmean"
                    ) * (t * t)
                    if replay is not None:
                        loss = loss + options["replay_weight"] * _replay_loss(
                            model, teacher, replay, batch, generator, t
                        )
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    schedule.step()
                    step += 1
                    data.progress(step / steps)
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _options(given: Mapping[str, str]) -> dict[str, float]:
    unknown = set(given) - set(DISTILL_OPTIONS)
    if unknown:
        raise RefineError(
            f"the default trainer has no option {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(DISTILL_OPTIONS)}"
        )
    options = dict(DISTILL_OPTIONS)
    for name, text in given.items():
        try:
            value = float(text)
        except ValueError:
            raise RefineError(f"trainer option {name}={text!r} is not a number") from None
        if not math.isfinite(value) or value < 0 or (name != "weight_decay" and value == 0):
            raise RefineError(f"trainer option {name}={text!r} is out of range")
        options[name] = value
    return options


def _replay(data: TrainingData) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    import torch

    if data.replay_inputs is None or len(data.replay_inputs) == 0:
        return None
    inputs = torch.from_numpy(np.array(data.replay_inputs, dtype=np.float32))
    if data.replay_labels is None:
        return inputs, None
    labels = np.asarray(data.replay_labels)
    if labels.ndim > 1:  # one-hot or scores: their top class
        labels = labels.reshape(len(labels), -1).argmax(axis=1)
    return inputs, torch.from_numpy(labels.astype(np.int64))


def _replay_loss(
    model: torch.nn.Module,
    teacher: torch.nn.Module | None,
    replay: tuple[torch.Tensor, torch.Tensor | None],
    batch: int,
    generator: torch.Generator,
    t: float,
) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    inputs, labels = replay
    index = torch.randint(0, len(inputs), (batch,), generator=generator)
    logits = model(inputs[index])
    if labels is not None:
        return F.cross_entropy(logits, labels[index])
    assert teacher is not None
    with torch.no_grad():
        reference = torch.softmax(teacher(inputs[index]) / t, dim=1)
    return F.kl_div(F.log_softmax(logits / t, dim=1), reference, reduction="batchmean") * (t * t)


def load_trainer(spec: str) -> Trainer:
    """``MODULE:FUNC`` imported (the operator names code to run, as with any plugin)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RefineError(f"a trainer is MODULE:FUNC, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RefineError(f"cannot import the trainer's module {module_name!r}: {e}") from e
    trainer = getattr(module, attr, None)
    if not callable(trainer):
        raise RefineError(f"{module_name} has no function {attr!r}")
    return trainer


def onnx_of(result: Any, example: np.ndarray, input_name: str, output_name: str) -> bytes:
    """The float ONNX a trainer returned: a module (exported here), bytes, or a file."""
    if isinstance(result, bytes | bytearray):
        return bytes(result)
    if isinstance(result, str | os.PathLike):
        try:
            return Path(result).read_bytes()
        except OSError as e:
            raise RefineError(f"the trainer's model file cannot be read: {e}") from e
    from model_cdn.publish import export_torch

    try:
        return export_torch(result, example[:2], input_name=input_name, output_name=output_name)
    except Exception as e:  # PublishError, or whatever a strange module raises
        raise RefineError(f"the trainer returned {type(result).__name__}, not a model: {e}") from e
