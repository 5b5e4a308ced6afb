"""Seeded, class-stratified assignment of rows to K folds (cross-fitting), and leave-one-out."""

from __future__ import annotations

import itertools

import numpy as np

from .options import check_folds


def assign_folds(labels, k: int, seed: int = 0) -> np.ndarray:
    """The fold (0..k-1, int64) of every row of ``labels``.

    Each class's rows are shuffled with ``seed`` and dealt in turn, the classes one after another, so
    every fold holds about ``1/k`` of each class and fold sizes differ by at most one. With ``k`` equal to
    the number of rows, row i is fold i (leave-one-out).
    """
    labels = np.asarray(labels)
    n = int(labels.shape[0])
    k = check_folds(k, n)
    if k == n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    order = np.argsort(labels, kind="stable")
    _, starts = np.unique(labels[order], return_index=True)
    bounds = [*starts.tolist(), n]
    dealt = np.concatenate([rng.permutation(order[a:b]) for a, b in itertools.pairwise(bounds)])
    folds = np.empty(n, dtype=np.int64)
    folds[dealt] = np.arange(n, dtype=np.int64) % k
    return folds


def fold_sizes(folds: np.ndarray, k: int) -> list[int]:
    """Rows per fold."""
    return np.bincount(folds, minlength=k).astype(np.int64).tolist()


__all__ = ["assign_folds", "fold_sizes"]
