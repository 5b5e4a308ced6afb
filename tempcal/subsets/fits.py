"""Every subset's T (folds, groups, groups within folds) beside the global T from shared reads, and ``fit``'s runs.

One pass of :func:`~tempcal.subsets.cells.cell_objective` gives every cell's NLL sums and four derivatives at a few
*slots* of betas; each fit (a union of cells; a group's NLL drawn toward the global T by ``lam (ln T - ln
T_global)^2``, toward fold k's T within fold k) runs its own certified search on them. The global fit's passes
(:meth:`SharedFits.evaluate`) carry the other fits: a fit whose next point no slot *covers* (its Taylor model, moved
to the slot's beta, already certifies) gets a slot of its own in the same read; :meth:`SharedFits.finish` then
reads until every fit is certified (typically no read is needed). Loading this module registers
:func:`fit_subsets_api` as core's :data:`~tempcal.core.fitting.SUBSET_FIT` (``fit_temperature(groups=, folds=)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core import fitting
from ..core.certified import BETA_MAX, BETA_MIN, TOL, CertifiedFit, FitStart, Prior, Search, certify
from ..core.fitting import FitResult, fit_scan, fit_temperature
from ..core.kernels import FIELDS, NllDerivatives
from ..core.scan import Scan
from ..errors import DataError, Info
from .cells import (
    CellLayout,
    SubsetFits,
    Subsets,
    SubsetTemperatures,
    assign_folds,
    cell_calibration,
    cell_objective,
    cell_stats,
    fit_group_results,
    subset_extras,
    subset_keys,
    subset_metrics,
)
from .options import Asked, Plan, check_folds, check_prior, read_groups

if TYPE_CHECKING:
    from ..metrics.calibration import CalibrationMetrics
    from ..sources.base import OpenedSource, RowGroups

#: Passes after the global fit before the fits still open are given up (reported as not converged).
MAX_EXTRA_PASSES = 12
#: A slot covers a fit whose predicted bound is below this share of the tolerance.
COVER_SHARE = 0.25
#: Slots per pass, at most (the rest wait for the next pass).
MAX_SLOTS = 64
#: Subset fits at a bound named in the warnings, at most (the rest are counted).
MAX_WARNINGS = 3


@dataclass
class _Fit:
    """One subset fit: which cells (a family, less one fold), its rows, its points and its answer."""

    group: int | None  # None: the global family (every cell)
    fold: int | None  # the fold left out; None: none
    count: int
    lam: float = 0.0
    points: list[NllDerivatives] = field(default_factory=list)
    fixed: CertifiedFit | None = None  # settled without a search (degenerate data, no rows)
    search: Search | None = None
    fed: int = 0  # points the search has taken
    result: CertifiedFit | None = None
    candidate: float | None = None


class SharedFits:
    """The subset fits of one scan. Call :meth:`evaluate` as the global fit's pass, then :meth:`finish`."""

    def __init__(self, scan: Scan, layout: CellLayout, *, groups: bool, lam: float = 0.0,
                 group_names: list[str] | None = None):
        self.scan, self.layout, self.tol = scan, layout, TOL
        self.group_names = group_names or [str(g) for g in range(layout.groups)]
        span = scan.fit_start.span if scan.fit_start is not None else math.inf
        self.start = FitStart(scan.num_samples, scan.num_classes, span)
        # Every row already in memory (small data): the subset fits' passes are computed, not read.
        self.resident = scan.fit_start.rows if scan.fit_start is not None else None
        self.global_beta: float | None = None
        self.extra_passes = 0
        count, slope, above = (t.view(layout.groups, layout.folds) for t in cell_stats(scan, layout))
        self.fits = [self._fit(group, fold, lam if group is not None else 0.0, count, slope, above)
                     for group, fold in subset_keys(layout, groups)]

    def _fit(self, group: int | None, fold: int | None, lam: float, count: torch.Tensor, slope: torch.Tensor,
             above: torch.Tensor) -> _Fit:
        """A fit (``count``, ``slope`` and ``above``: per cell, ``[groups, folds]``), settled at once when its rows make
        the answer a bound (unpenalised) or leave no data."""
        keep = torch.ones(self.layout.folds, dtype=torch.bool)
        if fold is not None:
            keep[fold] = False
        rows, slope_sum, above_sum = ((t.sum(0) if group is None else t[group])[keep].sum()
                                      for t in (count, slope, above))
        fit = _Fit(group, fold, int(rows), lam)
        if fit.count == 0 or lam > 0:
            return fit  # no rows: the prior's centre (settled in _centre); a prior: always an interior optimum
        if int(above_sum) == 0:
            fit.fixed = CertifiedFit(BETA_MAX, 0, True, 0.0, math.nan, "lower",
                                     [f"{self._name(fit)}: no row has a class above its true class; T is set to "
                                      "the lower bound"])
        elif float(slope_sum) >= 0:
            fit.fixed = CertifiedFit(BETA_MIN, 0, True, 0.0, math.nan, "upper",
                                     [f"{self._name(fit)}: the logits predict no better than uniform; T is set to "
                                      "the upper bound"])
        return fit

    def _name(self, fit: _Fit) -> str:
        where = [] if fit.group is None else [f"group {self.group_names[fit.group]}"]
        where += [] if fit.fold is None else [f"outside fold {fit.fold + 1}"]
        return "the fit on " + (" ".join(where) or "every row")

    # -- the passes ------------------------------------------------------------------------
    def evaluate(self, beta: float) -> NllDerivatives:
        """The global fit's pass at ``beta``, carrying every other fit that needs a point."""
        self.global_beta = beta
        self._update()
        global_slots = self._slots([f for f in self.fits if f.group is None], [beta])
        sums = self._pass([beta, *global_slots], self._group_slots([beta, *global_slots]), read=True)
        return NllDerivatives.from_sums(beta, sums[0].sum(0))

    def finish(self, global_beta: float) -> SubsetTemperatures:
        """Passes until every fit is certified (at most :data:`MAX_EXTRA_PASSES`), then the answers."""
        self.global_beta = global_beta
        for _ in range(MAX_EXTRA_PASSES):
            self._update()
            open_fits = [f for f in self.fits if f.candidate is not None]
            if not open_fits:
                break
            global_slots = self._slots([f for f in open_fits if f.group is None], [])
            self._pass(global_slots, self._group_slots(global_slots))
            self.extra_passes += self.resident is None
        self._update(final=True)
        return self._answer()

    def _pass(self, global_slots: list[float], group_slots: list[list[float]], read: bool = False) -> torch.Tensor:
        """One read at the global slots (every cell at one beta) and the group slots (each group at its own):
        float64 sums ``[slots, cells, FIELDS]``, fed to every fit they are points of. Rows the scan kept are
        evaluated without a read unless ``read`` (the global fit's own pass)."""
        g, k = self.layout.groups, self.layout.folds
        width = max((len(s) for s in group_slots), default=0)
        rows = [torch.full((g * k,), b, dtype=torch.float64) for b in global_slots]
        for j in range(width):
            per_group = [s[min(j, len(s) - 1)] if s else self.global_beta or 1.0 for s in group_slots]
            rows.append(torch.tensor(per_group, dtype=torch.float64).repeat_interleave(k))
        sums = cell_objective(self.scan, torch.stack(rows), self.layout.cells, None if read else self.resident).cpu()
        view = sums.view(len(rows), g, k, len(FIELDS))
        for slot, beta in enumerate(global_slots):
            for fit, row in zip(self.fits, self._all_sums(view[slot]), strict=True):
                fit.points.append(NllDerivatives.from_sums(beta, row))
        for j in range(width):
            for fit, row in zip(self.fits, self._all_sums(view[len(global_slots) + j]), strict=True):
                if fit.group is not None and j < len(group_slots[fit.group]):
                    fit.points.append(NllDerivatives.from_sums(group_slots[fit.group][j], row))
        return sums

    def _all_sums(self, cells: torch.Tensor) -> list[list[float]]:
        """Every fit's sums from one slot's ``[groups, folds, FIELDS]``: its family's total (every cell, or its
        group's) less the cells of the fold it leaves out; one list of FIELDS per fit, in order."""
        group_of = torch.tensor([-1 if f.group is None else f.group for f in self.fits])
        fold_of = torch.tensor([-1 if f.fold is None else f.fold for f in self.fits])
        by_group = cells.sum(1)  # [groups, FIELDS]
        total, by_fold = by_group.sum(0), cells.sum(0)
        family = torch.where((group_of < 0)[:, None], total, by_group[group_of.clamp_min(0)])
        left_global = by_fold[fold_of.clamp_min(0)]
        left_group = cells[group_of.clamp_min(0), fold_of.clamp_min(0)]
        left = torch.where((group_of < 0)[:, None], left_global, left_group)
        return torch.where((fold_of < 0)[:, None], family, family - left).tolist()

    # -- the searches ------------------------------------------------------------------------
    def _update(self, final: bool = False) -> None:
        """Every fit's search from its points, the global family first (the groups' priors centre on them)."""
        for fit in sorted(self.fits, key=lambda f: f.group is not None):
            fit.candidate = None
            if fit.fixed is not None:
                fit.result = fit.fixed
                continue
            prior = self._prior(fit)
            if fit.count == 0:
                fit.result = CertifiedFit(prior.centre if prior else self._centre(fit), 0, True, 0.0, 0.0)
                continue
            if not fit.points:
                fit.result, fit.candidate = None, self._centre(fit)
                continue
            search = self._search(fit, prior)
            done = search.result(max_passes=1 << 30)
            if done is not None and done.converged:
                fit.result = done
                continue
            candidate = search.next_beta()
            if final or search.stuck:
                fit.result = search.result(max_passes=0)
            else:
                fit.result, fit.candidate = None, candidate

    def _search(self, fit: _Fit, prior: Prior | None) -> Search:
        """The fit's search with every point it has, kept from round to round unless its prior moved."""
        if fit.search is None or fit.search.prior != prior:
            fit.search, fit.fed = Search(self.start, self.tol, 1, prior), 0
        for point in fit.points[fit.fed:]:
            fit.search.add(point)
        fit.fed = len(fit.points)
        fit.search.stuck = False
        return fit.search

    def _centre(self, fit: _Fit) -> float:
        """The beta a group's prior draws toward: the global fit's, or fold k's fit for group g in fold k."""
        if fit.group is None or fit.fold is None:
            assert self.global_beta is not None
            return self.global_beta
        fold = next(f for f in self.fits if f.group is None and f.fold == fit.fold)
        if fold.result is not None:
            return fold.result.beta
        return fold.search.estimate() if fold.search is not None else self._centre(replace(fit, fold=None))

    def _prior(self, fit: _Fit) -> Prior | None:
        if fit.group is None or fit.lam <= 0:
            return None
        return Prior(fit.lam / max(fit.count, 1), self._centre(fit))

    def _slots(self, fits: list[_Fit], fixed: list[float]) -> list[float]:
        """New betas so that every open fit among ``fits`` is covered by one of them or by ``fixed``."""
        slots: list[float] = []
        for fit in sorted((f for f in fits if f.candidate is not None), key=lambda f: f.candidate or 0.0):
            assert fit.candidate is not None
            if not any(self._covers(fit, b) for b in [*fixed, *slots]) and len(slots) < MAX_SLOTS:
                slots.append(fit.candidate)
        return slots

    def _group_slots(self, global_slots: list[float]) -> list[list[float]]:
        """Per group, the betas its open fits need beyond ``global_slots`` (the fits bucketed by group once:
        linear in the number of groups)."""
        by_group: list[list[_Fit]] = [[] for _ in range(self.layout.groups)]
        for fit in self.fits:
            if fit.group is not None and fit.candidate is not None:
                by_group[fit.group].append(fit)
        return [self._slots(fits, global_slots) if fits else [] for fits in by_group]

    def _covers(self, fit: _Fit, beta: float) -> bool:
        """Whether a point at ``beta`` would certify ``fit``, as its nearest point's Taylor model predicts."""
        if not fit.points:
            return beta == fit.candidate
        near = min(fit.points, key=lambda p: abs(math.log(p.beta / beta)))
        estimate, error = certify(_moved(near, beta), self.start.span, self.start.num_classes, self._prior(fit))
        return estimate > 0 and error <= COVER_SHARE * self.tol * estimate

    def _answer(self) -> SubsetTemperatures:
        warnings = [w for fit in self.fits if fit.fixed is not None for w in fit.fixed.warnings]
        if len(warnings) > MAX_WARNINGS:  # one per degenerate subset would flood: the first few and a count
            more = len(warnings) - MAX_WARNINGS
            warnings = [*warnings[:MAX_WARNINGS], f"... and {more} more subset fits at a T bound"]
        open_fits = [f for f in self.fits if f.result is not None and not f.result.converged]
        if open_fits:
            warnings.append(f"{len(open_fits)} subset fit(s) not certified after {self.extra_passes} more passes; "
                            f"first: {self._name(open_fits[0])}")
        return SubsetTemperatures.of([(f.group, f.fold, f.result) for f in self.fits], self.layout,  # type: ignore[misc]
                                     warnings)


def _moved(p: NllDerivatives, beta: float) -> NllDerivatives:
    """``p``'s quartic Taylor model moved to ``beta`` (the bound terms kept)."""
    t = beta - p.beta
    d1 = p.d1 + t * (p.d2 + t * (p.d3 / 2 + t * p.d4 / 6))
    d2 = p.d2 + t * (p.d3 + t * p.d4 / 2)
    return NllDerivatives(beta, p.nll, d1, d2, p.d3 + t * p.d4, p.d4, p.q, p.q5)


def fit_with_subsets(scan: Scan, layout: CellLayout, *, groups: bool, lam: float = 0.0, objective: str = "nll",
                     bins: int = 15, group_names: list[str] | None = None) -> SubsetFits:
    """The global fit on every row of ``scan`` and the subset fits ``layout`` asks for, sharing reads; ``passes``
    counts every read of the fit."""
    start = scan.passes
    if objective == "nll":
        shared = SharedFits(scan, layout, groups=groups, lam=lam, group_names=group_names)
        result = fit_scan(scan, evaluate=shared.evaluate)
        subsets = shared.finish(1.0 / result.temperature)
    else:
        from .ece_fits import SharedEce

        ece = SharedEce(scan, layout, groups=groups, lam=lam, bins=bins)
        result = fit_scan(scan, objective="ece", bins=bins, ece_terms=ece.terms)
        subsets = ece.finish(result.temperature)
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
    layout = CellLayout.of(index, max(len(keys), 1), fold_of, k, scan.device)
    fits = fit_with_subsets(scan, layout, groups=groups is not None, lam=lam, objective=objective, bins=bins,
                            group_names=[str(v) for v in keys] or None)
    result = fits.fit
    result.warnings.extend(fits.subsets.warnings)
    if groups is not None:
        result.group_temperatures = dict(zip(keys, fits.group_temperatures, strict=True))
    if folds is not None:
        result.fold_temperatures, result.folds = fits.fold_temperatures, fold_of
    return result


#: Groups named in the line about groups without fitting rows.
FIRST_SHOWN = 5


@dataclass
class SubsetRun:
    """A run's global fit, its ``before`` and ``after`` (out of fold with folds), its subsets, the reads the conformal
    sets took and the overall estimators (with folds; without, ``fit_file`` computes them)."""

    fit: FitResult
    before: CalibrationMetrics
    after: CalibrationMetrics
    subsets: Subsets | None  # None: the one global T
    reads: int = 0
    extras: list[dict] = field(default_factory=list)


def crossfit_run(loaded: OpenedSource, scan: Scan, plan: Plan, asked: Asked, warnings: list[str]) -> SubsetRun:
    """``--folds K`` on ``scan`` (every row of ``loaded``, this process's share): every row fits the deployed T, K
    out-of-fold fits, out-of-fold metrics (and conformal sets, and the estimators over every row and per group)."""
    k = check_folds(plan.folds, scan.num_samples)
    folds = assign_folds(loaded.data.labels.numpy(), k, asked.seed)
    start, stop = loaded.share()
    groups = None if plan.groups is None else torch.from_numpy(plan.groups.index[start:stop])
    count = plan.groups.count if plan.groups is not None else 1
    layout = CellLayout.of(groups, count, folds[start:stop], k, scan.device)
    fits = fit_with_subsets(scan, layout, groups=plan.groups is not None, lam=plan.lam, objective=asked.objective,
                            bins=asked.bins, group_names=None if plan.groups is None else plan.groups.names)
    fold_betas = 1.0 / torch.tensor(fits.fold_temperatures, dtype=torch.float64)
    betas = [torch.ones(count * k, dtype=torch.float64), fold_betas.repeat(count)]
    if plan.groups is not None:
        betas.append(1.0 / torch.tensor(fits.group_fold_temperatures, dtype=torch.float64).reshape(-1))
    report = torch.zeros_like(layout.cells) if groups is None else groups.to(scan.device)
    calibration = cell_calibration(scan, torch.stack(betas), layout.cells, report, count, asked.bins)
    global_t = fits.fit.temperature
    before, after = subset_metrics(calibration, 0, 1.0), subset_metrics(calibration, 1, global_t)
    assert before is not None and after is not None
    fold_sizes = np.bincount(folds, minlength=k).tolist()
    subsets = Subsets({"k": k, "temperatures": fits.fold_temperatures, "sizes": fold_sizes},
                      calibration=calibration, fold_rows=folds)
    if plan.groups is not None:
        sizes = plan.groups.sizes()
        subsets.groups = fit_group_results(plan.groups.names, sizes, sizes, fits, calibration, global_t,
                                           plan.groups.index)
        subsets.group_key, subsets.group_prior, subsets.rows = plan.groups.key, plan.lam, plan.groups.index
    warnings.extend(fits.subsets.warnings)
    reads = 0
    if asked.alphas:
        from ..conformal.commands import fold_sets  # loaded only when sets are asked: the Python API's fit stays light

        before, after, reads = fold_sets(scan, loaded, subsets, asked.alphas, global_t, before, after)
    extras = subset_extras(subsets, asked, warnings)
    return SubsetRun(fits.fit, before, after, subsets, reads, extras)


def grouped_run(loaded: OpenedSource, evaluated: OpenedSource | None, fit_scan: Scan, eval_scan: Scan, plan: Plan,
                fit_index: np.ndarray, eval_index: np.ndarray, asked: Asked, warnings: list[str]) -> SubsetRun:
    """``--group-by``: the group fits on ``fit_scan`` (rows ``fit_index`` of ``loaded``) and their figures on
    ``eval_scan`` (rows ``eval_index`` of ``evaluated``, when given; the indices are global and sorted), with the
    conformal sets and each group's coverage when ``alphas`` are given, and each group's estimators."""
    assert plan.groups is not None
    eval_groups = plan.groups if evaluated is None else read_groups(evaluated, plan.groups.key)
    evaluated = evaluated or loaded
    names, fit_of, eval_of = _joined(plan.groups, eval_groups)
    count = len(names)
    fit_g = torch.from_numpy(fit_of[_share(loaded, fit_index)])
    layout = CellLayout(fit_g.to(fit_scan.device), count, 1)
    fits = fit_with_subsets(fit_scan, layout, groups=True, lam=plan.lam, objective=asked.objective, bins=asked.bins,
                            group_names=names)
    eval_g = torch.from_numpy(eval_of[_share(evaluated, eval_index)]).to(eval_scan.device)
    global_t = fits.fit.temperature
    f64 = torch.float64
    betas = torch.stack([torch.ones(count, dtype=f64), torch.full((count,), 1.0 / global_t, dtype=f64),
                         1.0 / torch.tensor(fits.group_temperatures, dtype=f64)])
    calibration = cell_calibration(eval_scan, betas, eval_g, eval_g, count, asked.bins)
    before, after = subset_metrics(calibration, 0, 1.0), subset_metrics(calibration, 1, global_t)
    assert before is not None and after is not None
    rows = eval_of[eval_index]
    results = fit_group_results(names, cell_stats(fit_scan, layout)[0].tolist(), calibration.counts.tolist(), fits,
                                calibration, global_t, rows)
    empty = [g.group for g in results if g.n_fit == 0]
    if empty:  # one line however many groups (thousands, with many small groups)
        shown = ", ".join(empty[:FIRST_SHOWN]) + (", ..." if len(empty) > FIRST_SHOWN else "")
        warnings.append(Info(f"{len(empty)} group(s) have no fitting rows ({shown}); their rows are evaluated at "
                             "the global T"))
    warnings.extend(fits.subsets.warnings)
    subsets = Subsets(groups=results, group_key=plan.groups.key, group_prior=plan.lam, calibration=calibration,
                      rows=rows)
    reads = 0
    if asked.alphas:
        from ..conformal.commands import GROUP_SET_READS, fit_group_sets

        before, after = fit_group_sets(fit_scan, eval_scan, evaluated, eval_index, subsets, asked.alphas, global_t,
                                       before, after)
        reads = GROUP_SET_READS
    subset_extras(subsets, asked, warnings, overall=False)
    return SubsetRun(fits.fit, before, after, subsets, reads)


def _share(opened: OpenedSource, rows: np.ndarray) -> np.ndarray:
    """The global row indices among ``rows`` that fall in this process's share, in order (still global)."""
    start, stop = opened.share()
    return rows[(rows >= start) & (rows < stop)]


def _joined(fit: RowGroups, other: RowGroups) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The names of both sets of groups (sorted as groups are: integers numerically, then tasks by text) and each
    set's rows re-indexed into them."""
    if other is fit:
        return fit.names, fit.index, fit.index
    names = sorted(set(fit.names) | set(other.names), key=_group_order)
    position = {name: i for i, name in enumerate(names)}
    return (names, np.array([position[n] for n in fit.names], dtype=np.int64)[fit.index],
            np.array([position[n] for n in other.names], dtype=np.int64)[other.index])


def _group_order(name: str) -> tuple[int, int, str]:
    try:
        return 0, int(name), ""
    except ValueError:
        return 1, 0, name


if fit_subsets_api not in fitting.SUBSET_FIT:
    fitting.SUBSET_FIT.append(fit_subsets_api)

__all__ = ["MAX_EXTRA_PASSES", "SharedFits", "SubsetRun", "crossfit_run", "fit_subsets_api", "fit_temperature",
           "fit_with_subsets", "grouped_run"]
