"""Seeded, class-stratified split of sample indices into a fitting part and an evaluation part."""

from __future__ import annotations

import numpy as np

from ..errors import TempcalError, param


def stratified_split(labels, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices (sorted) of the fitting part and the evaluation part.

    Each class gives ``val_fraction`` of its samples to the fitting part, rounded so the
    total is ``round(val_fraction * N)`` (largest remainders win). ``val_fraction == 1``
    fits and evaluates on every sample. Classes with a single sample are allowed, unlike
    scikit-learn's stratified splitters, which refuse them.
    """
    if not 0 < val_fraction <= 1:
        raise TempcalError(f"{param('val_fraction')} must be in (0, 1], got {val_fraction}")
    labels = np.asarray(labels)
    n = labels.shape[0]
    everything = np.arange(n)
    if val_fraction == 1:
        return everything, everything
    rng = np.random.default_rng(seed)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    target = min(max(round(val_fraction * n), 1), n - 1) if n >= 2 else n
    share = counts * val_fraction
    take = np.floor(share).astype(np.int64)
    remainder = share - take
    # Hand out the rounding remainder to the classes with the largest fractional parts (ties by class order).
    order = np.lexsort((np.arange(len(classes)), -remainder))
    take[order[:target - int(take.sum())]] += 1  # >= 0: the floors sum to at most target
    order_in_class = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    fit = [rng.permutation(order_in_class[bounds[c]:bounds[c + 1]])[: take[c]] for c in range(len(classes))]
    fit_index = np.sort(np.concatenate(fit)) if fit else np.empty(0, dtype=np.int64)
    return fit_index, np.delete(everything, fit_index)
