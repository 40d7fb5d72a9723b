"""``refine_model``: collected examples in, a better edge model published (or refused) out.

The job behind ``tandem models refine NAME``:

1. read the collected examples answered by edge model ``NAME`` from the store
   (``shared.load_examples``: shards the hub wrote; privacy-mode shards keep
   no inputs and cannot train anything) and hold out a seeded share of them;
2. fetch the version in service from the publish target (its signed
   manifest and blob: the quantized model devices run);
3. call the trainer (``--trainer MODULE:FUNC``, default ``distill``) with
   the float model of that version (``--base``), the training examples with
   the cloud's answers as targets and the replay data (``--replay``);
4. export, then quantize the result the way the version in service was
   (``model_cdn.publish.quantize_model``, same method and calibration);
5. judge both quantized models on the held-out examples and the validation
   set (``_refine_report.refusals``): a candidate that is worse is refused,
   ``RefineRefusedError`` carrying both models' figures, and nothing is
   published;
6. otherwise publish it through the publish pipeline (``publish_model``:
   quantized, validated against its float model, compressed, delta, signed)
   to the same target, and write the new float model (the next job's
   ``--base``) and the report to ``out_dir``.

Rolling the new version out is the rollout service's job (``tandem rollout
start``, or the CLI's ``--rollout`` which asks it): the agreement gate then
compares it with the version in service on live traffic.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import ExampleRows, SigningKey, atomic_write_bytes, decompress_blob
from shared.server import load_examples
from shared.server.store import BlobStore, open_store

from ._distill import TrainingData, load_trainer, onnx_of
from ._errors import RefineError, RefineRefusedError
from ._report import ModelFigures, RefineReport, refusals

if TYPE_CHECKING:
    from model_cdn.publish import LatestVersion, PublishTarget

__all__ = ["DEFAULT_TRAINER", "RefineSettings", "refine_model"]

DEFAULT_TRAINER = "tandem.learning:distill"
Progress = Callable[[str, float], None]


@dataclass(frozen=True, kw_only=True)
class RefineSettings:
    """One refine job (see the module docstring); fractions are shares of 1."""

    model: str  # the edge model's name in the CDN
    examples: str  # the store the hub collects into: a path, file:// or s3:// URL
    base: Path  # the float ONNX model of the version in service
    validation: Path  # original held-out data: .npz with inputs and labels
    calibration: Path | None = None  # for static INT8 (.npy, or .npz with inputs)
    replay: Path | None = (
        None  # original training data (.npz inputs [+ labels]), against forgetting
    )
    trainer: str = DEFAULT_TRAINER
    trainer_options: Mapping[str, str] = field(default_factory=dict)
    cloud_model: str | None = None  # only examples the hub collected for this model
    holdout: float = 0.2  # of the collected examples, kept out of training to judge
    min_gain: float = 0.0  # held-out agreement the candidate must gain over the one in service
    max_forgetting: float = 0.005  # validation accuracy it may lose
    min_agreement: float = 0.97  # the publish gate: quantized vs float
    seed: int = 0
    out_dir: Path | None = None

    def __post_init__(self) -> None:
        for name in ("holdout", "max_forgetting", "min_agreement"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"holdout must be between 0 and 1, got {self.holdout}")
        if not -1.0 <= self.min_gain <= 1.0:
            raise ValueError(f"min_gain must be within [-1, 1], got {self.min_gain}")


@dataclass(frozen=True, eq=False)
class _Data:
    """What the job loaded: examples split in two, validation, replay, calibration."""

    train: ExampleRows
    held_out: ExampleRows
    validation: tuple[np.ndarray, np.ndarray]
    replay: tuple[np.ndarray | None, np.ndarray | None]
    calibration: np.ndarray | None


def refine_model(
    settings: RefineSettings,
    *,
    target: PublishTarget,
    signing_key: SigningKey,
    store: BlobStore | None = None,
    progress: Progress | None = None,
) -> RefineReport:
    """Run the job; the report of what was published, or ``RefineRefusedError``."""
    from model_cdn.publish import quantize_model

    step: Progress = progress or (lambda stage, fraction: None)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    data = _load(settings, store or open_store(settings.examples))
    latest = target.latest(settings.model)
    if latest is None:
        raise RefineError(f"{settings.model} has no published version to refine")
    current = _current_model(target, latest)
    method = str(latest.manifest["signed"].get("quantization", {}).get("method", "int8-static"))
    if method == "int8-static" and data.calibration is None:
        raise RefineError(f"{settings.model} is static INT8: give calibration inputs")
    try:
        base = settings.base.read_bytes()
    except OSError as e:
        raise RefineError(f"cannot read the base model {settings.base}: {e}") from e
    seconds["load"] = time.perf_counter() - started

    mark = time.perf_counter()
    step("train", 0.0)
    candidate_float = _train(settings, data, base, lambda f: step("train", f))
    step("train", 1.0)
    seconds["train"] = time.perf_counter() - mark

    mark = time.perf_counter()
    candidate = quantize_model(
        candidate_float,
        method,
        input_name=_io_names(candidate_float)[0],
        calibration=data.calibration,
    )
    label = f"{settings.model}@{latest.version}"
    report = _judge(settings, data, label, current, candidate)
    report.examples = _describe(data)
    seconds["judge"] = time.perf_counter() - mark
    report.seconds = seconds
    if report.refused:
        _write_files(settings, report, None, None)
        raise RefineRefusedError(
            f"{settings.model}: the refined model is worse than {label}: "
            + "; ".join(report.refusals),
            report,
        )
    mark = time.perf_counter()
    _publish(settings, report, data, latest, target, signing_key, candidate_float, method, step)
    seconds["publish"] = time.perf_counter() - mark
    seconds["total"] = time.perf_counter() - started
    _write_files(settings, report, candidate_float, report.version)
    return report


def _publish(
    settings: RefineSettings,
    report: RefineReport,
    data: _Data,
    latest: LatestVersion,
    target: PublishTarget,
    signing_key: SigningKey,
    model: bytes,
    method: str,
    step: Progress,
) -> None:
    """The candidate through the publish pipeline, as the version in service was made."""
    from model_cdn.publish import publish_model

    published = publish_model(
        model,
        name=settings.model,
        signing_key=signing_key,
        target=target,
        quantize=method,  # type: ignore[arg-type]  # as the version in service was
        calibration=data.calibration,
        validation=data.validation,
        min_agreement=settings.min_agreement,
        labels=latest.manifest["signed"].get("labels"),
        progress=lambda stage, fraction: step(f"publish: {stage}", fraction),
    )
    report.version = published.manifest.version
    report.published = {
        "blob_digest": published.blob_digest,
        "blob_bytes": published.manifest.blob.size,
        "deltas": [d.to_dict() for d in published.manifest.deltas],
        "validation": published.report,
    }


def _load(settings: RefineSettings, store: BlobStore) -> _Data:
    from model_cdn.publish import load_samples

    examples = load_examples(store, model=settings.cloud_model, edge_model=settings.model)
    if not examples.inputs_kept:
        raise RefineError(
            "the collected examples keep no inputs (collection.keep_inputs is false): "
            "there is nothing to train on"
        )
    if len(examples.inputs) != 1:
        raise RefineError(f"examples with {len(examples.inputs)} inputs; the job feeds one")
    if len(examples) < 10:
        raise RefineError(f"{len(examples)} collected examples are too few to refine on")
    order = np.random.default_rng(settings.seed).permutation(len(examples))
    cut = max(1, round(len(examples) * settings.holdout))
    val_inputs, val_labels = load_samples(settings.validation)
    if val_labels is None:
        raise RefineError(f"{settings.validation} has no labels: the validation set needs them")
    replay: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    if settings.replay is not None:
        replay = load_samples(settings.replay)
    calibration = load_samples(settings.calibration)[0] if settings.calibration else None
    return _Data(
        train=examples.take(np.sort(order[cut:])),
        held_out=examples.take(np.sort(order[:cut])),
        validation=(val_inputs, val_labels),
        replay=replay,
        calibration=calibration,
    )


def _current_model(target: PublishTarget, latest: LatestVersion) -> bytes:
    """The quantized model devices run now: the latest version's blob, unpacked."""
    ref = latest.blob()
    if ref is None:
        raise RefineError("the latest manifest names no blob to compare with")
    data = target.blob(ref)
    return decompress_blob(data, ref.raw_size) if ref.compression == "zstd" else data


def _train(
    settings: RefineSettings, data: _Data, base: bytes, progress: Callable[[float], None]
) -> bytes:
    names = _io_names(base)
    inputs = next(iter(data.train.inputs.values()))
    targets = next(iter(data.train.outputs.values()))
    trainer = load_trainer(settings.trainer)
    result = trainer(
        TrainingData(
            base_onnx=base,
            input_name=names[0],
            output_name=names[1],
            inputs=_read_only(inputs),
            targets=_read_only(targets.reshape(len(targets), -1)),
            target_labels=_read_only(data.train.cloud_labels),
            replay_inputs=data.replay[0],
            replay_labels=data.replay[1],
            options=dict(settings.trainer_options),
            seed=settings.seed,
            progress=progress,
        )
    )
    if result is None:
        raise RefineError(f"the trainer {settings.trainer} returned nothing")
    return onnx_of(result, np.asarray(inputs[:2], dtype=np.float32), *names)


def _io_names(model: bytes) -> tuple[str, str]:
    """The model's (input, output) names."""
    import onnx

    try:
        graph = onnx.load_model_from_string(model).graph
    except Exception as e:
        raise RefineError(f"not an ONNX model: {e}") from e
    weights = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in weights]
    if len(inputs) != 1 or not graph.output:
        raise RefineError("the job refines models with one input")
    return inputs[0], graph.output[0].name


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.setflags(write=False)
    return view


def _session(model: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _top(session: Any, inputs: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    outputs = [
        session.run(None, {name: np.ascontiguousarray(inputs[i : i + 256], dtype=np.float32)})[0]
        for i in range(0, len(inputs), 256)
    ]
    joined = np.concatenate(outputs)
    return joined.reshape(len(joined), -1).argmax(axis=1)


def _judge(
    settings: RefineSettings,
    data: _Data,
    label: str,
    current: bytes,
    candidate: bytes,
) -> RefineReport:
    held_inputs = next(iter(data.held_out.inputs.values()))
    val_inputs, val_labels = data.validation
    truth = np.asarray(val_labels)
    if truth.ndim > 1:
        truth = truth.reshape(len(truth), -1).argmax(axis=1)
    figures = []
    for name, model in ((label, current), ("candidate", candidate)):
        session = _session(model)
        figures.append(
            ModelFigures(
                name,
                round(float(np.mean(_top(session, held_inputs) == data.held_out.cloud_labels)), 6),
                round(float(np.mean(_top(session, val_inputs) == truth)), 6),
            )
        )
    why = refusals(
        figures[0],
        figures[1],
        min_gain=settings.min_gain,
        max_forgetting=settings.max_forgetting,
        held_out=len(data.held_out),
        validation=len(truth),
    )
    return RefineReport(
        model=settings.model,
        current_version=int(label.rsplit("@", 1)[1]),
        current=figures[0],
        candidate=figures[1],
        held_out=len(data.held_out),
        validation=len(truth),
        min_gain=settings.min_gain,
        max_forgetting=settings.max_forgetting,
        refusals=why,
        trainer=settings.trainer,
    )


def _describe(data: _Data) -> dict[str, Any]:
    both = ExampleRows.concat([data.train, data.held_out])
    return {
        "collected": len(both),
        "training": len(data.train),
        "held_out": len(data.held_out),
        "reasons": dict(Counter(both.reasons)),
        "devices": len(set(both.devices)),
        "edge_models": dict(Counter(both.edge_models)),
        "replay": 0 if data.replay[0] is None else len(data.replay[0]),
    }


def _write_files(
    settings: RefineSettings, report: RefineReport, model: bytes | None, version: int | None
) -> None:
    if settings.out_dir is None:
        return
    out = settings.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if model is not None:
        path = out / f"{settings.model}-{version}-float.onnx"
        atomic_write_bytes(path, model)
        report.files["float_model"] = str(path)
    path = out / "refine-report.json"
    report.files["report"] = str(path)
    atomic_write_bytes(path, (json.dumps(report.to_dict(), indent=2) + "\n").encode())
