"""The global T and every subset T (folds, groups, groups within folds) from shared reads of one scan.

:func:`fit_with_subsets` runs the global fit as :func:`~tempcal.core.fitting.fit_temperature` does (the
same T as a fit on every row), its passes carrying the subset fits (:mod:`tempcal.core.shared_fits`), then
finishes those. ``passes`` of the global result counts every read, the validating scan included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .certified import TOL
from .fitting import FitResult, fit_temperature
from .scan import Scan
from .shared_fits import CellLayout, SharedFits, SubsetTemperatures


@dataclass(frozen=True)
class SubsetFits:
    """The global fit, and the subset temperatures fitted beside it."""

    fit: FitResult
    subsets: SubsetTemperatures

    @property
    def fold_temperatures(self) -> list[float]:
        return [1.0 / r.beta for r in self.subsets.folds or []]

    @property
    def group_temperatures(self) -> list[float]:
        return [1.0 / r.beta for r in self.subsets.groups or []]

    @property
    def group_fold_temperatures(self) -> list[list[float]]:
        return [[1.0 / r.beta for r in row] for row in self.subsets.group_folds or []]


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
        from .ece_subsets import fit_ece_with_subsets

        return fit_ece_with_subsets(scan, layout, groups=groups, lam=lam, bins=bins, group_names=group_names)
    start = scan.passes
    shared = SharedFits(scan, layout, groups=groups, lam=lam, tol=tol, group_names=group_names)
    result = fit_temperature(scan, evaluate=shared.evaluate)
    subsets = shared.finish(1.0 / result.temperature)
    result.passes = scan.passes - start + 1
    return SubsetFits(result, subsets)


__all__ = ["SubsetFits", "cell_index", "fit_with_subsets"]
