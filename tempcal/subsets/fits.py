"""The global T and every subset T (folds, groups, groups within folds) from shared reads of one scan, and the
seeded, class-stratified folds they are fitted on (:func:`assign_folds`; K = N: leave-one-out).

:func:`fit_with_subsets` runs the global fit as :func:`~tempcal.core.scan_fit.fit_scan` does (the
same T as a fit on every row), its passes carrying the subset fits (:mod:`tempcal.subsets.nll_fits`), then
finishes those. ``passes`` of the global result counts every read, the validating scan included.

Loading this module registers :func:`fit_subsets_api` as core's :data:`~tempcal.core.fitting.SUBSET_FIT`, so
``fit_temperature(groups=..., folds=...)`` reaches it; ``tempcal.fit_temperature`` is read from here for that.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from ..core import fitting
from ..core.certified import TOL
from ..core.fitting import fit_temperature
from ..core.scan import Scan
from ..core.scan_fit import FitResult, fit_scan
from ..errors import DataError
from .nll_fits import CellLayout, SharedFits, SubsetFits
from .options import check_folds, check_prior


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


def cell_index(groups: torch.Tensor | None, folds: torch.Tensor | None, num_folds: int,
               device: torch.device) -> torch.Tensor:
    """Each row's cell ``group * folds + fold`` (int64 on ``device``) from per-row group and fold indices."""
    if groups is None and folds is None:
        raise ValueError("cells need groups or folds")
    base = groups if groups is not None else folds
    assert base is not None
    g = torch.zeros_like(base) if groups is None else groups.to(torch.int64)
    k = torch.zeros_like(g) if folds is None else folds.to(torch.int64)
    return (g * num_folds + k).to(device)


def fit_with_subsets(scan: Scan, layout: CellLayout, *, groups: bool, lam: float = 0.0, objective: str = "nll",
                     bins: int = 15, group_names: list[str] | None = None, tol: float = TOL) -> SubsetFits:
    """The global fit on every row of ``scan`` and the subset fits ``layout`` asks for, sharing reads."""
    if objective != "nll":
        from .ece_fits import fit_ece_with_subsets

        return fit_ece_with_subsets(scan, layout, groups=groups, lam=lam, bins=bins, group_names=group_names)
    start = scan.passes
    shared = SharedFits(scan, layout, groups=groups, lam=lam, tol=tol, group_names=group_names)
    result = fit_scan(scan, evaluate=shared.evaluate)
    subsets = shared.finish(1.0 / result.temperature)
    result.passes = scan.passes - start + 1
    return SubsetFits(result, subsets)


def fit_subsets_api(scan: Scan, groups: Any, kept: torch.Tensor | None, *, group_prior: float | None,
                    folds: int | None, seed: int, objective: str, bins: int) -> FitResult:
    """``fit_temperature(groups=..., folds=...)``: the global fit with its group and fold fits, as one FitResult."""
    lam = check_prior(group_prior)
    index, keys = None, []
    if groups is not None:
        values = np.asarray(groups.cpu() if isinstance(groups, torch.Tensor) else groups).reshape(-1)
        given = values.shape[0]
        if kept is not None:  # rows left out by ignore_index: their groups go too
            values = values[kept.numpy()] if kept.numel() and given > int(kept.max()) else values[:0]
        if values.shape[0] != scan.num_samples:
            raise DataError(f"groups holds {given} values, not one per row of the logits (labels included)")
        distinct, inverse = np.unique(values, return_inverse=True)
        keys = [v.item() if hasattr(v, "item") else v for v in distinct]
        index = torch.from_numpy(inverse.reshape(-1).astype(np.int64))
    k = 1 if folds is None else int(folds)
    fold_of = None if folds is None else assign_folds(scan.data.labels.numpy(), k, seed)
    layout = CellLayout(cell_index(index, None if fold_of is None else torch.from_numpy(fold_of), k, scan.device),
                        max(len(keys), 1), k)
    fits = fit_with_subsets(scan, layout, groups=groups is not None, lam=lam, objective=objective, bins=bins,
                            group_names=[str(v) for v in keys] or None)
    result = fits.fit
    result.warnings.extend(fits.subsets.warnings)
    if groups is not None:
        result.group_temperatures = dict(zip(keys, fits.group_temperatures, strict=True))
    if folds is not None:
        result.fold_temperatures, result.folds = fits.fold_temperatures, fold_of
    return result


if fit_subsets_api not in fitting.SUBSET_FIT:
    fitting.SUBSET_FIT.append(fit_subsets_api)

__all__ = ["SubsetFits", "assign_folds", "cell_index", "fit_subsets_api", "fit_temperature", "fit_with_subsets",
           "fold_sizes"]
