"""Fitting a learned router: L2-regularized logistic regression in numpy, L2 by cross-validation.

Pure arithmetic on feature rows and 0/1 targets; ``_learned`` builds the rows.

``choose_l2`` picks the penalty from ``L2_GRID`` by five-fold cross-validation
inside the rows it is given (the held-out log-likelihood, which is smoother
than the share of errors caught at one budget on a few dozen positives):
the recipe is the same on every dataset and never looks at a test split.

Invariants: features are standardized on the rows being fitted (a constant
column gets scale 1); the bias is not penalized; the folds are a fixed
function of the row count, so a fit is deterministic; a fold whose training
part holds one class only is skipped, and with no usable fold the middle of
the grid is used.
"""

from __future__ import annotations

import numpy as np

__all__ = ["L2_GRID", "Standardized", "choose_l2", "fit_logistic", "standardize"]

L2_GRID = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
_FALLBACK_L2 = 10.0
_FOLDS = 5
_ITERATIONS = 25

Standardized = tuple[np.ndarray, np.ndarray]  # mean, scale per feature


def standardize(x: np.ndarray) -> Standardized:
    mean, scale = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(scale > 0, scale, 1.0)


def fit_logistic(
    x: np.ndarray, y: np.ndarray, l2: float, *, iterations: int = _ITERATIONS
) -> tuple[np.ndarray, float, Standardized]:
    """Weights and bias on standardized ``x``, and the standardization used."""
    mean, scale = standardize(x)
    weights, bias = _newton((x - mean) / scale, y, l2, iterations)
    return weights, bias, (mean, scale)


def choose_l2(x: np.ndarray, y: np.ndarray, grid: tuple[float, ...] = L2_GRID) -> float:
    """The penalty of ``grid`` with the best five-fold held-out log-likelihood."""
    n = len(y)
    fold = np.random.default_rng(n).permutation(n) % _FOLDS
    totals = np.zeros(len(grid))
    used = 0
    for k in range(_FOLDS):
        train, held = fold != k, fold == k
        x_train, y_train = x[train], y[train]
        if y_train.min() == y_train.max() or not held.any():
            continue
        used += 1
        mean, scale = standardize(x_train)  # once per fold: the grid shares it
        z_train, z_held = (x_train - mean) / scale, (x[held] - mean) / scale
        for i, l2 in enumerate(grid):
            weights, bias = _newton(z_train, y_train, l2, _ITERATIONS)
            totals[i] += _log_likelihood(z_held @ weights + bias, y[held])
    if used == 0:
        return _FALLBACK_L2
    return float(grid[int(np.argmax(totals))])


def _log_likelihood(z: np.ndarray, y: np.ndarray) -> float:
    # log(sigmoid(z)) = -log1p(exp(-z)), written to stay finite for large |z|
    return float(-(y * np.logaddexp(0.0, -z) + (1.0 - y) * np.logaddexp(0.0, z)).sum())


def _newton(z: np.ndarray, y: np.ndarray, l2: float, iterations: int) -> tuple[np.ndarray, float]:
    """L2-regularized logistic regression (the bias unpenalized) by Newton's method."""
    n, f = z.shape
    design = np.concatenate([z, np.ones((n, 1))], axis=1)
    penalty = np.full(f + 1, l2)
    penalty[-1] = 0.0
    w = np.zeros(f + 1)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -50.0, 50.0)))
        gradient = design.T @ (p - y) + penalty * w
        hessian = (design * (p * (1.0 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return w[:-1], float(w[-1])
